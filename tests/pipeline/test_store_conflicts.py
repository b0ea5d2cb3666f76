"""Conflict-safe saves, one-transaction writes, and a store that leaves foreign files alone."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from lamina import Conversation, load_conversation
from lamina.pipeline import LaminaError
from lamina.pipeline.errors import (
    ConflictError,
    ConversationError,
    StoreCorrupt,
    StoreError,
    StoreForeignTable,
)
from lamina.pipeline.store import ConversationInfo, Head, SqliteStore, Store, save_turn
from tests.stores import Backend


def _started(store: Store, vault: Path, turns: int = 2) -> Conversation:
    store.create(ConversationInfo("c"))
    conv = Conversation("Be terse.", vault=vault)
    for i in range(1, turns + 1):
        env = conv.turn(f"q{i}", [{"note": "project-spec.md"}])
        conv.reply(f"a{i}")
        save_turn(store, "c", conv, env, [{"note": "project-spec.md"}])
    return conv


def test_head_is_empty_before_any_turn_and_follows_saves(backend: Backend, vault: Path) -> None:
    with backend.open() as store:
        store.create(ConversationInfo("c"))
        assert store.head("c") == Head(0, "")
        conv = Conversation("Be terse.", vault=vault)
        conv.turn("q1")
        save_turn(store, "c", conv)
        first = store.head("c")
        assert first.turn == 1 and len(first.hash) == 32 and first == conv.saved_head
        conv.reply("a1")
        save_turn(store, "c", conv)  # the same turn again, from the head it saved
        assert store.head("c").turn == 1 and store.head("c") != first


def test_loaded_state_and_head_agree(backend: Backend, vault: Path) -> None:
    with backend.open() as store:
        conv = _started(store, vault)
        state, head = store.load_head("c")
        assert state == conv.state and head == store.head("c") == conv.saved_head
        assert load_conversation(store, "c", vault=vault).saved_head == head


def test_a_second_writer_at_the_same_head_gets_a_conflict_and_writes_nothing(
    backend: Backend, vault: Path
) -> None:
    with backend.open() as store:
        _started(store, vault)
        a = load_conversation(store, "c", vault=vault)
        b = load_conversation(store, "c", vault=vault)
        a.turn("from a")
        save_turn(store, "c", a)
        winner = store.head("c")
        before = backend.dump(), store.turns("c")
        b.turn("from b")
        with pytest.raises(ConflictError) as caught:
            save_turn(store, "c", b)
        assert (caught.value.head_turn, caught.value.head_hash) == (winner.turn, winner.hash)
        assert (caught.value.expected_turn, caught.value.conversation_id) == (2, "c")
        assert isinstance(caught.value, LaminaError)
        assert store.turns("c") == before[1] and store.head("c") == winner
        assert backend.dump() == before[0]
        assert [h.user for h in store.load("c").history] == ["q1", "q2", "from a"]


def test_the_loser_cannot_replace_the_winners_turn_by_saving_it_again(
    backend: Backend, vault: Path
) -> None:
    """Both continue turn 2; the loser's 'same turn again' is not from the winner's save."""
    with backend.open() as store:
        _started(store, vault)
        a = load_conversation(store, "c", vault=vault)
        b = load_conversation(store, "c", vault=vault)
        a.turn("from a")
        save_turn(store, "c", a)
        b.turn("from b")
        with pytest.raises(ConflictError):
            save_turn(store, "c", b, parent=Head(3, "0" * 32))
        with pytest.raises(ConflictError):
            save_turn(store, "c", b)
        a.reply("reply a")
        save_turn(store, "c", a)  # the winner adds its reply: allowed, from its own save
        assert store.load("c").history[-1].assistant == "reply a"


def test_after_a_conflict_a_reload_continues(backend: Backend, vault: Path) -> None:
    with backend.open() as store:
        _started(store, vault)
        a = load_conversation(store, "c", vault=vault)
        b = load_conversation(store, "c", vault=vault)
        a.turn("from a")
        save_turn(store, "c", a)
        b.turn("from b")
        with pytest.raises(ConflictError):
            save_turn(store, "c", b)
        b = load_conversation(store, "c", vault=vault)
        b.turn("from b")
        save_turn(store, "c", b)
        assert [h.user for h in store.load("c").history][-2:] == ["from a", "from b"]


def test_a_new_conversation_object_cannot_overwrite_saved_turns(
    backend: Backend, vault: Path
) -> None:
    with backend.open() as store:
        _started(store, vault, turns=1)
        fresh = Conversation("Be terse.", vault=vault)
        fresh.turn("another first turn")
        with pytest.raises(ConflictError):
            save_turn(store, "c", fresh)
        assert [r.user for r in store.turns("c")] == ["q1"]


def test_skipping_a_turn_is_still_refused(backend: Backend, vault: Path) -> None:
    with backend.open() as store:
        conv = _started(store, vault, turns=1)
        conv.turn("two")
        conv.turn("three")
        with pytest.raises(ConversationError, match="cannot save turn 3 after turn 1"):
            save_turn(store, "c", conv)


def test_transaction_is_all_or_nothing(backend: Backend, vault: Path) -> None:
    with backend.open() as store:
        conv = Conversation("Be terse.", vault=vault)
        conv.turn("q1")
        with pytest.raises(RuntimeError), store.transaction():
            store.create(ConversationInfo("c"))
            save_turn(store, "c", conv)
            raise RuntimeError("midway")
        assert store.conversations() == ()
        with store.transaction():  # usable afterwards, and an inner error rolls back its part
            store.create(ConversationInfo("c"))
            with pytest.raises(StoreError, match="already exists"):
                store.create(ConversationInfo("c"))
        assert [c.id for c in store.conversations()] == ["c"]


def test_foreign_sqlite_file_is_refused_and_left_byte_identical(tmp_path: Path) -> None:
    path = tmp_path / "other-app.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE contacts (name TEXT)")
    db.execute("INSERT INTO contacts VALUES ('Ada')")
    db.commit()
    db.close()
    before = path.read_bytes()
    with pytest.raises(StoreCorrupt, match="not a Lamina store"):
        SqliteStore(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other-app.db"]


def test_a_file_that_is_not_sqlite_is_refused_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"just some text, not a database\n" * 100)
    with pytest.raises(StoreCorrupt):
        SqliteStore(path)
    assert path.read_bytes() == b"just some text, not a database\n" * 100


def test_store_works_from_other_threads(backend: Backend, vault: Path) -> None:
    results: list[object] = []
    with backend.open() as store:
        _started(store, vault, turns=1)

        def use(n: int) -> None:
            try:
                store.create(ConversationInfo(f"t{n}"))
                results.append((store.head("c").turn, len(store.turns("c"))))
            except Exception as exc:  # the assertion below names it
                results.append(exc)

        threads = [threading.Thread(target=use, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [(1, 1)] * 8
        assert len(store.conversations()) == 9


def test_texts_that_are_not_utf8_round_trip(backend: Backend, vault: Path) -> None:
    """A file name that is not UTF-8 arrives as surrogate escapes; the store keeps them."""
    name = b"caf\xe9.md".decode("utf-8", "surrogateescape")
    (vault / name).write_text("# Cafe\n\nhello\n", encoding="utf-8")
    with backend.open() as store:
        store.create(ConversationInfo("c", vault=str(vault / name)))
        conv = Conversation("", vault=vault)
        env = conv.turn(f"about {name}", [{"note": name}])
        save_turn(store, "c", conv, env, [{"note": name}])
        (record,) = store.turns("c")
        assert record.user == f"about {name}" and record.attachments[0].label == name
        assert store.conversation("c").vault == str(vault / name)
        assert store.find_attachment("note", name) == record.attachments[0]
        assert store.load("c") == conv.state


def test_head_is_one_row_read_and_agrees_with_the_computed_head(
    backend: Backend, vault: Path
) -> None:
    """head() reads the hash each save recorded; rows from before schema version 2 (no
    recorded hash) fall back to computing it, with the same answer."""
    with backend.open() as store:
        conv = _started(store, vault, turns=3)
        recorded = store.head("c")
        assert recorded == conv.saved_head == store.load_head("c")[1]
    backend.execute("UPDATE turns SET head_hash = ''")
    with backend.open() as store:
        assert store.head("c") == recorded


def test_a_lamina_file_holding_a_foreign_table_is_refused_byte_identical(tmp_path: Path) -> None:
    """``lamina_schema`` at version 1 beside another application's ``turns``: the store is
    refused naming that table before the version 2 migration could alter it."""
    path = tmp_path / "mixed.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE lamina_schema (version INTEGER NOT NULL)")
    db.execute("INSERT INTO lamina_schema VALUES (1)")
    db.execute("CREATE TABLE turns (id INTEGER PRIMARY KEY, body TEXT)")
    db.commit()
    db.close()
    before = path.read_bytes()
    with pytest.raises(StoreForeignTable, match="table 'turns' is not Lamina's") as info:
        SqliteStore(path)
    assert info.value.table == "turns"
    assert path.read_bytes() == before


def test_a_read_only_store_reads_and_never_writes(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with SqliteStore(path) as store:
        store.create(ConversationInfo("c"))
    before = path.read_bytes()
    with SqliteStore(path, read_only=True) as store:
        assert [c.id for c in store.conversations()] == ["c"]
        with pytest.raises(StoreError, match="opened read-only"):
            store.create(ConversationInfo("d"))
    assert path.read_bytes() == before
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    with pytest.raises(StoreCorrupt, match="it has no tables"):
        SqliteStore(empty, read_only=True)
    with pytest.raises(StoreError, match="cannot open"):
        SqliteStore(tmp_path / "missing.db", read_only=True)
    assert not (tmp_path / "missing.db").exists()


def test_a_read_only_open_leaves_no_side_files_and_never_takes_a_writers(tmp_path: Path) -> None:
    """SQLite makes -wal and -shm for a read-only reader of a WAL file; closing removes
    them as SQLite would, but only as the file's last connection: a writer that opened
    meanwhile keeps its own and goes on."""
    path = tmp_path / "s.db"
    with SqliteStore(path) as store:
        store.create(ConversationInfo("c"))
    before = path.read_bytes()
    with SqliteStore(path, read_only=True) as store:
        assert [c.id for c in store.conversations()] == ["c"]
        assert (tmp_path / "s.db-wal").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.db"]
    assert path.read_bytes() == before
    reader = SqliteStore(path, read_only=True)
    reader.conversations()
    with SqliteStore(path) as writer:
        writer.create(ConversationInfo("d"))
        reader.close()
        assert (tmp_path / "s.db-wal").stat().st_size > 0  # the writer's, kept
        writer.create(ConversationInfo("e"))
    with SqliteStore(path, read_only=True) as store:
        assert [c.id for c in store.conversations()] == ["c", "d", "e"]
