"""The ``memory`` bench point: does a long chat still reach what was said long ago?

Material: five conversations of LoCoMo (Maharana et al., ACL 2024), read from
``../shared/data/locomo-dev`` beside the repository (or ``$LAMINA_LOCOMO``); never copied
into it. Each is one chat between two people over 19-32 sessions (419-689 messages,
12.5k-19k tokens) with questions annotated with the messages that answer them
(``evidence``, dia_ids such as ``D3:1``). The point is skipped, saying why, without it.

Protocol, per conversation and window (4k, 8k, 16k; reserve by the CLI's rule,
``min(4096, window / 4)``):

1. The sessions are replayed in order as turns. Every message is written
   ``"<speaker>: <text>"`` (a shared photo adds ``" [shares a photo: <caption>]"``). A
   message opens a turn (it is the query) unless the open turn has no reply yet and was
   opened by the other speaker, in which case it is that turn's reply; so the two people
   take the user's and the assistant's seats as the chat goes, and a message that follows
   one by the same speaker opens a turn of its own.
2. After the last session, each question whose evidence is in the chat is asked once,
   on its own: the conversation is restored from its state (``Conversation.restore``)
   and the question is its next turn. A question's evidence message *reaches the model*
   when its written text is in the request as sent (``Envelope.as_sent``: system message,
   history messages, user message). The share is evidence reached / evidence asked over
   all questions of the five conversations (categories 1-5).
3. Methods, all in the same run: (a) Lamina with the default budget
   (``Budget(context_window, reserve_output)``, nothing else set); (b) recall off
   (``recall=False``), the budget's own history cut; (c) keeping the newest messages:
   langchain-core's ``trim_messages(strategy="last")`` over the same messages (system
   message kept), token-counted with the same counter and OpenAI's framing (3 tokens a
   message, 3 to prime) against the same limit; (d) a plain Okapi BM25 (k1 1.5, b 0.75,
   lowercased words, no stemming or stop words) over single messages, the best first
   while they fit, given the same room: the limit less the request without any history
   (system message and question, framed), each message costing its tokens and 3; (e) a
   reference for the targets, not a method: Lamina's own retriever (BM25 over stemmed
   words) given that same whole room, each match best first with the message before and
   after it (what recall could reach were the suffix given up at every question).
4. The cached-prefix share of each conversation's replay (``lamina.renderers.simulate``,
   OpenAI's prefix rule, default layout), default budget and recall off; summed over the
   five conversations (cached tokens / input tokens).
5. Times: the replay's turn CPU p50 (thread time, turns after the first session) and a
   restore+turn's CPU p50 (every fifth question), default budget and recall off, run in
   lockstep so a busy machine slows both alike.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.targets import target

__all__ = [
    "CONVERSATIONS",
    "MEMORY_TARGETS",
    "WINDOWS",
    "LocomoChat",
    "LocomoQuestion",
    "LocomoTurn",
    "locomo_chat",
    "locomo_dir",
    "measure_memory",
    "memory_targets",
]

WINDOWS = (4_096, 8_192, 16_384)
CONVERSATIONS = ("26", "41", "43", "47", "49")
MEMORY_TARGETS = {
    "reached_4k": 0.60,
    "reached_8k": 0.85,
    "reached_16k": 0.95,
    "restore_on_vs_off": 2.0,
}
SYSTEM = (
    "You are one of the two people in this long chat. Answer from what was said in it; "
    "earlier messages brought back for the question are marked as such."
)
TIMED_EVERY = 5
"""Every this many questions a restore+turn is timed (on and off)."""
_FRAMING = 3
"""OpenAI's tokens per message (and to prime a request)."""


def locomo_dir() -> Path | None:
    """Where the LoCoMo conversations are (``$LAMINA_LOCOMO``, else
    ``../shared/data/locomo-dev`` beside the repository), or None if not there."""
    given = os.environ.get("LAMINA_LOCOMO")
    root = Path(__file__).resolve().parents[1]
    where = Path(given) if given else root.parent / "shared" / "data" / "locomo-dev"
    return where if all((where / f"{c}.json").is_file() for c in CONVERSATIONS) else None


@dataclass(frozen=True)
class LocomoTurn:
    """One turn of the replay: the query message and the reply (None: the next message
    was by the same speaker), each as ``(dia_id, text as written)``."""

    user: tuple[str, str]
    reply: tuple[str, str] | None


@dataclass(frozen=True)
class LocomoQuestion:
    question: str
    evidence: tuple[str, ...]
    category: int


@dataclass(frozen=True)
class LocomoChat:
    name: str
    turns: tuple[LocomoTurn, ...]
    questions: tuple[LocomoQuestion, ...]
    sessions: tuple[int, ...] = field(default=())
    """The 1-based turn number each session starts at."""

    @property
    def texts(self) -> dict[str, str]:
        """Every message's written text by dia_id."""
        out: dict[str, str] = {}
        for turn in self.turns:
            for message in (turn.user, turn.reply):
                if message is not None:
                    out[message[0]] = message[1]
        return out


def _written(message: dict[str, Any]) -> str:
    text = f"{message['speaker']}: {message['text']}"
    caption = message.get("blip_caption")
    return f"{text} [shares a photo: {caption}]" if caption else text


def locomo_chat(path: Path) -> LocomoChat:
    """One LoCoMo conversation file as the replay's turns and its questions (evidence
    limited to dia_ids of the chat; questions without any are left out)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    numbers = sorted(
        int(k.split("_")[1]) for k in data if re.fullmatch(r"session_\d+", k) and data[k]
    )
    turns: list[LocomoTurn] = []
    starts: list[int] = []
    opener = ""
    for number in numbers:
        starts.append(len(turns) + 1)
        for message in data[f"session_{number}"]:
            written = (str(message["dia_id"]), _written(message))
            last = turns[-1] if turns else None
            if last is not None and last.reply is None and message["speaker"] != opener:
                turns[-1] = LocomoTurn(last.user, written)
            else:
                turns.append(LocomoTurn(written, None))
                opener = message["speaker"]
    known = {m[0] for t in turns for m in (t.user, t.reply) if m is not None}
    questions = []
    for qa in data["qa"]:
        evidence = tuple(dict.fromkeys(e for e in qa.get("evidence", ()) if e in known))
        if evidence:
            questions.append(LocomoQuestion(str(qa["question"]), evidence, int(qa["category"])))
    return LocomoChat(path.stem, tuple(turns), tuple(questions), tuple(starts))


def _reserve(window: int) -> int:
    """The CLI's rule: min(4096, window / 4)."""
    return min(4096, window // 4)


def _budgets(window: int) -> tuple[Any, Any]:
    """The default budget for ``window`` (recall on) and the same with recall off."""
    import attrs

    from lamina.pipeline import Budget

    on = Budget(context_window=window, reserve_output=_reserve(window))
    return on, attrs.evolve(on, recall=False)


def _request_text(env: Any) -> str:
    sent = env.as_sent()
    return "\n".join((sent.system_text, *(s.text for s in sent.l4.segments), sent.user_text))


@dataclass
class _Run:
    reached: int = 0
    asked: int = 0
    turn_cpu: list[float] = field(default_factory=list)
    restore_cpu: list[float] = field(default_factory=list)
    cached: int = 0
    input: int = 0


def _replay(
    chat: LocomoChat,
    budgets: Sequence[Any],
    runs: Sequence[_Run],
    cache: bool,
    retriever: Callable[[], Any] | None = None,
) -> list[Any]:
    """The chat through one conversation per budget in lockstep (each turn on every
    conversation before the next); the conversations at the end. Each turn is timed
    alone (this thread's CPU time); its promotion is made after the timing."""
    from lamina.pipeline import Conversation
    from lamina.renderers import XmlRenderer, simulate

    convs = [
        Conversation(SYSTEM, renderer=XmlRenderer(), budget=b, retriever=retriever)
        for b in budgets
    ]
    envelopes: list[list[Any]] = [[] for _ in budgets]
    warm = chat.sessions[1] if len(chat.sessions) > 1 else 1
    for number, turn in enumerate(chat.turns, 1):
        for conv, run, kept in zip(convs, runs, envelopes, strict=True):
            cpu = time.thread_time()
            env = conv.turn(turn.user[1], background=False)
            if number >= warm:
                run.turn_cpu.append(time.thread_time() - cpu)
            conv.library  # noqa: B018 - the promotion, made outside the timing
            if cache:
                kept.append(env)
            if turn.reply is not None:
                conv.reply(turn.reply[1])
    if cache:
        for run, kept in zip(runs, envelopes, strict=True):
            sim = simulate(kept, providers=("openai",), layouts=("default",))
            series = sim.get("default", "openai")
            run.cached += sum(t.cached_tokens for t in series.turns)
            run.input += sum(t.input_tokens for t in series.turns)
    return convs


def _ask(
    chat: LocomoChat,
    convs: Sequence[Any],
    runs: Sequence[_Run],
    every: int,
    retriever: Callable[[], Any] | None = None,
) -> None:
    """Each question as the next turn of the conversation restored from its state."""
    from lamina.pipeline import Conversation
    from lamina.renderers import XmlRenderer

    texts = chat.texts
    states = [conv.state for conv in convs]
    for i, question in enumerate(chat.questions):
        for state, run in zip(states, runs, strict=True):
            cpu = time.thread_time()
            env = Conversation.restore(state, renderer=XmlRenderer(), retriever=retriever).turn(
                question.question, background=False
            )
            if i % every == 0:
                run.restore_cpu.append(time.thread_time() - cpu)
            sent = _request_text(env)
            run.asked += len(question.evidence)
            run.reached += sum(texts[e] in sent for e in question.evidence)


def _messages(chat: LocomoChat) -> list[tuple[str, str, bool]]:
    """The chat's messages as (dia_id, text, is the user's seat), in order."""
    out: list[tuple[str, str, bool]] = []
    for turn in chat.turns:
        out.append((*turn.user, True))
        if turn.reply is not None:
            out.append((*turn.reply, False))
    return out


def _trim_reached(chat: LocomoChat, limit: int, count: Callable[[str], int]) -> tuple[int, int]:
    """Evidence kept by ``trim_messages(strategy="last")`` at ``limit`` (reached, asked)."""
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        HumanMessage,
        SystemMessage,
        trim_messages,
    )

    def tokens(messages: list[BaseMessage]) -> int:
        return _FRAMING + sum(_FRAMING + count(str(m.content)) for m in messages)

    history: list[BaseMessage] = [SystemMessage(SYSTEM)]
    for dia, text, user in _messages(chat):
        kind = HumanMessage if user else AIMessage
        history.append(kind(text, id=dia))
    reached = asked = 0
    for question in chat.questions:
        messages = [*history, HumanMessage(question.question, id="question")]
        kept = trim_messages(
            messages, max_tokens=limit, token_counter=tokens, strategy="last",
            include_system=True, start_on="human",
        )  # fmt: skip
        ids = {m.id for m in kept}
        asked += len(question.evidence)
        reached += sum(e in ids for e in question.evidence)
    return reached, asked


_WORD = re.compile(r"\w+")


class _PlainBm25:
    """Okapi BM25 (k1 1.5, b 0.75, idf log(1 + (n - df + 0.5) / (df + 0.5))) over
    lowercased words: the comparator, written out so it owes nothing to Lamina's."""

    def __init__(self, docs: Sequence[str]) -> None:
        self.terms = [_WORD.findall(d.lower()) for d in docs]
        self.average = statistics.fmean(len(t) for t in self.terms) if docs else 0.0
        self.df: dict[str, int] = {}
        for words in self.terms:
            for word in set(words):
                self.df[word] = self.df.get(word, 0) + 1
        self.tf = [_counts(words) for words in self.terms]

    def ranked(self, query: str) -> list[int]:
        n = len(self.terms)
        words = set(_WORD.findall(query.lower()))
        scores: list[tuple[float, int]] = []
        for i, tf in enumerate(self.tf):
            norm = 1.5 * (0.25 + 0.75 * len(self.terms[i]) / self.average)
            score = 0.0
            for word in words & tf.keys():
                df = self.df[word]
                idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
                score += idf * tf[word] * 2.5 / (tf[word] + norm)
            if score > 0:
                scores.append((-score, i))
        return [i for _, i in sorted(scores)]


def _counts(words: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for word in words:
        out[word] = out.get(word, 0) + 1
    return out


def _bm25_reached(chat: LocomoChat, limit: int, count: Callable[[str], int]) -> tuple[int, int]:
    """Evidence a plain BM25 over single messages sends in the room the limit leaves
    beside the system message and the question (reached, asked)."""
    messages = _messages(chat)
    index = _PlainBm25([text for _, text, _ in messages])
    return _filled(chat, messages, limit, count, index.ranked, around=0)


def _whole_room_reached(
    chat: LocomoChat, limit: int, count: Callable[[str], int]
) -> tuple[int, int]:
    """Evidence Lamina's retriever (``Bm25Retriever``: BM25 over stemmed words) sends when
    the question is given the whole room plain BM25 gets: its matches best first, each
    with the message before and after it, while they fit (reached, asked). What recall
    could reach with this retriever were the suffix given up at every question: a
    reference for the targets, not a method (a chat turn would send it all uncached)."""
    from lamina.pipeline.recall import Bm25Retriever, RecallItem

    messages = _messages(chat)
    index = Bm25Retriever()
    index.index([RecallItem(dia, i, text) for i, (dia, text, _) in enumerate(messages)])
    place = {dia: i for i, (dia, _, _) in enumerate(messages)}

    def ranked(query: str) -> list[int]:
        return [place[dia] for dia, score in index.search(query, len(messages)) if score > 0]

    return _filled(chat, messages, limit, count, ranked, around=1)


def _filled(
    chat: LocomoChat,
    messages: Sequence[tuple[str, str, bool]],
    limit: int,
    count: Callable[[str], int],
    ranked: Callable[[str], list[int]],
    *,
    around: int,
) -> tuple[int, int]:
    """Evidence sent when each question's room (the limit less the system message and the
    question, framed) takes the messages ``ranked`` gives, best first, each with ``around``
    messages either side, while they fit (each costing its tokens and 3): (reached,
    asked)."""
    costs = [count(text) + _FRAMING for _, text, _ in messages]
    bare = _FRAMING + 2 * _FRAMING + count(SYSTEM)
    reached = asked = 0
    for question in chat.questions:
        room = limit - bare - count(question.question)
        sent: set[int] = set()
        for at in ranked(question.question):
            for i in range(max(0, at - around), min(len(messages), at + around + 1)):
                if i not in sent and costs[i] <= room:
                    room -= costs[i]
                    sent.add(i)
        ids = {messages[i][0] for i in sent}
        asked += len(question.evidence)
        reached += sum(e in ids for e in question.evidence)
    return reached, asked


def _p50(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _named(retriever: Callable[[], Any] | None) -> str:
    """How the document names the retriever: "default" (BM25), or the factory's place."""
    if retriever is None:
        return "default"
    module, name = getattr(retriever, "__module__", None), getattr(retriever, "__qualname__", None)
    return f"{module}:{name}" if module and name else repr(retriever)


def measure_memory(
    seed: int = 0,
    windows: Sequence[int] = WINDOWS,
    *,
    conversations: Sequence[str] = CONVERSATIONS,
    questions: int | None = None,
    cache: bool = True,
    advance: Callable[[], None] = lambda: None,
    retriever: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """The ``memory`` point on LoCoMo (the protocol above; the data is fixed, ``seed`` is
    not used): per window, the share of evidence reached by the default budget, recall
    off, ``trim_messages``, plain BM25 and the retriever given the whole room, cached
    shares, CPU p50s. ``questions`` keeps the first that many of each conversation (None:
    all); ``retriever`` makes the recall-on conversations' ``Retriever`` (None: BM25, the
    default); ``{"skipped": why}`` without data."""
    del seed
    where = locomo_dir()
    if where is None:
        return {"skipped": "LoCoMo not found at ../shared/data/locomo-dev (or $LAMINA_LOCOMO)"}
    from lamina.pipeline.tokens import TokenCounter

    chats = [locomo_chat(where / f"{name}.json") for name in conversations]
    if questions is not None:
        chats = [
            LocomoChat(c.name, c.turns, c.questions[:questions], c.sessions) for c in chats
        ]
    counter = TokenCounter()
    out: dict[str, Any] = {
        "data": "LoCoMo " + ", ".join(conversations),
        "messages": sum(len(_messages(c)) for c in chats),
        "tokens": sum(counter.count(t) for c in chats for _, t, _ in _messages(c)),
        "questions": sum(len(c.questions) for c in chats),
        "recall": bool(_budgets(windows[0])[0].recall) if windows else True,
        "retriever": _named(retriever),
        "windows": [],
    }
    for window in windows:
        limit = window - _reserve(window)
        on, off = _Run(), _Run()
        trim = bm25 = whole = (0, 0)
        for chat in chats:
            convs = _replay(chat, _budgets(window), (on, off), cache, retriever)
            _ask(chat, convs, (on, off), TIMED_EVERY, retriever)
            t = _trim_reached(chat, limit, counter.count)
            b = _bm25_reached(chat, limit, counter.count)
            w = _whole_room_reached(chat, limit, counter.count)
            trim, bm25 = (trim[0] + t[0], trim[1] + t[1]), (bm25[0] + b[0], bm25[1] + b[1])
            whole = (whole[0] + w[0], whole[1] + w[1])
        advance()
        row: dict[str, Any] = {
            "window": window,
            "limit": limit,
            "reached_on": _share(on.reached, on.asked),
            "reached_off": _share(off.reached, off.asked),
            "trim_messages": _share(*trim),
            "bm25": _share(*bm25),
            "whole_room": _share(*whole),
            "warm_cpu_p50_on_s": _p50(on.turn_cpu),
            "warm_cpu_p50_off_s": _p50(off.turn_cpu),
            "restore_cpu_p50_on_s": _p50(on.restore_cpu),
            "restore_cpu_p50_off_s": _p50(off.restore_cpu),
        }
        if cache:
            row["cached_share_on"] = _share(on.cached, on.input)
            row["cached_share_off"] = _share(off.cached, off.input)
        out["windows"].append(row)
    return out


def memory_targets(memory: dict[str, Any]) -> list[dict[str, Any]]:
    """The memory point's targets in ``lamina bench``'s shape: the share reached per
    window, the cached-prefix share not lower with recall, a restore+turn within 2x."""
    out: list[dict[str, Any]] = []
    bound = {
        4_096: MEMORY_TARGETS["reached_4k"],
        8_192: MEMORY_TARGETS["reached_8k"],
        16_384: MEMORY_TARGETS["reached_16k"],
    }
    for w in memory.get("windows", ()):
        where = f"memory (LoCoMo), {w['window']:,} window"
        if w["window"] in bound:
            out.append(target("answer-bearing messages reached", where, w["reached_on"],
                               ">=", bound[w["window"]], unit="share"))  # fmt: skip
        if w.get("cached_share_on") is not None and w.get("cached_share_off") is not None:
            gain = w["cached_share_on"] - w["cached_share_off"]
            out.append(target("cached-prefix share not lower with recall", where, gain,
                               ">=", 0.0, unit="share"))  # fmt: skip
        # The turn's own CPU time: on a shared machine the wall clock mostly measures the
        # scheduler.
        off, on = w["restore_cpu_p50_off_s"], w["restore_cpu_p50_on_s"]
        ratio = on / off if off else None
        out.append(target("restore+turn (CPU) with recall within 2x of without", where, ratio,
                           "<=", MEMORY_TARGETS["restore_on_vs_off"], unit=""))  # fmt: skip
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.memory [WINDOW ...] [--conversations 26,41,43]
    [--questions N] [--retriever MODULE:NAME]``: the point as JSON, over the conversations
    named (the docs report 26, 41, 43, which the passages' value and floor were chosen on,
    apart from the held-out 47 and 49), with a host's retriever if one is named."""
    import argparse

    parser = argparse.ArgumentParser(prog="benchmarks.memory")
    parser.add_argument("windows", nargs="*", type=int)
    parser.add_argument("--conversations", default=",".join(CONVERSATIONS))
    parser.add_argument(
        "--retriever",
        metavar="MODULE:NAME",
        help="a host's Retriever factory (e.g. embeddings) in place of the default BM25",
    )
    parser.add_argument(
        "--questions", type=int, metavar="N", help="the first N questions of each conversation"
    )
    args = parser.parse_args(argv)
    names = tuple(name for name in args.conversations.split(",") if name)
    unknown = sorted(set(names) - set(CONVERSATIONS))
    if unknown or not names:
        parser.error(f"--conversations: {', '.join(unknown) or 'none'} not among "
                     f"{', '.join(CONVERSATIONS)}")  # fmt: skip
    if args.questions is not None and args.questions < 1:
        parser.error(f"--questions: {args.questions} is not a count of questions (at least 1)")
    windows = tuple(args.windows) or WINDOWS
    retriever = None
    if args.retriever:
        module, _, name = args.retriever.partition(":")
        if not module or not name:
            parser.error(f"--retriever: {args.retriever!r} is not MODULE:NAME")
        import importlib

        try:
            retriever = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            parser.error(f"--retriever: {args.retriever!r}: {exc}")
    doc = measure_memory(
        0, windows, conversations=names, questions=args.questions, retriever=retriever
    )
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
