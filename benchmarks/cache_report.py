"""The cache report's cost per warm turn: ``prefix_report`` against the reference (both
requests rendered, counted and serialized whole, as it was computed before), measured in
the same run, turn by turn, and the in-process hub's turn (``ConversationHub.turn``: build,
save, trace turn with the cache report) with either inside.

Workloads: the server suite's conversation (20 turns, a library that grows every turn) and
examples/chat30.yaml through ``lamina.Conversation`` (no budget, and a 6,000-token
window). The two computations alternate which goes first on each turn, so neither always
finds the counter's memo warmed by the other. Nothing here asserts a time: ratios only.

    python -m benchmarks.cache_report [--rounds N] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lamina.pipeline import Budget, Envelope
from lamina.pipeline.tokens import TokenCounter
from lamina.renderers import (
    PrefixReport,
    classify_break,
    prefix_report,
    prompt_prefix_tokens,
    trace_turn,
)
from lamina.renderers._cache import _common_prefix_bytes
from lamina.renderers._layouts import default_prompt
from lamina.renderers._openai import chatml, openai_messages

__all__ = ["main", "reference_report", "run_cache_report_bench"]

ROOT = Path(__file__).resolve().parents[1]
CHAT30 = ROOT / "examples" / "chat30.yaml"
SYSTEM = "You are the project assistant. Answer from the attached context and cite note paths."

Report = Callable[..., PrefixReport]


def reference_report(
    previous: Envelope | None,
    current: Envelope,
    counter: TokenCounter,
    *,
    budget: Budget | None = None,
) -> PrefixReport:
    """``prefix_report`` as it was computed before: both requests rendered, counted and
    serialized whole (the reference its figures are tested against)."""
    tokens = same = 0
    if previous is not None:
        tokens = prompt_prefix_tokens(
            default_prompt(previous), default_prompt(current), counter, budget
        )
        a, b = chatml(openai_messages(previous)), chatml(openai_messages(current))
        same = _common_prefix_bytes(a, b)
    return PrefixReport(
        turn=current.turn,
        l1_hash=current.l1.hash,
        l2_hash=current.l2.hash,
        common_prefix_tokens=tokens,
        common_prefix_bytes=same,
        reasons=classify_break(previous, current),
    )


def _ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 3)


def _report_times(
    turns: Iterator[tuple[Envelope | None, Envelope, TokenCounter]],
) -> dict[str, Any]:
    """Per warm turn (from the second): both reports' time, after the trace turn (as the
    hub runs them), first one then the other, alternating."""
    fast: list[float] = []
    slow: list[float] = []
    for i, (previous, env, counter) in enumerate(turns):
        trace_turn(env, counter)
        order: list[tuple[Report, list[float]]] = [
            (prefix_report, fast),
            (reference_report, slow),
        ]
        got = []
        for report, times in order if i % 2 else order[::-1]:
            started = time.perf_counter()
            got.append(report(previous, env, counter))
            times.append(time.perf_counter() - started)
        assert got[0] == got[1], f"turn {env.turn}: the figures differ"
    ratio = [f / s for f, s in zip(fast, slow, strict=True)]
    return {
        "turns": len(fast),
        "prefix_report_p50_ms": _ms(fast),
        "reference_p50_ms": _ms(slow),
        "ratio_p50": round(statistics.median(ratio), 3),
        "prefix_report_mean_ms": round(statistics.fmean(fast) * 1000, 3),
        "reference_mean_ms": round(statistics.fmean(slow) * 1000, 3),
    }


def _chat30(
    window: int | None, rounds: int
) -> Iterator[tuple[Envelope | None, Envelope, TokenCounter]]:
    from lamina import Conversation, load_script

    script = load_script(CHAT30)
    for _ in range(rounds):
        budget = Budget(context_window=window, reserve_output=1500) if window else None
        conv = Conversation(script.system, vault=script.vault, budget=budget)
        previous: Envelope | None = None
        for turn in script.turns:
            env = conv.turn(turn.user, turn.attach, vault_changes=dict(turn.vault_changes))
            if previous is not None:
                yield previous, env, conv.counter
            previous = env
            if turn.reply is not None:
                conv.reply(turn.reply)


def _server(vault: Path, rounds: int) -> Iterator[tuple[Envelope | None, Envelope, TokenCounter]]:
    from benchmarks.server import SEED
    from benchmarks.workload import conversation_workload
    from lamina import Conversation

    workload = conversation_workload(SEED, 20)
    for _ in range(rounds):
        conv = Conversation(SYSTEM, vault=vault)
        previous: Envelope | None = None
        for t in workload.turns:
            env = conv.turn(t.query, [{"note": p} for p in t.attach])
            if previous is not None:
                yield previous, env, conv.counter
            previous = env
            conv.reply(t.reply)


@contextmanager
def _hub_reporting(report: Report) -> Iterator[None]:
    import lamina._hub as hub

    kept = hub.prefix_report
    hub.prefix_report = report
    try:
        yield
    finally:
        hub.prefix_report = kept


def _hub_times(vault: Path, store: Path, rounds: int) -> dict[str, Any]:
    """``ConversationHub.turn`` per warm turn, the reference and ``prefix_report``
    inside it on alternate conversations of the server workload."""
    from benchmarks.server import SEED
    from benchmarks.workload import conversation_workload
    from lamina import ConversationHub, ServerConfig
    from lamina._api_models import ConversationCreate, HeadIn, ReplyIn, TurnIn

    workload = conversation_workload(SEED, 20)
    hub = ConversationHub(ServerConfig(store=str(store), vault=vault))
    times: dict[str, list[float]] = {"fast": [], "reference": []}
    try:
        for r in range(2 * rounds + 2):
            name = "fast" if r % 2 else "reference"
            with _hub_reporting(prefix_report if name == "fast" else reference_report):
                cid, head = hub.create(ConversationCreate(system=SYSTEM))
                for k, t in enumerate(workload.turns):
                    body = TurnIn(
                        parent=HeadIn(turn=head.turn, hash=head.hash),
                        user=t.query,
                        attach=[{"note": p} for p in t.attach],
                    )
                    started = time.perf_counter()
                    _, head = hub.turn(cid, body)
                    if r >= 2 and k:  # the first two conversations warm up
                        times[name].append(time.perf_counter() - started)
                    reply = ReplyIn(parent=HeadIn(turn=head.turn, hash=head.hash), text=t.reply)
                    head = hub.reply(cid, reply)
    finally:
        hub.close()
    fast, slow = times["fast"], times["reference"]
    return {
        "turns": len(fast),
        "hub_turn_p50_ms": _ms(fast),
        "hub_turn_with_reference_p50_ms": _ms(slow),
        "ratio_p50": round(statistics.median(fast) / statistics.median(slow), 3),
        "hub_turn_mean_ms": round(statistics.fmean(fast) * 1000, 3),
        "hub_turn_with_reference_mean_ms": round(statistics.fmean(slow) * 1000, 3),
    }


def run_cache_report_bench(rounds: int = 3) -> dict[str, Any]:
    """Every point, as a JSON-ready document."""
    from benchmarks.server import SEED
    from benchmarks.workload import conversation_workload, write_vault

    with tempfile.TemporaryDirectory(prefix="lamina-bench-cache-") as tmp:
        vault = Path(tmp) / "vault"
        write_vault(conversation_workload(SEED, 20), vault)
        return {
            "suite": "cache-report",
            "rounds": rounds,
            "report": {
                "server-workload": _report_times(_server(vault, rounds)),
                "chat30": _report_times(_chat30(None, rounds)),
                "chat30-6000": _report_times(_chat30(6000, rounds)),
            },
            "hub": _hub_times(vault, Path(tmp) / "hub.sqlite", rounds),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    doc = run_cache_report_bench(args.rounds)
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
