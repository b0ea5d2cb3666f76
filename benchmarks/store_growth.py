"""How a SQLite store grows with a long chat over ``examples/vault``.

Each turn attaches one of the vault's notes and a new selection (so the library and the
history grow by one a turn) and is saved with its reply. Reported per chat length: the
file size (vacuumed), the stored bytes of each snapshot kind, and beside them the bytes the
same turns' manifests take inline (each compressed whole, as stores kept them before their
layers were chunked), measured in the same run. Nothing here asserts a size.

    python -m benchmarks.store_growth [--turns 100 300] [--out growth.json]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VAULT = ROOT / "examples" / "vault"
NOTES = (
    "project-spec.md",
    "glossary.md",
    "docs/auth.md",
    "docs/api-docs.md",
    "meetings/2026-10-19.md",
    "meetings/2026-11-02.md",
)


def measure(turns: int, folder: Path) -> dict[str, Any]:
    """One chat of ``turns`` turns saved to a fresh store in ``folder``."""
    from lamina import Conversation
    from lamina.pipeline._store.records import canonical
    from lamina.pipeline._store.sql import _converter
    from lamina.pipeline.store import ConversationInfo, Manifest, SqliteStore, save_turn

    path = folder / f"growth-{turns}.db"
    vault = VAULT.resolve()
    conv = Conversation("Be terse.", vault=vault)
    inline = 0
    started = time.perf_counter()
    with SqliteStore(path) as store:
        store.create(ConversationInfo("c", vault=str(vault)))
        for i in range(1, turns + 1):
            attach = [
                {"note": NOTES[i % len(NOTES)]},
                {"selection": f"picked line {i}: sync step {i} retries", "source": "x.md"},
            ]
            env = conv.turn(f"question {i} about the sync protocol?", attach)
            save_turn(store, "c", conv, env, attach)
            conv.reply(f"answer {i}: point {i} follows from the spec.")
            save_turn(store, "c", conv, env, attach)
            plain = _converter.unstructure(Manifest.of(env))
            inline += len(zlib.compress(canonical(plain), 6))
        saved = time.perf_counter() - started
        started = time.perf_counter()
        for k in range(1, turns + 1):
            store.manifest("c", k)
        read = time.perf_counter() - started
    db = sqlite3.connect(path)
    try:
        kinds = {
            str(kind): int(size)
            for kind, size in db.execute(
                "SELECT kind, SUM(LENGTH(body)) FROM snapshots GROUP BY kind ORDER BY kind"
            )
        }
        db.execute("VACUUM")
    finally:
        db.close()
    chunked = sum(kinds.get(k, 0) for k in ("manifest", "report", "segments", "chunks"))
    return {
        "turns": turns,
        "library": len(conv.state.library),
        "file_bytes": path.stat().st_size,
        "snapshot_bytes": kinds,
        "manifest_bytes": chunked,
        "manifest_bytes_inline": inline,
        "inline_over_chunked": round(inline / chunked, 2),
        "save_seconds": round(saved, 2),
        "read_manifests_seconds": round(read, 3),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[100, 300])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        results = [measure(n, Path(tmp)) for n in args.turns]
    for r in results:
        print(
            f"{r['turns']:4d} turns, library {r['library']}: file {r['file_bytes'] / 1e6:.2f} MB; "
            f"manifests {r['manifest_bytes'] / 1e3:.0f} KB (inline: "
            f"{r['manifest_bytes_inline'] / 1e3:.0f} KB, {r['inline_over_chunked']}x); "
            f"saves {r['save_seconds']} s, reading every manifest {r['read_manifests_seconds']} s"
        )
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
