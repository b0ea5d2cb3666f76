"""``lamina bench --suite replay``: conversations per second of ``lamina replay`` on the
seeded corpus, serial vs the local process pool vs a Dask LocalCluster, in one run.

Each engine replays the same corpus under the same two configs from a cold start (pool or
cluster started inside the timing, as a user's run does) at 1 worker and at every worker
count up to the machine's cores, and the results files are checked to be identical.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.replay_corpus import CONFIGS, write_replay_corpus
from benchmarks.run import _machine
from lamina import DaskEngine, Engine, LocalEngine, SerialEngine, parse_config, replay

__all__ = ["main", "run_replay_benchmark"]


def _engines(cores: int) -> list[tuple[Engine, int]]:
    counts = sorted({1, cores})
    out: list[tuple[Engine, int]] = [(SerialEngine(), 1)]
    out += [(LocalEngine(n), n) for n in counts]
    out += [(DaskEngine(n), n) for n in counts]
    return out


def _per_core(runs: list[dict[str, Any]], engine: str) -> float | None:
    """Speedup gained per added worker: (rate at n / rate at 1 - 1) / (n - 1)."""
    mine = sorted((r["workers"], r["conversations_per_s"]) for r in runs if r["engine"] == engine)
    if len(mine) < 2 or mine[-1][0] == 1:
        return None
    (one, base), (n, rate) = mine[0], mine[-1]
    return round((rate / base - 1) / (n - one), 3)


def run_replay_benchmark(
    conversations: int = 200, workers: int | None = None, console: Console | None = None
) -> dict[str, Any]:
    """Replay the seeded corpus on every engine; the JSON-ready result document."""
    console = console or Console()
    cores = workers or len(os.sched_getaffinity(0))
    configs = [parse_config(data, name) for name, data in CONFIGS.items()]
    runs: list[dict[str, Any]] = []
    files: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="lamina-bench-replay-") as tmp:
        chats = write_replay_corpus(Path(tmp), conversations)
        for engine, n in _engines(cores):
            started = time.perf_counter()
            run = replay(chats, configs, engine=engine)
            seconds = time.perf_counter() - started
            files.add("\n".join(run.lines()))
            runs.append(
                {
                    "engine": engine.name,
                    "workers": n,
                    "seconds": round(seconds, 3),
                    "conversations_per_s": round(conversations / seconds, 2),
                }
            )
            console.print(f"{engine.name:>6} x{n}: {conversations / seconds:6.1f} conversations/s")
    return {
        "lamina_bench_replay": 1,
        "machine": _machine(),
        "conversations": conversations,
        "configs": sorted(CONFIGS),
        "runs": runs,
        "identical_results": len(files) == 1,
        "speedup_per_added_worker": {e: _per_core(runs, e) for e in ("local", "dask")},
    }


def format_table(doc: dict[str, Any], console: Console) -> None:
    machine = doc["machine"]
    table = Table(
        title=f"lamina replay: {doc['conversations']} conversations x {len(doc['configs'])} "
        f"configs, {machine['cpu']}, {machine['cores']} cores"
    )
    for col in ("engine", "workers", "seconds", "conversations/s", "vs serial"):
        table.add_column(col, justify="left" if col == "engine" else "right")
    serial = next(r["conversations_per_s"] for r in doc["runs"] if r["engine"] == "serial")
    for r in doc["runs"]:
        ratio = r["conversations_per_s"] / serial if serial else 0.0
        table.add_row(
            r["engine"],
            str(r["workers"]),
            f"{r['seconds']:.2f}",
            f"{r['conversations_per_s']:.1f}",
            f"{ratio:.2f}x",
        )
    console.print(table)
    gains = ", ".join(
        f"{e} {'-' if v is None else f'{v:+.0%}'}"
        for e, v in doc["speedup_per_added_worker"].items()
    )
    console.print(f"speedup per added worker: {gains}; identical results: "
                  f"{doc['identical_results']}")


def main(conversations: int = 200, workers: int | None = None, out: str | None = None) -> int:
    """Run, print the table, write the JSON; status 1 if engines disagreed."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    doc = run_replay_benchmark(conversations, workers, console)
    format_table(doc, console)
    if out is not None:
        from lamina._files import write_atomic  # whole or not at all

        write_atomic(out, json.dumps(doc, indent=2) + "\n")
        console.print(f"results written to {out}")
    return 0 if doc["identical_results"] else 1
