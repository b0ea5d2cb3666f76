"""`lamina replay` over a hostile corpus folder: a file too large to read is that
conversation's error (never read whole), and a SQLite file is opened read-only and used
only if it is a Lamina store; the rest of the run completes."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from benchmarks.replay_corpus import write_configs, write_replay_corpus
from lamina import replay
from lamina.pipeline.store import SqliteStore
from tests.hostile.corpus import lamina_limited

GIB = 1 << 30


def _corpus(tmp_path: Path) -> tuple[Path, str]:
    chats = write_replay_corpus(tmp_path, 2, seed=5)
    return chats, str(write_configs(tmp_path / "configs")[0])


def _rows(out: Path) -> dict[str, dict[str, object]]:
    return {r["conversation"]: r for r in map(json.loads, out.read_text().splitlines())}


def test_a_3_gib_corpus_file_is_its_conversations_error_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    """Sparse files (no disk used): a 3 GiB script and a 200 MB markdown file. Under a
    1 GiB address-space limit the script is an error row naming the cap; the markdown
    file, scanned for a ``**user**:`` line a megabyte at a time, is no chat and skipped."""
    chats, config = _corpus(tmp_path)
    with (chats / "huge.json").open("wb") as fh:
        fh.truncate(3 * GIB)
    with (chats / "huge-note.md").open("wb") as fh:
        fh.truncate(200 << 20)
    out = tmp_path / "out.jsonl"
    ran = lamina_limited(
        "replay", str(chats), "--config", config, "--engine", "serial", "--out", str(out)
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "Traceback" not in ran.stderr
    rows = _rows(out)
    assert sorted(rows) == ["c000.json", "c001.json", "huge.json"]
    assert rows["huge.json"]["errors"] == [
        {
            "turn": 0,
            "type": "ScriptError",
            "message": f"{chats / 'huge.json'}: cannot read: the file is over 4,000,000 bytes",
        }
    ]
    assert rows["c000.json"]["status"] == rows["c001.json"]["status"] == "ok"


def test_a_table_less_sqlite_file_in_the_corpus_stays_untouched(tmp_path: Path) -> None:
    """Before, replay made Lamina's tables in it; now it is reported as no Lamina store and
    keeps every byte (SQLite's read-only mode), and the run goes on."""
    chats, config = _corpus(tmp_path)
    empty = chats / "empty.sqlite"
    sqlite3.connect(empty).execute("PRAGMA user_version = 7").connection.close()
    before = empty.read_bytes()
    run = replay(chats, [config], engine="serial")
    by_id = {r.conversation: r for r in run.results}
    assert by_id["empty.sqlite"].errors[0].message.endswith(
        "not a Lamina store (it has no tables)"
    )
    assert by_id["c000.json"].ok and by_id["c001.json"].ok
    assert empty.read_bytes() == before
    tables = sqlite3.connect(empty).execute("SELECT name FROM sqlite_master").fetchall()
    assert tables == []


def test_a_lamina_store_in_the_corpus_is_replayed_without_a_write(tmp_path: Path) -> None:
    chats, config = _corpus(tmp_path)
    store = chats / "saved.sqlite"
    scripted = replay(chats / "c000.json", [config], engine="serial").results[0]
    assert scripted.ok
    ran = lamina_limited(
        "run", str(chats / "c000.json"), "--store", str(store), "--conversation", "c1"
    )
    assert ran.returncode == 0, ran.stderr
    before = store.read_bytes()
    run = replay(chats, [config], engine="serial")
    saved = {r.conversation: r for r in run.results}["saved.sqlite#c1"]
    assert saved.ok and saved.turns == scripted.turns
    assert store.read_bytes() == before
    with SqliteStore(store, read_only=True) as opened:
        assert [c.id for c in opened.conversations()] == ["c1"]
