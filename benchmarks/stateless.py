"""Request points: a stateless server's request and the single-call fit peers perform.

- ``stateless``: per request, load the conversation from a SQLite store, build the turn and
  save it (``lamina.stateless_turn``). Every other request first empties the process's
  count memos and summary pool: those are a server's first request for the conversation
  ("first"), the rest find the counts earlier requests left ("p50"). Each request continues
  its own copy of the same
  stored conversation, so every request starts from the same state: the chat task (10
  turns, then five 5 KB notes and a question fitted into 4,000 tokens) and a library point
  (the library in L2, then a turn adding a new 10 KB note).
- ``peers-task``: the chat task as one call: ``Conversation.restore`` of the in-memory
  state + the turn ("restored"), and the same turn as the warm next turn of conversations
  that built the 10 turns in this process ("warm").

Peers get the same task (system + history + documents + question into the window); the
runner measures them in the same run.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.comparators import PeerTask
from benchmarks.workload import Turn, Workload, library_workload, make_note, write_vault

__all__ = [
    "RequestPoint",
    "chat_workload",
    "forget_process_memos",
    "measure_requests",
    "peer_task",
    "request_points",
]

CHAT_TURNS = 10
DOCS = 5
DOC_BYTES = 5_000
CHAT_LIMIT = 4_000
CHAT_RESERVE = 1_000


@dataclass
class RequestPoint:
    """One request point: what Lamina measured and the peers' times on the same task."""

    kind: str  # "stateless" | "peers-task"
    name: str
    workload: Workload
    lamina: dict[str, Any] = field(default_factory=dict)
    peers: dict[str, dict[str, Any]] = field(default_factory=dict)
    tasks: list[PeerTask] = field(default_factory=list)

    @property
    def mine(self) -> float | None:
        """The Lamina time the peers are compared with (per request / per call)."""
        value = self.lamina.get("p50_s", self.lamina.get("restored_p50_s"))
        return None if value is None else float(value)


def chat_workload(seed: int) -> Workload:
    """Five 5 KB notes; ``CHAT_TURNS`` plain turns of history, then the question that
    attaches the notes (the last turn)."""
    rng = random.Random(f"{seed}:chat-task")
    notes = {f"docs/doc-{i}.md": make_note(rng, DOC_BYTES, f"Document {i}") for i in range(DOCS)}
    turns = []
    for i in range(CHAT_TURNS):
        reply = " ".join(make_note(rng, 600, "r").split("\n\n")[1:2]) or "Noted."
        turns.append(Turn(f"Question {i + 1} about the sync design?", (), (), reply))
    ask = Turn("What do the attached documents say about retries?", tuple(notes), (), "")
    return Workload("chat-10", notes, (), (*turns, ask))


def peer_task(conv: Any, notes: dict[str, str], attach: Sequence[str], query: str) -> PeerTask:
    """The turn as peers see it: L2 texts, history and attachments, oldest first."""
    system = conv.system
    parts: list[tuple[str, str]] = [("user", e.text) for e in conv.library]
    for h in conv.history:
        parts.append(("user", h.user))
        if h.assistant is not None:
            parts.append(("assistant", h.assistant))
    parts.extend(("user", notes[p]) for p in attach)
    text = "\n\n".join(t for t in (system.stable, system.mutable) if t)
    limit = conv.budget.limit if conv.budget is not None else 10**9
    return PeerTask(text, tuple(parts), query, limit)


def _specs(paths: Sequence[str]) -> list[dict[str, str]]:
    return [{"note": p} for p in paths]


def _chat_budget() -> Any:
    from lamina.pipeline import Budget

    return Budget(context_window=CHAT_LIMIT + CHAT_RESERVE, reserve_output=CHAT_RESERVE)


def _history(conv: Any, turns: Sequence[Turn]) -> None:
    for turn in turns:
        conv.turn(turn.query, attach=_specs(turn.attach))
        conv.reply(turn.reply)


def _copies(store: Any, template: Any, ids: Sequence[str], turns: Sequence[Turn]) -> None:
    """Save ``turns`` (built once in ``template``) under every id: identical stored chats."""
    from lamina.pipeline.store import ConversationInfo, Head, save_turn

    heads = {}
    for cid in ids:
        store.create(ConversationInfo(cid))
        heads[cid] = Head()
    for turn in turns:
        template.turn(turn.query, attach=_specs(turn.attach))
        template.reply(turn.reply)
        for cid in ids:
            save_turn(store, cid, template, attach=_specs(turn.attach), parent=heads[cid])
            heads[cid] = template.saved_head


def _stateless(
    point: RequestPoint,
    vault: Path,
    system: str,
    budget: Callable[[], Any],
    setup: Sequence[Turn],
    ask: Turn,
    requests: int,
    advance: Callable[[], None],
) -> None:
    """Per request: ``stateless_turn`` on its own copy of the stored conversation."""
    from lamina import Conversation, stateless_turn
    from lamina.pipeline.store import SqliteStore

    warmup = 2
    ids = [f"c{i}" for i in range(requests + warmup)]
    with tempfile.TemporaryDirectory(prefix="lamina-stateless-") as tmp:
        store = SqliteStore(Path(tmp) / "store.db")
        try:
            template = Conversation(system, vault=vault, budget=budget())
            _copies(store, template, ids, setup)
            point.tasks = [peer_task(template, point.workload.notes, ask.attach, ask.query)]
            times: list[float] = []
            first: list[float] = []
            tokens = 0
            for i, cid in enumerate(ids):
                cold = i >= warmup and i % 2 == 1
                if cold:  # a first request in this process: nothing counted or summarized yet
                    forget_process_memos()
                start = time.perf_counter()
                conv, env = stateless_turn(
                    store, cid, ask.query, _specs(ask.attach), vault=vault
                )
                if i >= warmup:
                    (first if cold else times).append(time.perf_counter() - start)
                    advance()
                tokens = conv.count_request(env)
            point.lamina = {
                "p50_s": statistics.median(times),
                "first_p50_s": statistics.median(first) if first else None,
                "requests": len(times) + len(first),
                "request_tokens": tokens,
                "history_turns": len(setup),
            }
        finally:
            store.close()


def forget_process_memos() -> None:
    """Empty the process's count memos, view memo and summary pool (what earlier requests
    left)."""
    from lamina.pipeline._tokens.counter import shared_counts
    from lamina.pipeline.tokens import TOKENIZERS
    from lamina.pipeline.views import shared_views, summary_pool

    summary_pool().clear()
    shared_views().clear()
    for name in TOKENIZERS:
        shared_counts(name).clear()


def _peers_task(
    point: RequestPoint, vault: Path, requests: int, advance: Callable[[], None]
) -> None:
    """The chat task as one call: restored from a state in memory, and as a warm turn."""
    from lamina import Conversation

    *setup, ask = point.workload.turns
    template = Conversation(_SYSTEM, vault=vault, budget=_chat_budget())
    _history(template, setup)
    state = template.state
    point.tasks = [peer_task(template, point.workload.notes, ask.attach, ask.query)]
    restored: list[float] = []
    forget_process_memos()
    for i in range(requests + 1):
        start = time.perf_counter()
        conv = Conversation.restore(state, vault=vault)
        env = conv.turn(ask.query, attach=_specs(ask.attach))
        if i:
            restored.append(time.perf_counter() - start)
            advance()
    warm: list[float] = []
    for _ in range(requests):
        conv = Conversation(_SYSTEM, vault=vault, budget=_chat_budget())
        _history(conv, setup)
        _ = conv.library  # the last reply's promotion is done while the model answers
        start = time.perf_counter()
        env = conv.turn(ask.query, attach=_specs(ask.attach))
        warm.append(time.perf_counter() - start)
        advance()
    point.lamina = {
        "restored_p50_s": statistics.median(restored),
        "warm_p50_s": statistics.median(warm),
        "calls": len(restored),
        "request_tokens": conv.count_request(env),
        "limit": CHAT_LIMIT,
    }


_SYSTEM = "You are the project assistant. Answer from the attached documents."


def request_points(seed: int, library: int) -> list[RequestPoint]:
    """The request points of one run: stateless chat, stateless library, peers-task."""
    chat = chat_workload(seed)
    lib = library_workload(seed, library, 1)
    return [
        RequestPoint("stateless", "stateless chat-10", chat),
        RequestPoint("stateless", f"stateless library-{library}", lib),
        RequestPoint("peers-task", "peers-task chat-10", chat),
    ]


def measure_requests(
    point: RequestPoint, requests: int, library_budget: Any, advance: Callable[[], None]
) -> None:
    """Measure one request point (its vault written to a temp folder)."""
    with tempfile.TemporaryDirectory(prefix="lamina-requests-") as tmp:
        vault = Path(tmp)
        write_vault(point.workload, vault)
        work = point.workload
        if point.kind == "peers-task":
            _peers_task(point, vault, requests, advance)
        elif work.library:
            setup = [Turn("Load the library notes.", work.library, work.library, "Loaded.")]
            _stateless(
                point, vault, _SYSTEM, lambda: library_budget, setup, work.turns[0], requests,
                advance,
            )  # fmt: skip
        else:
            *setup, ask = work.turns
            _stateless(point, vault, _SYSTEM, _chat_budget, setup, ask, requests, advance)
    point.tasks = point.tasks * requests  # the peers repeat the one task as often
