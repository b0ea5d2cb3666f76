"""Hand-built hostile SQLite stores: a real conversation saved by Lamina, then one part
of it rewritten as an attacker (or a bad disk) would (issue 36, items 7-10). Shared by
tests/pipeline/test_store_hostile.py and the measurements reported with it."""

from __future__ import annotations

import json
import sqlite3
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lamina import Conversation
from lamina.pipeline._store.records import canonical, digest
from lamina.pipeline.store import ConversationInfo, open_store, save_turn

ROOT = Path(__file__).resolve().parents[2]
VAULT = ROOT / "examples" / "vault"


def saved_chat(path: Path, cid: str = "c", turns: int = 3) -> None:
    """A chat whose library and history grow (so its manifest layers have chunk trees)."""
    with open_store(str(path)) as store:
        store.create(ConversationInfo(cid, vault=str(VAULT)))
        conv = Conversation("Be terse.", vault=VAULT)
        notes = ("project-spec.md", "docs/api-docs.md", "docs/auth.md")
        for i in range(1, turns + 1):
            attach = [{"note": notes[i % 3]}]
            env = conv.turn(f"question {i}", attach)
            conv.reply(f"answer {i}")
            save_turn(store, cid, conv, env, attach)


def _put(db: sqlite3.Connection, kind: str, value: Any) -> str:
    body = canonical(value)
    h = digest(body)
    db.execute(
        "INSERT OR IGNORE INTO snapshots (hash, kind, body) VALUES (?, ?, ?)",
        (h, kind, zlib.compress(body, 6)),
    )
    return h


def _value(db: sqlite3.Connection, h: str) -> Any:
    (body,) = db.execute("SELECT body FROM snapshots WHERE hash = ?", (h,)).fetchone()
    return json.loads(zlib.decompress(body))


def _rewrite_manifest(
    path: Path, turn: int, change: Callable[[sqlite3.Connection, dict[str, Any]], None]
) -> None:
    """Turn ``turn``'s manifest, changed by ``change`` and saved under its new hash."""
    with sqlite3.connect(path) as db:
        (h,) = db.execute("SELECT manifest_hash FROM turns WHERE turn = ?", (turn,)).fetchone()
        plain = _value(db, h)
        change(db, plain)
        new = _put(db, "manifest", plain)
        db.execute("UPDATE turns SET manifest_hash = ? WHERE turn = ?", (new, turn))


def _indexed(plain: dict[str, Any]) -> dict[str, Any]:
    return next(layer for layer in plain["layers"] if layer.get("index"))


def chunk_at_both_levels(path: Path, turn: int) -> None:
    """Item 7: a layer's index lists a segments node as well as the chunks node above it,
    so one snapshot is read as a chunk of hashes and as a chunk of segments."""

    def change(db: sqlite3.Connection, plain: dict[str, Any]) -> None:
        layer = _indexed(plain)
        leaf = _value(db, layer["index"][0])[0]
        layer["index"] = [*layer["index"], leaf]

    _rewrite_manifest(path, turn, change)


def amplified_manifest(path: Path, turn: int, fan: int = 20_000, items: int = 0) -> None:
    """Item 8: the index repeats one chunks node ``fan`` times, which repeats one segments
    node ``items`` times (default ``fan``): ``fan * items`` segments from a few kB."""

    def change(db: sqlite3.Connection, plain: dict[str, Any]) -> None:
        layer = _indexed(plain)
        leaf = _value(db, layer["index"][0])[0]
        node = _put(db, "chunks", [leaf] * (items or fan))
        layer["index"] = [node] * fan

    _rewrite_manifest(path, turn, change)


def inflating_snapshot(path: Path, turn: int, size: int = 600 << 20) -> None:
    """Item 9: turn ``turn``'s manifest is a JSON string of ``size`` bytes, stored
    compressed in about a thousandth of that (written a MB at a time)."""
    packer = zlib.compressobj(9)
    parts = [packer.compress(b'"')]
    block = b"a" * (1 << 20)
    for _ in range(size >> 20):
        parts.append(packer.compress(block))
    parts.append(packer.compress(b'"') + packer.flush())
    with sqlite3.connect(path) as db:
        h = "f" * 32  # never checked: the read stops before the hash
        db.execute(
            "INSERT INTO snapshots (hash, kind, body) VALUES (?, 'manifest', ?)",
            (h, b"".join(parts)),
        )
        db.execute("UPDATE turns SET manifest_hash = ? WHERE turn = ?", (h, turn))


def parts_not_counts(path: Path, turn: int, cid: str = "c") -> None:
    """Item 10: a turn row's ``parts`` holds a string where an entry count belongs."""
    with sqlite3.connect(path) as db:
        db.execute(
            "UPDATE turns SET parts = ? WHERE turn = ? AND conversation_id = ?",
            ('{"history": "not a list"}', turn, cid),
        )
