"""The benchmark runner behind ``lamina bench``: Lamina vs floor, naive and peers.

Every scale point runs Lamina through its public API on seeded content, measures the
comparators on the same turns in the same run, prints a table with the targets next to
the measurements and writes a JSON result file. Nothing here asserts a time.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from benchmarks.comparators import (
    NOT_INSTALLED,
    PEERS,
    PeerTask,
    PeerWorker,
    floor_turn,
    naive_turn,
    peer_available,
)
from benchmarks.memory import measure_memory, memory_targets
from benchmarks.stateless import (
    RequestPoint,
    forget_process_memos,
    measure_requests,
    peer_task,
    request_points,
)
from benchmarks.targets import target
from benchmarks.workload import (
    SCALES,
    Scale,
    Workload,
    cold_workload,
    conversation_workload,
    library_workload,
    write_vault,
)

__all__ = ["RESULT_VERSION", "main", "run_benchmarks"]

RESULT_VERSION = 1
SEED = 20260
SYSTEM = (
    "You are the project assistant. Answer from the attached context and cite note paths. "
    "Say so when the context does not answer."
)
# Library and cold points: a window nothing is cut from (the budget stage still measures).
ROOMY_WINDOW = 8_000_000
# Conversation points: a 128k model, where the budget cuts as the chat grows.
CHAT_MODEL = "gpt-4o"
LIBRARY_BATCH = 100
# The memory point's windows per scale (the small scale keeps the smoke run short).
MEMORY_WINDOWS = {"small": (8_192,), "medium": (4_096, 8_192, 16_384)}

TARGETS = {
    "warm_vs_floor": 3.0,
    "naive_vs_warm": 50.0,
    "cold_vs_tiktoken": 1.25,
    "memory_vs_payload": 3.0,
}


@dataclass
class Point:
    """One scale point's workload and what was measured on it."""

    kind: str  # "cold" | "library" | "conversation"
    size: int
    workload: Workload
    lamina: dict[str, Any] = field(default_factory=dict)
    floor: dict[str, Any] = field(default_factory=dict)
    naive: dict[str, Any] = field(default_factory=dict)
    peers: dict[str, dict[str, Any]] = field(default_factory=dict)
    tasks: list[PeerTask] = field(default_factory=list)
    budget_limit: int = 0
    payload_bytes: int = 0

    @property
    def name(self) -> str:
        return self.workload.name


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _budget(kind: str) -> Any:
    from lamina.pipeline import Budget

    if kind == "conversation":
        return Budget.for_model(CHAT_MODEL)
    return Budget(context_window=ROOMY_WINDOW, reserve_output=32_768)


def _specs(paths: Sequence[str]) -> list[dict[str, str]]:
    return [{"note": p} for p in paths]


def _contents(env: Any) -> list[str]:
    from lamina.renderers import openai_messages

    return [m["content"] for m in openai_messages(env)]


def _sampled(count: int, samples: int) -> set[int]:
    if count <= samples:
        return set(range(count))
    step = (count - 1) / (samples - 1)
    return {round(i * step) for i in range(samples)}


def _conversation(vault: Path, kind: str) -> Any:
    from lamina import Conversation

    return Conversation(SYSTEM, vault=vault, budget=_budget(kind))


def _setup_library(conv: Any, workload: Workload, advance: Callable[[], None]) -> float:
    """Promote the library into L2 in batches (no budget), then restore the budget."""
    budget, conv.budget = conv.budget, None
    start = time.perf_counter()
    for i in range(0, len(workload.library), LIBRARY_BATCH):
        batch = workload.library[i : i + LIBRARY_BATCH]
        conv.turn(f"Load library notes {i + 1}-{i + len(batch)}.", attach=_specs(batch))
        conv.reply("Loaded.")
        advance()
    conv.budget = budget
    return time.perf_counter() - start


def _measure_cold(point: Point, vault: Path, scale: Scale, advance: Callable[[], None]) -> None:
    from lamina.pipeline.tokens import get_encoding

    enc = get_encoding("o200k_base")
    turn = point.workload.turns[0]
    times: list[float] = []
    promotions: list[float] = []
    reference: list[float] = []
    conv = None
    env = None
    for _ in range(2 if scale.name == "large" else 3):
        forget_process_memos()  # cold: nothing counted or summarized in this process yet
        conv = _conversation(vault, point.kind)
        point.tasks = [peer_task(conv, point.workload.notes, turn.attach, turn.query)]
        start = time.perf_counter()
        env = conv.turn(turn.query, attach=_specs(turn.attach))
        times.append(time.perf_counter() - start)
        promotions.append(_promotion_time(conv))
        payload = "".join(_contents(env))
        start = time.perf_counter()
        enc.encode_ordinary(payload)
        reference.append(time.perf_counter() - start)
        advance()
    assert conv is not None and env is not None
    contents = _contents(env)
    point.payload_bytes = sum(len(c.encode("utf-8")) for c in contents)
    point.budget_limit = conv.budget.limit
    forget_process_memos()
    fresh = _conversation(vault, point.kind)
    tracemalloc.start()
    fresh.turn(turn.query, attach=_specs(turn.attach))
    _ = fresh.library  # the promotion's memory counts too
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    advance()
    point.lamina = {
        "cold_s": statistics.median(times),
        "promotion_s": statistics.median(promotions),
        "request_tokens": conv.count_request(env),
        "encoded_chars": conv.counter.encoded_chars,
        "peak_bytes": peak,
    }
    point.floor = {"tiktoken_s": statistics.median(reference)}
    point.naive = {"p50_s": naive_turn(enc.encode_ordinary, lambda: contents)[0]}


def _promotion_time(conv: Any) -> float:
    """Seconds from the turn's return until its new items are in L2: the promotion runs on
    a background thread while the model answers; waiting here keeps it out of the next
    timing (and of the floor and naive measurements)."""
    start = time.perf_counter()
    _ = conv.library
    return time.perf_counter() - start


def _measure_turns(point: Point, vault: Path, scale: Scale, advance: Callable[[], None]) -> None:
    from lamina.pipeline.tokens import get_encoding

    enc = get_encoding("o200k_base")
    workload = point.workload
    forget_process_memos()  # what earlier points counted does not help this one
    conv = _conversation(vault, point.kind)
    setup = _setup_library(conv, workload, advance) if workload.library else 0.0
    sampled = _sampled(len(workload.turns) - 1, scale.peer_samples)
    warm: list[float] = []
    floor: list[float] = []
    naive: list[float] = []
    promotions: list[float] = []
    encoded: list[int] = []  # the counter's delta: the turn, its promotion and the reply
    in_turn: list[int] = []  # the turn's own meter (its report), promotion not included
    new_chars: list[int] = []
    cold = 0.0
    peak = 0
    last_reply = ""
    env = None
    for i, turn in enumerate(workload.turns):
        last = i == len(workload.turns) - 1
        if i in sampled:
            point.tasks.append(peer_task(conv, workload.notes, turn.attach, turn.query))
        before = tuple(conv.library)
        chars = conv.counter.encoded_chars
        if last:  # the last turn runs under tracemalloc and is left out of the timings
            tracemalloc.start()
        start = time.perf_counter()
        env = conv.turn(turn.query, attach=_specs(turn.attach))
        seconds = time.perf_counter() - start
        promotion = _promotion_time(conv)
        if last:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        conv.reply(turn.reply)
        new_text = "".join(workload.notes[p] for p in turn.new) + turn.query + last_reply
        last_reply = turn.reply
        contents = _contents(env)
        if i == 0 and not workload.library:
            cold = seconds
        elif not last:
            warm.append(seconds)
            promotions.append(promotion)
            encoded.append(conv.counter.encoded_chars - chars)
            in_turn.append(dict(env.report.meters)["encoded_chars"])
            new_chars.append(len(new_text))
            floor.append(floor_turn(enc.encode_ordinary, new_text, contents))
            naive.append(naive_turn(enc.encode_ordinary, _renderer(conv, before, contents))[0])
        advance()
    assert env is not None
    point.payload_bytes = sum(len(c.encode("utf-8")) for c in _contents(env))
    point.budget_limit = conv.budget.limit
    decisions = sum(1 for d in env.report.decisions if d.stage == "budget")
    point.lamina = {
        "cold_s": setup if workload.library else cold,
        "cold_what": "library setup" if workload.library else "first turn",
        "warm_p50_s": _quantile(warm, 0.5),
        "warm_p95_s": _quantile(warm, 0.95),
        "warm_turns": len(warm),
        "promotion_p50_s": _quantile(promotions, 0.5),
        "encoded_chars_p50": int(_quantile(encoded, 0.5)),
        "turn_encoded_chars_p50": int(_quantile(in_turn, 0.5)),
        "new_chars_p50": int(_quantile(new_chars, 0.5)),
        "request_tokens": conv.count_request(env),
        "library_entries": len(conv.library),
        "budget_cuts_last_turn": decisions,
        "peak_bytes": peak,
    }
    point.floor = {"p50_s": _quantile(floor, 0.5)}
    point.naive = {"p50_s": _quantile(naive, 0.5)}


def _renderer(conv: Any, library: Sequence[Any], contents: list[str]) -> Callable[[], list[str]]:
    """Naive: render every L2 entry again and rebuild the system message from scratch."""

    def render() -> list[str]:
        blocks = [conv.renderer.render(e.view) for e in library]
        system = "\n\n".join([SYSTEM, *blocks])
        return [system, *contents[1:]]

    return render


def _measure_peers(
    points: Sequence[Point | RequestPoint],
    scale: Scale,
    advance: Callable[[], None],
    console: Console,
) -> None:
    for name, (_, cannot) in PEERS.items():
        if not peer_available(name):
            for point in points:
                point.peers[name] = {"status": NOT_INSTALLED, "cannot_express": cannot}
                for _ in point.tasks:
                    advance()
            continue
        worker = PeerWorker(name)
        try:
            for point in points:
                point.peers[name] = _peer_point(worker, point, scale, advance)
                point.peers[name]["cannot_express"] = cannot
                if worker.proc.poll() is not None:
                    worker.close()
                    worker = PeerWorker(name)
        finally:
            worker.close()


def _peer_point(
    worker: PeerWorker, point: Point | RequestPoint, scale: Scale, advance: Callable[[], None]
) -> dict[str, Any]:
    seconds: list[float] = []
    statuses: list[str] = []
    spent = 0.0
    warmed = False
    for task in point.tasks:
        if spent > scale.peer_seconds or (statuses and statuses[-1].startswith("timeout")):
            advance()
            continue
        if not warmed:  # first call pays imports and the encoding build: not timed
            worker.run(task, scale.peer_seconds)
            warmed = True
        result = worker.run(task, scale.peer_seconds)
        statuses.append(str(result.get("status", "?")))
        if "seconds" in result and not statuses[-1].startswith("error"):
            seconds.append(float(result["seconds"]))
            spent += float(result["seconds"])
        advance()
    out: dict[str, Any] = {"samples": len(seconds), "statuses": sorted(set(statuses))}
    if seconds:
        out["p50_s"] = _quantile(seconds, 0.5)
        out["status"] = "ok" if set(statuses) == {"ok"} else "; ".join(sorted(set(statuses)))
    else:
        out["status"] = statuses[0] if statuses else "no sample"
    return out


def _points(scale: Scale) -> list[Point]:
    points = [Point("cold", scale.cold_bytes, cold_workload(SEED, scale.cold_bytes))]
    points += [
        Point("library", n, library_workload(SEED, n, scale.warm_turns + 1))
        for n in scale.libraries
    ]
    points += [
        Point("conversation", n, conversation_workload(SEED, n)) for n in scale.conversations
    ]
    return points


def _units(point: Point, scale: Scale) -> int:
    if point.kind == "cold":
        return (2 if scale.name == "large" else 3) + 1
    batches = -(-len(point.workload.library) // LIBRARY_BATCH)
    return batches + len(point.workload.turns)


def run_benchmarks(scale_name: str, console: Console | None = None) -> dict[str, Any]:
    """Run every point of ``scale_name`` and return the JSON-ready result document."""
    from lamina.pipeline.tokens import get_encoding

    console = console or Console()
    scale = SCALES[scale_name]
    points = _points(scale)
    get_encoding("o200k_base")  # built once, outside every timing
    started = time.time()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        total = sum(_units(p, scale) for p in points)
        bar = progress.add_task(f"lamina bench {scale.name}", total=total)

        def advance() -> None:
            progress.advance(bar)

        for point in points:
            progress.update(bar, description=f"{point.name}: lamina")
            with tempfile.TemporaryDirectory(prefix="lamina-bench-") as tmp:
                vault = Path(tmp)
                write_vault(point.workload, vault)
                if point.kind == "cold":
                    _measure_cold(point, vault, scale, advance)
                else:
                    _measure_turns(point, vault, scale, advance)
        requests = request_points(SEED, scale.request_library)
        total += _request_units(requests, scale)
        progress.update(bar, total=total)
        for request in requests:
            progress.update(bar, description=f"{request.name}: lamina")
            measure_requests(request, scale.requests, _budget("library"), advance)
        every: list[Point | RequestPoint] = [*points, *requests]
        peer_units = sum(len(p.tasks) for p in every) * len(PEERS)
        progress.update(bar, total=total + peer_units, description="peers")
        _measure_peers(every, scale, advance, console)
        windows = MEMORY_WINDOWS.get(scale.name, (4_096, 8_192, 16_384))
        progress.update(bar, total=total + peer_units + 2 * len(windows), description="memory")
        memory = measure_memory(SEED, windows, advance=advance)
    doc = _document(points, scale, time.time() - started, requests)
    doc["memory"] = memory
    doc["targets"] += memory_targets(memory)
    return doc


def _request_units(requests: Sequence[RequestPoint], scale: Scale) -> int:
    return sum(scale.requests * (2 if r.kind == "peers-task" else 1) for r in requests)


def _machine() -> dict[str, Any]:
    import tiktoken

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "tiktoken": tiktoken.__version__,
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def _targets(
    points: Sequence[Point], requests: Sequence[RequestPoint] = ()
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    libs = [p for p in points if p.kind == "library"]
    if libs:
        big = max(libs, key=lambda p: p.size)
        where = f"{big.name} + one new 10 KB note"
        vs_floor = _ratio(big.lamina["warm_p50_s"], big.floor["p50_s"])
        vs_naive = _ratio(big.naive["p50_s"], big.lamina["warm_p50_s"])
        full = big.size >= 1000
        out.append(target("warm turn within 3x of floor", where, vs_floor, "<=", 3.0, full))
        out.append(target("warm turn >= 50x faster than naive", where, vs_naive, ">=", 50.0, full))
        if full:  # still within 2x where the request is largest
            out.append(target("warm turn within 2x of floor", where, vs_floor, "<=", 2.0, True))
    for p in points:
        if p.kind in ("library", "conversation"):  # every warm point
            ratio = _ratio(p.lamina["warm_p50_s"], p.floor["p50_s"])
            out.append(target("warm turn within 5x of floor", p.name, ratio, "<=", 5.0, True))
    for p in points:
        if p.kind == "cold":
            ratio = _ratio(p.lamina["cold_s"], p.floor["tiktoken_s"])
            out.append(
                target(
                    "cold build within 1.25x of tiktoken on the same bytes",
                    f"{p.name} ({p.lamina['request_tokens']:,} tokens)",
                    ratio,
                    "<=",
                    1.25,
                    p.lamina["request_tokens"] >= 900_000,
                )
            )
            out.append(
                target("cold build within 1.5x of tiktoken", p.name, ratio, "<=", 1.5, True)
            )
    for p in points:
        ratio = _ratio(p.lamina["peak_bytes"], p.payload_bytes)
        out.append(target("peak memory < 3x payload bytes", p.name, ratio, "<", 3.0, True))
    for p in points:
        mine = p.lamina.get("warm_p50_s", p.lamina.get("cold_s"))
        for name, peer in p.peers.items():
            theirs = peer.get("p50_s")
            speedup = _ratio(theirs, mine)
            out.append(target(f"faster than {name}", p.name, speedup, ">", 1.0, True))
    for r in requests:
        for name, peer in r.peers.items():
            for what, mine in _request_times(r):
                speedup = _ratio(peer.get("p50_s"), mine)
                where = f"{r.name} ({what})"
                out.append(target(f"faster than {name} per call", where, speedup, ">", 1.0, True))
    return out


def _request_times(r: RequestPoint) -> list[tuple[str, float]]:
    """Lamina's per-call times of a request point, each compared with the peers."""
    if r.kind == "peers-task":
        return [
            ("restored", r.lamina["restored_p50_s"]),
            ("warm next turn", r.lamina["warm_p50_s"]),
        ]
    times = [("load + turn + save", r.lamina["p50_s"])]
    if r.lamina.get("first_p50_s") is not None:
        times.append(("first request in the process", r.lamina["first_p50_s"]))
    return times


def _document(
    points: Sequence[Point],
    scale: Scale,
    seconds: float,
    requests: Sequence[RequestPoint] = (),
) -> dict[str, Any]:
    return {
        "version": RESULT_VERSION,
        "scale": scale.name,
        "seed": SEED,
        "seconds": round(seconds, 1),
        "machine": _machine(),
        "points": [
            {
                "name": p.name,
                "kind": p.kind,
                "size": p.size,
                "notes": len(p.workload.notes),
                "note_bytes": p.workload.note_bytes,
                "payload_bytes": p.payload_bytes,
                "budget_limit": p.budget_limit,
                "lamina": p.lamina,
                "floor": p.floor,
                "naive": p.naive,
                "peers": p.peers,
            }
            for p in points
        ],
        "requests": [
            {
                "name": r.name,
                "kind": r.kind,
                "notes": len(r.workload.notes),
                "note_bytes": r.workload.note_bytes,
                "lamina": r.lamina,
                "peers": r.peers,
            }
            for r in requests
        ],
        "targets": _targets(points, requests),
    }


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:,.1f} ms" if value < 10 else f"{value:,.1f} s"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}x"


def _peer_cell(peer: dict[str, Any], mine: float | None) -> str:
    if "p50_s" not in peer:
        return str(peer.get("status", "-"))
    cell = f"{_ms(peer['p50_s'])} ({_x(_ratio(peer['p50_s'], mine))})"
    if peer["status"] != "ok":
        cell += f" [{peer['status']}]"
    return cell


def format_tables(doc: dict[str, Any], console: Console) -> None:
    """Print Lamina's measurements, the comparators (ratio = their time / Lamina's) and the
    targets."""
    machine = doc["machine"]
    title = f"lamina bench --scale {doc['scale']}: {machine['cpu']}, {machine['cores']} cores"
    table = Table(title=title)
    columns = ("point", "cold", "warm p50", "warm p95", "promotion", "chars encoded/turn")
    for col in (*columns, "tokens", "peak"):
        table.add_column(col, justify="left" if col == "point" else "right")
    for p in doc["points"]:
        lam = p["lamina"]
        encoded = lam.get("encoded_chars_p50")
        chars = "-" if encoded is None else f"{encoded:,} (new {lam['new_chars_p50']:,})"
        in_turn = lam.get("turn_encoded_chars_p50")
        if encoded is not None and in_turn is not None:
            chars = f"{encoded:,} ({in_turn:,} in the turn, new {lam['new_chars_p50']:,})"
        peak = lam["peak_bytes"]
        mem = f"{peak / 1e6:,.1f} MB ({_x(_ratio(peak, p['payload_bytes']))} payload)"
        table.add_row(
            p["name"],
            _ms(lam["cold_s"]),
            _ms(lam.get("warm_p50_s")),
            _ms(lam.get("warm_p95_s")),
            _ms(lam.get("promotion_p50_s", lam.get("promotion_s"))),
            chars,
            f"{lam['request_tokens']:,}",
            mem,
        )
    console.print(table)
    comp = Table(
        title="comparators on the same turns (x: their time / Lamina's; floor: Lamina / floor)"
    )
    for col in ("point", "lamina", "floor", "naive", *PEERS):
        comp.add_column(col, justify="left" if col == "point" else "right")
    for p in doc["points"]:
        lam = p["lamina"]
        mine = lam.get("warm_p50_s", lam["cold_s"])
        if p["kind"] == "cold":
            ref = p["floor"]["tiktoken_s"]
            floor = f"{_ms(ref)} tiktoken (lamina {_x(_ratio(mine, ref))})"
        else:
            floor = f"{_ms(p['floor']['p50_s'])} (lamina {_x(_ratio(mine, p['floor']['p50_s']))})"
        naive = f"{_ms(p['naive']['p50_s'])} ({_x(_ratio(p['naive']['p50_s'], mine))})"
        peers = [_peer_cell(p["peers"].get(name, {}), mine) for name in PEERS]
        kind = "cold" if p["kind"] == "cold" else "warm p50"
        comp.add_row(p["name"], f"{_ms(mine)} {kind}", floor, naive, *peers)
    console.print(comp)
    if doc.get("requests"):
        _request_table(doc["requests"], console)
    if doc.get("memory"):
        _memory_table(doc["memory"], console)
    targets = Table(title="targets")
    for col in ("target", "where", "measured", "bound", "met"):
        targets.add_column(col)
    for t in doc["targets"]:
        met = "n/a" if t["met"] is None else ("yes" if t["met"] else "NO")
        if not t["at_target_scale"]:
            met += " (below target scale)"
        measured = _x(t["measured"]) if t.get("unit") != "share" else _pct(t["measured"])
        targets.add_row(t["target"], t["where"], measured, t["bound"], met)
    console.print(targets)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _memory_table(memory: dict[str, Any], console: Console) -> None:
    """The memory point: answer-bearing messages reached, cached shares and CPU times."""
    if "skipped" in memory:
        console.print(f"memory: skipped ({memory['skipped']})")
        return
    title = (
        f"memory: {memory['data']}: {memory['messages']} messages, {memory['tokens']:,} "
        f"tokens, {memory['questions']} questions; recall {'on' if memory.get('recall') else 'off'}"
    )
    table = Table(title=title)
    columns = ("window", "reached: recall", "off", "trim_messages", "bm25", "whole room",
               "cached: on", "off", "turn cpu p50: on", "off", "restore cpu p50: on",
               "off")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="right")
    for w in memory["windows"]:
        table.add_row(
            f"{w['window']:,}",
            _pct(w["reached_on"]),
            _pct(w["reached_off"]),
            _pct(w["trim_messages"]),
            _pct(w["bm25"]),
            _pct(w.get("whole_room")),
            _pct(w.get("cached_share_on")),
            _pct(w.get("cached_share_off")),
            _ms(w["warm_cpu_p50_on_s"]),
            _ms(w["warm_cpu_p50_off_s"]),
            _ms(w["restore_cpu_p50_on_s"]),
            _ms(w["restore_cpu_p50_off_s"]),
        )
    console.print(table)


def _request_table(requests: Sequence[dict[str, Any]], console: Console) -> None:
    """Stateless requests and the single-call task beside the peers (x: their time / ours)."""
    table = Table(
        title="requests: stateless (load + turn + save, SQLite) and the peers' single-call task"
    )
    for col in ("point", "lamina", "tokens", *PEERS):
        table.add_column(col, justify="left" if col == "point" else "right")
    for r in requests:
        lam = r["lamina"]
        if r["kind"] == "peers-task":
            mine = lam["restored_p50_s"]
            cell = f"{_ms(mine)} restored, {_ms(lam['warm_p50_s'])} warm"
        else:
            mine = lam["p50_s"]
            cell = f"{_ms(mine)} per request"
            if lam.get("first_p50_s") is not None:
                cell += f" ({_ms(lam['first_p50_s'])} first)"
        peers = [_peer_cell(r["peers"].get(name, {}), mine) for name in PEERS]
        table.add_row(r["name"], cell, f"{lam['request_tokens']:,}", *peers)
    console.print(table)


def main(scale: str = "small", out: str | None = None) -> int:
    """``lamina bench``: run, print the tables, write the JSON; returns the exit status."""
    if scale not in SCALES:
        from lamina.pipeline.errors import ConfigError

        raise ConfigError("--scale", f"unknown scale {scale!r} (known: {', '.join(SCALES)})")
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    doc = run_benchmarks(scale, console)
    format_tables(doc, console)
    if out is not None:
        from lamina._files import write_atomic  # whole or not at all

        write_atomic(out, json.dumps(doc, indent=2) + "\n")
        console.print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(*(sys.argv[1:3])))
