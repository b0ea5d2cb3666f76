"""A cold build's memory as ``lamina bench`` measures it: the tracemalloc peak of one turn
and its promotion, over the request's UTF-8 bytes."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from benchmarks.run import ROOMY_WINDOW, SEED, SYSTEM
from benchmarks.stateless import forget_process_memos
from benchmarks.workload import cold_workload, write_vault
from lamina import Conversation
from lamina.pipeline import Budget
from lamina.renderers import openai_messages


def test_a_cold_build_holds_its_payload_about_three_times_at_most(tmp_path: Path) -> None:
    """The notes as read, their blocks and the joined user message are three copies; the
    graph, the views and the parsed links come on top (200 KB of notes: 3.34x). A
    conversation with a cache meter (the host facade's) keeps the turn's envelope as built
    for the next turn's ``env.cache`` (the prefix it repeats), so its blocks outlive the
    returned copy through the promotion: 3.99x. A fifth copy of the payload, held anywhere
    through the turn or its promotion, shows here."""
    workload = cold_workload(SEED, 200_000)
    write_vault(workload, tmp_path)
    turn = workload.turns[0]
    attach = [{"note": p} for p in turn.attach]

    def build() -> Conversation:
        return Conversation(
            SYSTEM,
            vault=tmp_path,
            budget=Budget(context_window=ROOMY_WINDOW, reserve_output=32_768),
        )

    first = build()  # imports, regexes and tokenizer tables made outside the window
    env = first.turn(turn.query, attach=attach)
    payload = sum(len(m["content"].encode("utf-8")) for m in openai_messages(env))
    _ = first.library
    forget_process_memos()
    fresh = build()
    tracemalloc.start()
    try:
        fresh.turn(turn.query, attach=attach)
        _ = fresh.library
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4.4 * payload, peak / payload
