"""SqliteStore: schema, content-addressed snapshots, round trips and clear errors."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from lamina import Conversation, load_conversation, rebuild_envelope
from lamina._cli import main
from lamina.pipeline._store.records import SCHEMA_VERSION
from lamina.pipeline.errors import (
    ConversationError,
    StoreCorrupt,
    StoreError,
    StoreLocked,
    StoreSchemaTooNew,
    UnknownConversation,
)
from lamina.pipeline.store import ConversationInfo, Manifest, SqliteStore, Store, save_turn
from lamina.pipeline.views import SummaryResult
from tests.stores import Backend


def _chat(vault: Path, store: Store, cid: str = "c1", turns: int = 3) -> Conversation:
    store.create(ConversationInfo(cid, "2026-01-01T00:00:00Z"))
    conv = Conversation("Be terse.", vault=vault)
    for i in range(1, turns + 1):
        attach = [{"note": "project-spec.md"}, {"selection": f"picked {i}", "source": "a.md"}]
        env = conv.turn(f"question {i}", attach)
        conv.reply(f"answer {i}")
        save_turn(store, cid, conv, env, attach)
    return conv


def test_new_file_gets_current_schema_and_wal(tmp_path: Path) -> None:
    SqliteStore(tmp_path / "s.db").close()
    db = sqlite3.connect(tmp_path / "s.db")
    assert db.execute("SELECT version FROM lamina_schema").fetchone() == (SCHEMA_VERSION,)
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_empty_version_zero_file_is_migrated(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "s.db")
    db.executescript(
        "CREATE TABLE lamina_schema (version INTEGER NOT NULL);"
        "INSERT INTO lamina_schema VALUES (0);"
    )
    db.close()
    with SqliteStore(tmp_path / "s.db") as store:
        assert store.conversations() == ()
    assert sqlite3.connect(tmp_path / "s.db").execute(
        "SELECT version FROM lamina_schema"
    ).fetchone() == (SCHEMA_VERSION,)


def test_state_round_trips_exactly(backend: Backend, vault: Path) -> None:
    with backend.open() as store:
        conv = _chat(vault, store)
        assert store.load("c1") == conv.state


def test_earlier_turn_loads_its_own_state(backend: Backend, vault: Path) -> None:
    with backend.open() as store:
        _chat(vault, store, turns=3)
        state = store.load("c1", turn=2)
        assert [h.user for h in state.history] == ["question 1", "question 2"]
        assert len(state.library) == len(store.load("c1").library) - 1


def test_unchanged_library_entry_is_stored_once(backend: Backend, vault: Path) -> None:
    with backend.open() as store:
        _chat(vault, store, turns=4)
    rows = backend.rows("SELECT COUNT(*) FROM entries WHERE part = 'library' AND position = 0")
    assert rows == [(1,)]


def test_manifest_keeps_segments_and_hashes_without_text(tmp_path: Path, vault: Path) -> None:
    with SqliteStore(tmp_path / "s.db") as store:
        store.create(ConversationInfo("c1"))
        conv = Conversation("Be terse.", vault=vault)
        env = conv.turn("hi", [{"note": "project-spec.md"}])
        save_turn(store, "c1", conv, env, [{"note": "project-spec.md"}])
        assert store.manifest("c1", 1) == Manifest.of(env)
        assert store.manifest("c1", 1).prefix_hash == env.prefix_hash  # type: ignore[union-attr]
    body = (tmp_path / "s.db").read_bytes()
    assert b"sync service keeps notebooks" not in body  # texts are compressed snapshots only


def test_saving_the_reply_replaces_the_turn_and_keeps_its_time(
    backend: Backend, vault: Path
) -> None:
    with backend.open() as store:
        store.create(ConversationInfo("c1"))
        conv = Conversation("", vault=vault)
        env = conv.turn("hi")
        save_turn(store, "c1", conv, env, created="T1")
        conv.reply("hello")
        save_turn(store, "c1", conv, env, created="T2", reply_created="T3")
        (record,) = store.turns("c1")
        assert (record.reply, record.created, record.reply_created) == ("hello", "T1", "T3")
        assert store.load("c1").history[-1].assistant == "hello"


def test_skipping_a_turn_is_refused(backend: Backend, vault: Path) -> None:
    with backend.open() as store:
        conv = _chat(vault, store, turns=1)
        conv.turn("two")
        conv.turn("three")
        with pytest.raises(ConversationError, match="cannot save turn 3 after turn 1"):
            save_turn(store, "c1", conv)


def test_loaded_conversation_continues_like_the_original(backend: Backend, vault: Path) -> None:
    with backend.open() as store:
        conv = _chat(vault, store)
        again = load_conversation(store, "c1", vault=vault)
    a = conv.turn("next", [{"note": "docs/auth.md"}])
    b = again.turn("next", [{"note": "docs/auth.md"}])
    assert a == b


def test_unknown_conversation_is_named(backend: Backend) -> None:
    with (
        backend.open() as store,
        pytest.raises(UnknownConversation, match="'nope'"),
    ):
        store.load("nope")


def test_duplicate_and_malformed_ids_are_refused(backend: Backend) -> None:
    with backend.open() as store:
        store.create(ConversationInfo("c1"))
        with pytest.raises(StoreError, match="already exists"):
            store.create(ConversationInfo("c1"))
        with pytest.raises(StoreError, match="must be 1-200"):
            store.create(ConversationInfo("has space"))


def test_garbage_file_is_corrupt_and_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.db"
    path.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StoreCorrupt, match=str(path)):
        SqliteStore(path)


def test_foreign_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    sqlite3.connect(path).execute("CREATE TABLE users (id INTEGER)")
    with pytest.raises(StoreCorrupt, match="not a Lamina store"):
        SqliteStore(path)


def test_damaged_snapshot_fails_its_hash_check(backend: Backend, vault: Path) -> None:
    import zlib

    with backend.open() as store:
        _chat(vault, store, turns=1)
    backend.execute(
        "UPDATE snapshots SET body = ? WHERE kind = 'history'", (zlib.compress(b'{"x":1}'),)
    )
    with (
        backend.open() as store,
        pytest.raises(StoreCorrupt, match="does not match"),
    ):
        store.load("c1")


def test_newer_schema_is_refused_with_versions(backend: Backend) -> None:
    backend.open().close()
    backend.execute("UPDATE lamina_schema SET version = 99")
    with pytest.raises(StoreSchemaTooNew) as info:
        backend.open()
    assert (info.value.found, info.value.supported) == (99, SCHEMA_VERSION)
    assert backend.label in str(info.value)


def test_held_write_lock_gives_store_locked(tmp_path: Path) -> None:
    SqliteStore(tmp_path / "s.db").close()
    holder = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreLocked, match="another process holds the lock"):
            SqliteStore(tmp_path / "s.db", timeout=0.1)
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_new_store_opens_while_another_process_holds_its_write_lock(tmp_path: Path) -> None:
    """A second process opening the same new store (as parallel workers do) finds the file
    write-locked while the first switches it to WAL or migrates it. SQLite answers that
    switch busy at once, without its busy handler; the store waits for the lock as every
    other statement does, then opens."""
    path = tmp_path / "s.db"
    with subprocess.Popen(
        [sys.executable, "-c",
         "import sqlite3, time\n"
         f"db = sqlite3.connect({str(path)!r}, isolation_level=None)\n"
         "db.execute('BEGIN IMMEDIATE')\n"
         "print('held', flush=True)\n"
         "time.sleep(0.5)\n"
         "db.execute('ROLLBACK')\n"],
        stdout=subprocess.PIPE, text=True,
    ) as holder:  # fmt: skip
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            with SqliteStore(path, timeout=30) as store:
                store.create(ConversationInfo("c"))
                assert [info.id for info in store.conversations()] == ["c"]
        finally:
            assert holder.wait(timeout=30) == 0


def test_summary_memo_keeps_the_first_write(backend: Backend) -> None:
    with backend.open() as store:
        assert store.get_summary("h", 100, "textrank") is None
        store.put_summary("h", 100, "textrank", SummaryResult("first", ("one failure",)))
        store.put_summary("h", 100, "textrank", SummaryResult("second"))
        assert store.get_summary("h", 100, "textrank") == SummaryResult("first", ("one failure",))


def test_token_memo_round_trips(backend: Backend) -> None:
    with backend.open() as store:
        store.put_tokens("abc", "o200k_base", 42)
        assert store.get_tokens("abc", "o200k_base") == 42
        assert store.get_tokens("abc", "cl100k_base") is None


def test_cli_reports_corrupt_store_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.db"
    path.write_bytes(b"\x00garbage" * 300)
    assert main(["export", str(path), "--conversation", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "bad.db" in err and "not a SQLite database" in err


def test_last_turn_is_rebuilt_identically_or_not_at_all(backend: Backend, vault: Path) -> None:
    with backend.open() as store:
        store.create(ConversationInfo("c1"))
        conv = Conversation("Be terse.", vault=vault)
        envelopes = []
        for i, note in enumerate(["project-spec.md", "docs/auth.md"], start=1):
            envelopes.append(conv.turn(f"q{i}", [{"note": note}]))
            save_turn(store, "c1", conv, envelopes[-1], [{"note": note}])
        assert rebuild_envelope(store, "c1", vault=vault) == envelopes[1]
        assert rebuild_envelope(store, "c1", 1, vault=vault) == envelopes[0]
        (vault / "docs" / "auth.md").write_text("# Auth\n\nRewritten.\n", encoding="utf-8")
        assert rebuild_envelope(store, "c1", vault=vault) is None
