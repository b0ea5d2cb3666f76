"""Agent loops: one turn's message list grown with native tool calls, fitted to the budget.

The envelope is built once (``[system: L1 + L2] -> [L4] -> [user: L3 + L5]``); each step
appends the assistant's tool-call message and one result per call. A call and its result
are one unit: the budget may shorten or stub a result (the stub keeps the tool name and
arguments, so the model can call it again) but never separates or drops either half.
When the turn ends, L4 keeps the bare query and the final answer only.

Every request of the loop also carries the tool definitions (``tools_tokens``: counted in
the budget like the envelope), and the turn is fitted leaving ``tool_headroom`` tokens
free, so the first calls fit without a cut. Once the loop's own cuts (stub old results,
excerpt the largest) are spent, the turn as fitted is solved again by the budget's
objective within the room the loop needs (``objective.shrink``: library, history, this
turn's items), before it stubs a result the model has not seen yet.

A handoff within the turn to an agent with other instructions (``with_system``) sends
them as L1's mutable part from the next request on, after the same stable part, counted
and fitted like the first agent's, with a ``handoff`` decision (L1) in the report of the
envelope those requests are built from; the turn's own envelope stays as it was built.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import attrs

from lamina.pipeline._budget import engine
from lamina.pipeline._budget.objective import TurnFitting, shrink, turn_fitting
from lamina.pipeline._errors import ConfigError, ConversationError
from lamina.pipeline._model.envelope import (
    BudgetReport,
    BuildReport,
    Decision,
    DecisionAction,
    Envelope,
    Layer,
    LayerName,
)
from lamina.pipeline._model.tools import Hit, Hits, ToolUse, canonical_args, tool_artifact, tool_key
from lamina.pipeline._tokens.counter import TokenCounter
from lamina.pipeline._tokens.profiles import OPENAI_FRAMING, Framing
from lamina.pipeline._turn.assemble import complete, draft, system_layer
from lamina.pipeline._turn.measure import request_tokens
from lamina.pipeline._views.preview import EXCERPT_MIN_TOKENS, cut_to_tokens

if TYPE_CHECKING:
    from lamina.pipeline._conversation.conversation import Conversation
    from lamina.pipeline._model.artifacts import AttachmentSpec
    from lamina.pipeline._turn.budget import Budget
    from lamina.pipeline._turn.graph import SystemPrompt

__all__ = [
    "CALL_OVERHEAD",
    "DEFAULT_TOOL_HEADROOM",
    "QUESTION_AGAIN",
    "AgentCall",
    "AgentStep",
    "AgentTurn",
    "Loop",
    "LoopCall",
    "LoopStep",
    "agent_call",
    "loop_tokens",
    "tool_turn",
]

CALL_OVERHEAD = OPENAI_FRAMING.tool_call
"""The default framing of one native tool call (``Framing.tool_call``; a budget's own
``tool_call_tokens`` is what the loop counts)."""
QUESTION_AGAIN = "---\n[User query, repeated after the tool result]:\n"
DEFAULT_TOOL_HEADROOM = 1024
"""Tokens an agent turn leaves free when it is fitted, for the loop's first calls and
results (at most a quarter of the budget's limit)."""

CallForm = Literal["full", "excerpt", "stub"]


@attrs.frozen
class AgentCall:
    """One tool call the model made and what it returned (``args`` is canonical JSON, the
    call's key; ``sent`` the arguments as the framework serializes them on the wire, where
    that differs: LangChain's ``json.dumps`` with spaces. "" sends ``args``)."""

    name: str
    args: str
    result: str
    id: str = ""
    recoverable: bool = True
    sent: str = ""

    @property
    def key(self) -> str:
        return tool_key(self.name, self.args)


def agent_call(
    name: str,
    args: Mapping[str, Any] | str | None = None,
    result: str = "",
    *,
    id: str = "",
    recoverable: bool = True,
    sent: str = "",
) -> AgentCall:
    """A recorded call: ``agent_call("search", {"q": "sync"}, "...results...")``; ``sent``
    is the arguments' text as the framework sends it, when not Lamina's canonical JSON."""
    tool_artifact(name, args or {}, result)  # validates the name and the arguments
    return AgentCall(name, canonical_args(args or {}), result, id, recoverable, sent)


@attrs.frozen
class AgentStep:
    """One model turn inside the loop: optional text plus its tool calls."""

    calls: tuple[AgentCall, ...]
    text: str = ""


@attrs.frozen
class LoopCall:
    """A call as it is sent: its id, name, args (as the framework sends them) and the
    result content in some form."""

    id: str
    name: str
    args: str
    content: str
    form: CallForm = "full"
    question_repeated: bool = False


@attrs.frozen
class LoopStep:
    """One model turn as sent: its text, its calls, and whether the text goes out as an
    assistant message of its own before the call message (``text_apart``: the Agents SDK
    over Chat Completions) rather than in it: one more message's framing."""

    text: str
    calls: tuple[LoopCall, ...]
    text_apart: bool = False


@attrs.frozen
class Loop:
    """The fitted loop: steps as sent, the budget decisions and the request size."""

    envelope: Envelope
    steps: tuple[LoopStep, ...]
    decisions: tuple[Decision, ...] = ()
    tokens: int = 0
    report: BudgetReport | None = None
    tools: str = ""
    """The tool definitions sent with the request as canonical JSON, when an adapter knows
    them ("" otherwise): they lead every provider's cached prefix, so a call whose tools
    differ from the call before's (a handoff to an agent with other tools) reads nothing
    that call left."""


def _stub(call: AgentCall) -> str:
    return (
        f"[result of {call.name} compacted for lack of room: "
        f"call {call.name} with {call.args} again to see it]"
    )


def _excerpt(text: str, counter: TokenCounter, tokens: int) -> str:
    head = cut_to_tokens(text, counter, tokens, boundary="word")
    return f"{head}\n[... result cut: {len(text) - len(head)} of {len(text)} characters ...]"


@attrs.frozen
class AgentTurn:
    """A turn that runs an agent loop; frozen, ``step`` returns a grown copy.

    >>> agent = AgentTurn.start(conv, "What changed?")
    >>> agent = agent.step(agent_call("search", {"q": "changes"}, "..."))
    >>> body = agent_request(agent, "anthropic").body     # renderers
    >>> agent.finish(conv, "The sync interval changed.")
    """

    envelope: Envelope
    question: str
    counter: TokenCounter = attrs.field(eq=False)
    budget: Budget | None = None
    steps: tuple[AgentStep, ...] = ()
    repeat_after_tokens: int = 1000
    tools_tokens: int = 0
    """What the request's tool definitions add (``lamina.renderers.tool_tokens``): counted in
    every request of the loop."""
    text_apart: bool = False
    """Whether the framework sends a step's text as an assistant message of its own before
    the call message (``LoopStep.text_apart``), as the Agents SDK does over Chat
    Completions: counted so."""
    fitting: TurnFitting | None = attrs.field(default=None, eq=False, repr=False)
    """The turn as its budget fitted it (graph, draft, count): the loop's overflow solves it
    again in less room (``objective.shrink``). None: only tool results are cut."""
    handoff: Envelope | None = attrs.field(default=None, eq=False, repr=False)
    """After a handoff to an agent with other instructions (``with_system``): the envelope
    the loop's requests are built from (L1 holds the new instructions). None: ``envelope``,
    which stays the turn as built (what is saved and replayed)."""

    @classmethod
    def start(
        cls,
        conv: Conversation,
        text: str,
        attach: Iterable[Any] = (),
        *,
        tools: Iterable[ToolUse] = (),
        hits: Iterable[Hit] = (),
        budget: Budget | None = None,
        repeat_after_tokens: int = 1000,
        vault_changes: Mapping[str, str] | None = None,
        tool_headroom: int | None = None,
        tools_tokens: int = 0,
    ) -> AgentTurn:
        """Build the turn's envelope; ``budget`` (default: the conversation's) fits the loop.

        The turn itself is fitted to that budget less ``tools_tokens`` (the tool
        definitions every request carries) and ``tool_headroom`` (default
        ``DEFAULT_TOOL_HEADROOM``, at most a quarter of the limit), so the first calls
        fit as they come."""
        budget = budget if budget is not None else conv.budget
        specs: list[AttachmentSpec] = [*tools]
        found = tuple(hits)
        if found:
            specs.append(Hits(found))
        turn_budget = None if budget is None else loop_budget(budget, tools_tokens, tool_headroom)
        env, graph = conv._build(
            text, attach, vault_changes=vault_changes, tools=specs, budget=turn_budget
        )
        fitting = None
        if budget is not None:
            measured = graph.measured if graph.measured is not None else draft(graph)
            fitting = turn_fitting(graph, measured, budget)
        return cls(
            env,
            text,
            conv.counter,
            budget,
            repeat_after_tokens=repeat_after_tokens,
            tools_tokens=tools_tokens,
            fitting=fitting,
        )

    def step(self, *calls: AgentCall, text: str = "") -> AgentTurn:
        """The loop after one more model turn with these tool calls and their results."""
        if not calls:
            raise ConversationError("an agent step needs at least one tool call")
        number = len(self.steps) + 1
        named = tuple(
            c if c.id else attrs.evolve(c, id=f"call_{number}_{i + 1}") for i, c in enumerate(calls)
        )
        ids = [c.id for s in self.steps for c in s.calls] + [c.id for c in named]
        if len(set(ids)) != len(ids):
            raise ConversationError(f"step {number}: tool call ids must be unique in a turn")
        return attrs.evolve(self, steps=(*self.steps, AgentStep(named, text)))

    @property
    def sent(self) -> Envelope:
        """The envelope the loop's next request is built from (``handoff`` or ``envelope``)."""
        return self.envelope if self.handoff is None else self.handoff

    @property
    def handed_system(self) -> str:
        """L1's mutable text the loop's requests send when a handoff set it (``with_system``,
        ``after``), else "": what a conversation keeps as ``agent_handoff``."""
        return _mutable(self.handoff) if self.handoff is not None and _handed(self.handoff) else ""

    def with_system(self, system: SystemPrompt) -> AgentTurn:
        """The loop after a handoff to an agent with other instructions: its next requests
        send ``system`` as L1 (the same stable part, the new agent's instructions as the
        mutable part: the library and history after it change no byte), counted and
        fitted like the first agent's (the budget may compact it). A
        ``handoff`` decision (L1) in that envelope's report says why the prefix broke;
        ``envelope`` (the turn as built, what is saved) is unchanged."""
        base = self.sent
        measured = system_layer(system, self.counter)
        report = _with_handoff(
            base, "agent handoff: L1's mutable part is the next agent's instructions from here on"
        )
        _, l2, l3, l4, l5 = base.layers
        l1 = Layer(LayerName.L1, measured.segments, measured.tokens)
        handoff = Envelope(
            base.turn, (l1, l2, l3, l4, l5), report, user_text=base.user_text, batch=base.batch
        )
        fitting = self.fitting
        if fitting is not None and self.budget is not None:
            if fitting.turn.promoted is not None:
                fitting.turn.promoted.result()  # the library's memos are shared: wait for it
            graph = attrs.evolve(fitting.turn, system=system)
            fitting = turn_fitting(graph, draft(graph, fitting.draft), self.budget)
        return attrs.evolve(self, handoff=handoff, fitting=fitting)

    def after(self, previous: Envelope | str | None) -> AgentTurn:
        """The turn whose first request follows ``previous`` (the last request of the loop
        before it): when that one sent another agent's instructions (``with_system``) and
        this turn's L1 mutable part differs from them with no decision of its own (the
        run starts with its first agent again), the turn's requests carry a ``handoff``
        decision (L1) that says why the prefix broke there; the bytes are unchanged and
        ``envelope`` (saved) has no such decision. ``previous`` may be given as the L1
        mutable text that request sent after its handoff (``Conversation.agent_handoff``,
        saved: a session loaded from a store has not seen the request itself)."""
        if isinstance(previous, Envelope):
            previous = _mutable(previous) if _handed(previous) else None
        if not previous:
            return self
        own = self.sent
        if any(d.layer == "L1" for d in own.report.decisions):
            return self
        if previous == _mutable(own):
            return self
        reason = "agent handoff: the run starts with its first agent's instructions again"
        report = _with_handoff(own, reason)
        return attrs.evolve(self, handoff=attrs.evolve(own, report=report))

    def finish(self, conv: Conversation, answer: str) -> None:
        """End the turn: L4 keeps the bare query and ``answer`` (tool payloads stripped)."""
        conv.reply(answer)

    def _full(self, call: AgentCall) -> tuple[str, bool]:
        if self.counter.count(call.result) >= self.repeat_after_tokens:
            return f"{call.result}\n\n{QUESTION_AGAIN}{self.question}", True
        return call.result, False

    def _framing(self) -> Framing:
        return OPENAI_FRAMING if self.budget is None else self.budget.framing

    def _call_tokens(self, call: LoopCall) -> int:
        """Tokens one call adds: its framing, name and arguments, and its result message."""
        return _call_tokens(call, self.counter, self._framing())

    def loop_tokens(self, steps: Iterable[LoopStep]) -> int:
        """Tokens the loop adds (``loop_tokens`` with this turn's counter and framing)."""
        return loop_tokens(steps, self.counter, self._framing())

    def base_tokens(self) -> int:
        """The envelope's request tokens (without the loop and the tool definitions)."""
        return request_tokens(self.sent, self.counter, self._framing())

    def fit(self) -> Loop:
        """The loop as sent, fitted by the fitting engine: old results stubbed, then the
        largest cut (a result of the newest step is only excerpted), then the turn as fitted
        solved again in less room, then any result stubbed, until it fits (each cut moves
        the count by what it changed).

        Raises ``BudgetExceeded`` (with a report) when nothing is left to cut; a
        non-recoverable result is cut to a marked excerpt, never stubbed.
        """
        rows = []
        for step in self.steps:
            row = []
            for call in step.calls:
                content, repeated = self._full(call)
                args = call.sent or call.args
                row.append(LoopCall(call.id, call.name, args, content, "full", repeated))
            rows.append(tuple(row))
        base = self.base_tokens()
        costs = tuple(tuple(self._call_tokens(c) for c in row) for row in rows)
        framing = self._framing()
        apart = self.text_apart
        texts = sum(_text_tokens(s.text, apart, self.counter, framing) for s in self.steps)
        layers = tuple((str(layer.name), layer.tokens) for layer in self.sent.layers)
        used = base + self.tools_tokens + texts + sum(map(sum, costs))
        start = _LoopState(tuple(rows), costs, base, used, layers, self.tools_tokens)
        if self.budget is None:
            return Loop(self.sent, self._shown(start), (), start.used)
        budget = self.budget

        def too_big(state: _LoopState, cuts: int) -> str:
            return (
                f"turn {self.envelope.turn}: agent loop of {len(self.steps)} steps needs "
                f"{budget.effective(state.used)} tokens, over the limit of {budget.limit}, "
                f"even with every tool result stubbed and the turn cut as far as it goes"
            )

        plans: list[engine.Plan[_LoopState]] = [
            self._stub_old,
            functools.partial(self._cut_largest, stub_newest=False),
        ]
        if self.fitting is not None and self.steps:
            plans.append(_shrunk(self.fitting))
        plans.append(functools.partial(self._cut_largest, stub_newest=True))
        done, report = engine.fit(start, plans, budget, too_big, before=start.layer_tokens())
        envelope = self.sent
        if done.fitting is not None and done.fitting is not self.fitting:
            cut = complete(done.fitting.draft, done.fitting.turn)
            envelope = attrs.evolve(cut, report=envelope.report)
        return Loop(envelope, self._shown(done), report.decisions, done.used, report)

    def _shown(self, state: _LoopState) -> tuple[LoopStep, ...]:
        return tuple(
            LoopStep(s.text, row, self.text_apart)
            for s, row in zip(self.steps, state.rows, strict=True)
        )

    def _cut(
        self, state: _LoopState, i: int, j: int, new: LoopCall, reason: str
    ) -> tuple[_LoopState, list[Decision]]:
        """``state`` with call (i, j) sent as ``new``: the count moves by that call's change."""
        old = state.rows[i][j]
        cost = self._call_tokens(new)
        rows = list(state.rows)
        rows[i] = (*rows[i][:j], new, *rows[i][j + 1 :])
        costs = list(state.costs)
        costs[i] = (*costs[i][:j], cost, *costs[i][j + 1 :])
        used = state.used - state.costs[i][j] + cost
        key = self.steps[i].calls[j].key
        action = DecisionAction.STUBBED if new.form == "stub" else DecisionAction.EXCERPTED
        decision = Decision("agent", key, old.form, new.form, reason, layer="loop", action=action)
        return attrs.evolve(state, rows=tuple(rows), costs=tuple(costs), used=used), [decision]

    def _stub_old(self, state: _LoopState, over: int) -> tuple[_LoopState, list[Decision]] | None:
        """The oldest result of an earlier step goes to a stub: a result the model has
        already acted on is the cheapest loss."""
        for i, row in enumerate(state.rows[:-1]):
            for j, shown in enumerate(row):
                call = self.steps[i].calls[j]
                smaller = self.counter.count(_stub(call)) < self.counter.count(shown.content)
                if shown.form != "stub" and call.recoverable and smaller:
                    stub = attrs.evolve(
                        shown, content=_stub(call), form="stub", question_repeated=False
                    )
                    return self._cut(
                        state, i, j, stub, "old tool result stubbed (name and arguments kept)"
                    )
        return None

    def _cut_largest(
        self, state: _LoopState, over: int, *, stub_newest: bool = True
    ) -> tuple[_LoopState, list[Decision]] | None:
        """The largest result is halved to an excerpt, or stubbed when that does not help
        (without ``stub_newest``, not one of the newest step's: the model has not seen it,
        and a stub would only have it call again)."""
        newest = len(state.rows) - 1
        sized = [
            (self.counter.count(shown.content), i, j)
            for i, row in enumerate(state.rows)
            for j, shown in enumerate(row)
            if shown.form != "stub"
        ]
        for size, i, j in sorted(sized, key=lambda t: (-t[0], t[1], t[2])):
            call, shown = self.steps[i].calls[j], state.rows[i][j]
            limit = size // 2
            if limit >= EXCERPT_MIN_TOKENS:
                body = _excerpt(call.result, self.counter, limit)
                if shown.question_repeated:
                    body = f"{body}\n\n{QUESTION_AGAIN}{self.question}"
                new = attrs.evolve(shown, content=body, form="excerpt")
                if self.counter.count(new.content) < size:
                    return self._cut(
                        state, i, j, new, f"tool result cut to a {limit}-token excerpt"
                    )
            if i == newest and not stub_newest:
                continue
            if call.recoverable and self.counter.count(_stub(call)) < size:
                stub = attrs.evolve(
                    shown, content=_stub(call), form="stub", question_repeated=False
                )
                return self._cut(state, i, j, stub, "tool result stubbed (name and arguments kept)")
        return None


def _call_tokens(call: LoopCall, counter: TokenCounter, framing: Framing) -> int:
    return (
        framing.tool_call
        + counter.count(call.name + call.args)
        + framing.per_message
        + counter.count(call.content)
    )


def loop_tokens(
    steps: Iterable[LoopStep], counter: TokenCounter, framing: Framing = OPENAI_FRAMING
) -> int:
    """Tokens an agent loop's steps add to the turn's request (``request_tokens`` counts
    the envelope, ``tool_tokens`` the definitions): per step its message framing and text
    (two messages' framing when the text is sent apart),
    per call its framing, name and arguments, and its result message. ``Loop.tokens`` is
    the three together, with the budget's framing."""
    total = 0
    for step in steps:
        total += _text_tokens(step.text, step.text_apart, counter, framing)
        total += sum(_call_tokens(call, counter, framing) for call in step.calls)
    return total


def _text_tokens(text: str, apart: bool, counter: TokenCounter, framing: Framing) -> int:
    """A step's message framing and text: one message with its calls, or two when the text
    goes out apart (``LoopStep.text_apart``)."""
    messages = 2 if apart and text else 1
    return messages * framing.per_message + counter.count(text)


def _with_handoff(envelope: Envelope, reason: str) -> BuildReport:
    """``envelope``'s report with a ``handoff`` decision on L1's mutable part."""
    decision = Decision(
        "agent", "system:mutable", "text", "text", reason, layer="L1",
        action=DecisionAction.HANDOFF,
    )  # fmt: skip
    return attrs.evolve(envelope.report, decisions=(*envelope.report.decisions, decision))


def _handed(envelope: Envelope) -> bool:
    """Whether ``envelope``'s L1 mutable part is what a handoff set (its last L1 decision)."""
    last = next((d for d in reversed(envelope.report.decisions) if d.layer == "L1"), None)
    return last is not None and last.action is DecisionAction.HANDOFF


def _mutable(envelope: Envelope) -> str:
    segment = envelope.l1.get("system:mutable")
    return "" if segment is None else segment.text


@attrs.frozen
class _LoopState:
    """The engine's state for an agent loop: each call as sent, what each adds, the
    envelope's tokens and the request's, and the turn as cut so far (if it is kept)."""

    rows: tuple[tuple[LoopCall, ...], ...]
    costs: tuple[tuple[int, ...], ...]
    base: int
    used: int
    layers: tuple[tuple[str, int], ...] = ()
    tools: int = 0
    fitting: TurnFitting | None = None

    def layer_tokens(self) -> tuple[tuple[str, int], ...]:
        layers = self.layers if self.fitting is None else self.fitting.layer_tokens()
        tools = (("tools", self.tools),) if self.tools else ()
        return (*layers, *tools, ("loop", self.used - self.base - self.tools))


def _shrunk(fitting: TurnFitting) -> engine.Plan[_LoopState]:
    """The turn solved again in less room, over the loop's state (from ``fitting``, the turn
    as fitted, the first time): the loop's count moves by what it saved."""

    def run(state: _LoopState, over: int) -> tuple[_LoopState, list[Decision]] | None:
        turn = state.fitting if state.fitting is not None else fitting
        if turn.turn.promoted is not None:
            turn.turn.promoted.result()  # the library's memos are shared: wait for it
        step = shrink(turn, over)
        if step is None:
            return None
        new, made = step
        used = state.used - state.base + new.used
        return attrs.evolve(state, fitting=new, base=new.used, used=used), list(made)

    return run


def loop_budget(budget: Budget, tools_tokens: int, headroom: int | None) -> Budget:
    """The budget an agent turn is fitted to: ``budget`` with the tool definitions and the
    loop's headroom (default ``DEFAULT_TOOL_HEADROOM``, at most a quarter of the limit)
    reserved besides the output."""
    if tools_tokens < 0 or (headroom is not None and headroom < 0):
        raise ConfigError("tool_headroom", "tool definitions and headroom must be >= 0 tokens")
    room = budget.limit
    if tools_tokens >= room:
        raise ConfigError(
            "tools",
            f"the tool definitions take {tools_tokens} tokens, the whole limit of {room}",
        )
    wanted = DEFAULT_TOOL_HEADROOM if headroom is None else headroom
    extra = tools_tokens + min(wanted, (room - tools_tokens) // 4)
    reserve = budget.reserve_output + math.ceil(extra * (1.0 + budget.safety_margin))
    return attrs.evolve(budget, reserve_output=min(reserve, budget.context_window - 1))


def tool_turn(
    conv: Conversation,
    text: str,
    attach: Iterable[Any] = (),
    *,
    tools: Iterable[ToolUse] = (),
    hits: Iterable[Hit] = (),
    vault_changes: Mapping[str, str] | None = None,
) -> Envelope:
    """One turn with single-shot tool results and retrieval hits besides the attachments."""
    found = tuple(hits)
    specs: list[AttachmentSpec] = [*tools]
    if found:
        specs.append(Hits(found))
    return conv.turn(text, attach, vault_changes=vault_changes, tools=specs)
