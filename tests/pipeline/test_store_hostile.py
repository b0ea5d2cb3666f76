"""Stores that lie: a real conversation's store with one part rewritten by hand (a chunk
read at both levels of its manifest's tree, a manifest that expands to 4e8 segments, a
snapshot that inflates to 600 MB, an entry count that is a string). Each read is refused
within bounds as one typed ``StoreCorrupt`` line naming the conversation, the turn and
the part; the CLI prints that line (exit 2) and replay records it as that conversation's
error and goes on (issue 36, items 7-10 and 12)."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lamina.pipeline._store.sql import MAX_MANIFEST_SEGMENTS, MAX_SNAPSHOT_BYTES
from lamina.pipeline.errors import StoreCorrupt
from lamina.pipeline.store import open_store
from tests.cli import lamina
from tests.pipeline import hostile_stores

Damage = Callable[[Path, int], None]

# What each damage is refused for, after "'c' turn 3: ".
CASES: dict[str, tuple[Damage, str]] = {
    "chunk at both levels": (
        hostile_stores.chunk_at_both_levels,
        r"manifest does not load: chunks node [0-9a-f]{32} is not one of 32 or fewer items",
    ),
    "amplified manifest": (
        hostile_stores.amplified_manifest,
        r"manifest does not load: chunks node [0-9a-f]{32} is not one of 32 or fewer items",
    ),
    "inflating snapshot": (
        lambda path, turn: hostile_stores.inflating_snapshot(path, turn, 100 << 20),
        rf"manifest does not load: snapshot f{{32}} inflates past {MAX_SNAPSHOT_BYTES:,} bytes",
    ),
    "parts not counts": (
        hostile_stores.parts_not_counts,
        r"part history: the count 'not a list' is not a non-negative integer",
    ),
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hostile") / "saved.sqlite"
    hostile_stores.saved_chat(path)
    return path


def _damaged(saved: Path, folder: Path, damage: Damage) -> Path:
    path = folder / "damaged.sqlite"
    shutil.copy(saved, path)
    damage(path, 3)
    return path


@pytest.mark.parametrize("case", list(CASES))
def test_a_damaged_store_is_one_store_corrupt_line_within_bounds(
    saved: Path, tmp_path: Path, case: str
) -> None:
    damage, reason = CASES[case]
    path = _damaged(saved, tmp_path, damage)
    started = time.monotonic()
    with open_store(str(path), read_only=True) as store, pytest.raises(StoreCorrupt) as caught:
        store.manifest("c", 3)
        store.load("c", 3)
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert "\n" not in message
    assert re.fullmatch(rf"store {re.escape(str(path))}: 'c' turn 3: {reason}", message), message


def test_an_amplified_manifest_within_the_node_size_is_refused_before_it_expands(
    saved: Path, tmp_path: Path
) -> None:
    """Nodes of 32 items each (as a real store writes them), one repeated 20,000 times in
    the index: 640,000 leaves, refused by count before a segment is decoded; 32 x 32 is
    within the bound and reads."""
    path = _damaged(saved, tmp_path, lambda p, t: hostile_stores.amplified_manifest(p, t, 32))
    hostile_stores.amplified_manifest(path, 2, fan=20_000, items=32)
    with open_store(str(path), read_only=True) as store:
        manifest = store.manifest("c", 3)
        assert manifest is not None
        assert max(len(layer.segments) for layer in manifest.layers) == 32 * 32
        with pytest.raises(StoreCorrupt) as caught:
            store.manifest("c", 2)
    bound = f"{MAX_MANIFEST_SEGMENTS:,}"  # 640,000 leaves and the other layers' few
    expected = rf"'c' turn 2: manifest does not load: its chunks list 640,0\d\d items, past {bound}"
    assert re.search(expected + "$", str(caught.value)), str(caught.value)


@pytest.mark.parametrize("case", ["chunk at both levels", "parts not counts"])
def test_report_resume_and_export_print_the_line_and_exit_2(
    saved: Path, tmp_path: Path, case: str
) -> None:
    damage, reason = CASES[case]
    path = _damaged(saved, tmp_path, damage)
    script = tmp_path / "more.yaml"
    script.write_text("turns:\n- user: more\n", encoding="utf-8")
    runs = {
        "report": ("report", "--store", str(path), "--conversation", "c", "--out", "r.html"),
        "resume": ("resume", str(path), "--conversation", "c", "--script", str(script)),
        "export": ("export", str(path), "--conversation", "c"),
    }
    for name, args in runs.items():
        if name == "export" and "manifest" in reason:
            continue  # a transcript needs no manifest
        ran = lamina(*args, cwd=tmp_path)
        assert ran.returncode == 2, (name, ran.stderr)
        assert "Traceback" not in ran.stderr
        lines = ran.stderr.strip().splitlines()
        assert len(lines) == 1 and re.search(reason, lines[0]), (name, ran.stderr)


def _replay(corpus: Path, folder: Path) -> tuple[subprocess.CompletedProcess[str], list[Any]]:
    """``lamina replay CORPUS`` under the default config (serial): the run and its results."""
    config = folder / "c.yaml"
    config.write_text("name: default\n", encoding="utf-8")
    out = folder / "r.jsonl"
    args = ("--config", str(config), "--engine", "serial", "--out", str(out))
    ran = lamina("replay", str(corpus), *args, cwd=folder)
    results = list(map(json.loads, out.open())) if out.exists() else []
    return ran, results


def test_replay_records_a_corrupt_conversation_and_goes_on(saved: Path, tmp_path: Path) -> None:
    """One sound conversation, one whose turn row lies: both have a result line, the
    second with the store's one line as its error; the run exits 0 (one succeeded)."""
    path = tmp_path / "two.sqlite"
    hostile_stores.saved_chat(path, "bad", turns=2)
    hostile_stores.saved_chat(path, "good", turns=2)
    hostile_stores.parts_not_counts(path, 2, "bad")
    ran, lines = _replay(path, tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "Traceback" not in ran.stderr
    results = {r["conversation"].rpartition("#")[2]: r for r in lines}
    assert results["good"]["status"] == "ok", results["good"]
    assert results["bad"]["status"] == "error"
    (error,) = results["bad"]["errors"]
    assert "'bad' turn 2: part history: the count 'not a list'" in error["message"]


def test_replay_exits_1_when_no_conversation_replays(tmp_path: Path) -> None:
    """A corpus whose only conversation fails (a SQLite file that is not a Lamina store)
    is reported as that conversation's error, and the run exits 1 (docs/REPLAY.md)."""
    with sqlite3.connect(tmp_path / "other.sqlite") as db:
        db.execute("CREATE TABLE notes (id INTEGER)")
    ran, results = _replay(tmp_path / "other.sqlite", tmp_path)
    assert ran.returncode == 1, ran.stderr
    assert "no conversation replayed without an error" in ran.stderr
    assert [r["status"] for r in results] == ["error"]
