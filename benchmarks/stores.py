"""Store benchmarks: SQLite beside PostgreSQL, in one run, on one seeded conversation.

- ``latency``: a chat saved turn by turn (each turn attaches a note and a selection); the
  median save of the turns just before 10 and 100, the median load (``load_conversation``)
  and head query at 10 and 100 turns.
- ``throughput``: 8 worker processes, each saving its own conversation (states built
  before the clock starts, so the store is what is timed); turns per second overall.

PostgreSQL is a throwaway local cluster (Unix socket, ``fsync=off`` as in the tests) unless
``--postgres URL`` names a server. Ratios are PostgreSQL over SQLite.
"""

from __future__ import annotations

import faulthandler
import json
import multiprocessing
import os
import random
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from benchmarks.pgcluster import Unavailable, throwaway_cluster
from benchmarks.workload import make_note

SEED = 1616
DEPTHS = (10, 100)
WORKERS = 8
WORKER_TURNS = {"small": 15, "medium": 30, "large": 60}
SAMPLES = 5
STARTED_S = 60
"""Seconds the workers and the clock wait for each other at the start (a worker that failed
opening its store breaks the start instead of leaving the rest waiting)."""
FINISHED_S = 120
"""Seconds the workers may take to save their turns (a few on a laptop); a worker still
saving then prints its threads' stacks, is killed, and the run fails."""


def _vault(root: Path) -> Path:
    rng = random.Random(SEED)
    for i in range(12):
        (root / f"note-{i:02d}.md").write_text(make_note(rng, 2000, f"Note {i}"), "utf-8")
    return root


def _attach(i: int) -> list[dict[str, Any]]:
    return [{"note": f"note-{i % 12:02d}.md"}, {"selection": f"picked line {i}", "source": "x"}]


def _prepared(vault: Path, name: str, turns: int) -> list[tuple[Any, Any, Any]]:
    """Each turn's (record, state, manifest), built before anything is timed."""
    from lamina import Conversation
    from lamina.pipeline.store import Manifest, turn_record

    conv = Conversation("You are terse.", vault=vault)
    out = []
    for i in range(1, turns + 1):
        env = conv.turn(f"{name} question {i}", _attach(i))
        conv.reply(f"{name} answer {i}")
        out.append((turn_record(conv, _attach(i), created="", reply_created=""),
                    conv.state, Manifest.of(env)))  # fmt: skip
    return out


def _latency(value: str, vault: Path, prepared: list[tuple[Any, Any, Any]]) -> dict[str, Any]:
    from lamina import load_conversation
    from lamina.pipeline.store import ConversationInfo, Head, open_store

    point: dict[str, Any] = {}
    with open_store(value) as store:
        store.create(ConversationInfo("bench"))
        head = Head()
        saves: list[float] = []
        for record, state, manifest in prepared:
            start = time.perf_counter()
            head = store.save_turn("bench", record, state, manifest, parent=head)
            saves.append(time.perf_counter() - start)
            if record.turn in DEPTHS:
                loads, heads = [], []
                for _ in range(SAMPLES):
                    start = time.perf_counter()
                    load_conversation(store, "bench", vault=vault)
                    loads.append(time.perf_counter() - start)
                    start = time.perf_counter()
                    store.head("bench")
                    heads.append(time.perf_counter() - start)
                point[str(record.turn)] = {
                    "save_s": statistics.median(saves[-SAMPLES:]),
                    "load_s": statistics.median(loads),
                    "head_s": statistics.median(heads),
                }
    return point


def _worker(value: str, prepared: list[tuple[Any, Any, Any]], name: str, start: Any) -> None:
    from lamina.pipeline.store import ConversationInfo, Head, open_store

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks, if it is stuck
    with ExitStack() as stack:
        try:
            store = stack.enter_context(open_store(value, timeout=60))
            store.create(ConversationInfo(name))
        except BaseException:
            start.abort()  # the other workers and the clock stop waiting at once
            raise
        head = Head()
        start.wait(STARTED_S)
        for record, state, manifest in prepared:
            head = store.save_turn(name, record, state, manifest, parent=head)


def _throughput(value: str, vault: Path, turns: int) -> dict[str, Any]:
    fork = multiprocessing.get_context("fork")
    start = fork.Barrier(WORKERS + 1)
    work = [_prepared(vault, f"w{n}", turns) for n in range(WORKERS)]
    procs = [fork.Process(target=_worker, args=(value, work[n], f"w{n}", start))
             for n in range(WORKERS)]  # fmt: skip
    for p in procs:
        p.start()
    seconds: float | None = None  # None: the start broke
    try:
        start.wait(STARTED_S)  # broken, not waited on forever, if a worker fails first
        began = time.perf_counter()
        for p in procs:
            p.join(max(0.0, began + FINISHED_S - time.perf_counter()))
        seconds = time.perf_counter() - began
    except threading.BrokenBarrierError:
        pass
    finally:
        _end_stuck(procs)
    if seconds is None or any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"a store worker failed: exit codes {[p.exitcode for p in procs]}")
    return {"workers": WORKERS, "turns": WORKERS * turns, "turns_per_s": WORKERS * turns / seconds}


def _end_stuck(procs: list[Any]) -> None:
    """Kill the workers still running after a short grace (a worker ending on a broken
    start), each first printing its threads' stacks to stderr."""
    grace = time.perf_counter() + 5
    for p in procs:
        p.join(max(0.0, grace - time.perf_counter()))
    stuck = [p for p in procs if p.exitcode is None]
    for p in stuck:
        os.kill(p.pid, signal.SIGUSR1)
    time.sleep(1 if stuck else 0)
    for p in stuck:
        p.kill()
        p.join()


@contextmanager
def _postgres(url: str | None) -> Iterator[Callable[[str], str] | str]:
    if url is not None:
        yield lambda name: url
        return
    try:
        with throwaway_cluster() as cluster:
            yield cluster.create_database
    except Unavailable as exc:
        yield f"not run: {exc}"


def run(scale: str = "small", postgres_url: str | None = None) -> dict[str, Any]:
    """Both backends' points and the PostgreSQL/SQLite ratios."""
    doc: dict[str, Any] = {"scale": scale, "backends": {}}
    with tempfile.TemporaryDirectory(prefix="lamina-bench-stores-") as tmp:
        root = Path(tmp)
        (root / "vault").mkdir()
        vault = _vault(root / "vault")
        prepared = _prepared(vault, "bench", max(DEPTHS))
        with _postgres(postgres_url) as pg:
            values: dict[str, Callable[[str], str]] = {
                "sqlite": lambda name: str(root / f"{name}.db")
            }
            if isinstance(pg, str):
                doc["postgres"] = pg
            else:
                values["postgres"] = pg
            for backend, value in values.items():
                doc["backends"][backend] = {
                    "latency": _latency(value("latency"), vault, prepared),
                    "throughput": _throughput(value("throughput"), vault, WORKER_TURNS[scale]),
                }
    found = doc["backends"]
    if "postgres" in found:
        sq, pg_ = found["sqlite"], found["postgres"]
        doc["ratios"] = {
            **{
                f"{metric}_{depth}": pg_["latency"][str(depth)][metric]
                / sq["latency"][str(depth)][metric]
                for depth in DEPTHS
                for metric in ("save_s", "load_s", "head_s")
            },
            "turns_per_s": pg_["throughput"]["turns_per_s"] / sq["throughput"]["turns_per_s"],
        }
    return doc


def format_table(doc: dict[str, Any]) -> str:
    lines = ["store      turns  save ms  load ms  head ms", "-" * 44]
    for backend, found in doc["backends"].items():
        for depth, p in found["latency"].items():
            lines.append(f"{backend:<10} {depth:>5} {p['save_s'] * 1000:>8.2f} "
                         f"{p['load_s'] * 1000:>8.2f} {p['head_s'] * 1000:>8.2f}")  # fmt: skip
    lines.append("")
    for backend, found in doc["backends"].items():
        t = found["throughput"]
        lines.append(f"{backend:<10} {t['workers']} workers, {t['turns']} turns: "
                     f"{t['turns_per_s']:.0f} turns/s")  # fmt: skip
    if "ratios" in doc:
        lines.append("")
        lines.append("postgres / sqlite: " + ", ".join(
            f"{k} {v:.2f}x" for k, v in doc["ratios"].items()))  # fmt: skip
    if "postgres" in doc:
        lines.append(f"postgres {doc['postgres']}")
    return "\n".join(lines)


def main(scale: str = "small", out: str | None = None, postgres_url: str | None = None) -> None:
    """``lamina bench --suite stores``: run, print the table, write the JSON. SIGUSR1 prints
    the threads' stacks to stderr (for a run that seems stuck)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    doc = run(scale, postgres_url)
    print(format_table(doc))
    if out is not None:
        from lamina._files import write_atomic  # whole or not at all

        write_atomic(out, json.dumps(doc, indent=2) + "\n")
