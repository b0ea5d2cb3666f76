"""What every adapter shares: a turn's agent loop rebuilt from a framework's tool calls."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from lamina.pipeline import Conversation, Decision, DecisionAction, Envelope, SystemPrompt
from lamina.pipeline.agent import AgentCall, AgentTurn, Loop, agent_call
from lamina.pipeline.errors import ConfigError, ConversationError
from lamina.pipeline.sources import TurnWarning

__all__ = ["Call", "LoopAdapter", "LoopState"]


@attrs.frozen
class Call:
    """A tool call as a framework holds it: id, name, arguments, and its result text;
    ``sent`` the arguments' text as the framework serializes them on the wire ("":
    Lamina's canonical JSON, which is what it sends)."""

    id: str
    name: str
    args: Any
    result: str
    sent: str = ""


class LoopState:
    """The conversation's current turn as an agent loop: its query, envelope and steps.

    ``start`` builds the turn once per query (with the attachments given beforehand),
    leaving ``tool_headroom`` and the framework's own additions (``tools_tokens``: tool
    definitions, instructions it sends itself) free; ``fit`` rebuilds the loop from the
    framework's calls, keeping each call's first seen result (a framework may hand back
    the stubbed text Lamina sent last time). A framework's own system prompt goes into
    L1's mutable part (``adopt_system``), never dropped; when it changes within a turn (a
    handoff to an agent with other instructions) the loop's next requests send the new
    one there (``AgentTurn.with_system``: a ``handoff`` decision), while the conversation
    keeps the prompt the turn started with: the next turn's L1 is the prompt the
    framework sends when its next run starts (the agent it starts with); when the last
    request sent another agent's, the turn's requests carry a ``handoff`` decision too
    (``AgentTurn.after``), in a session loaded from a store too (the text is saved,
    ``Conversation.agent_handoff``). ``tools`` are the tool
    definitions of the last request, as counted (pass them to
    ``lamina.renderers.usage_record(tools=)`` so the predicted input includes them, with the
    ``loops`` so far as the requests: each call is read back against its own).
    """

    def __init__(self, conversation: Conversation, tool_headroom: int | None = None) -> None:
        self.conversation = conversation
        self.tool_headroom = tool_headroom
        self._sent_system = ""
        self.pending: list[Any] = []
        self.attached: list[Any] = []
        """The current turn's attachments (``attach`` before it started): saved with it."""
        self.agent: AgentTurn | None = None
        self.query: str | None = None
        self.loops: list[Loop] = []
        self._results: dict[str, str] = {}
        self._finished = True
        self.tools: list[Mapping[str, Any]] = []
        self.text_apart = False
        self._instructions: tuple[str, ...] | None = None
        """Whether the framework sends a step's text as a message of its own before its
        calls (``AgentTurn.text_apart``: the Agents SDK over Chat Completions)."""

    @property
    def envelope(self) -> Envelope | None:
        return None if self.agent is None else self.agent.envelope

    def adopt_system(self, text: str) -> None:
        """The framework's system prompt (``Agent(system_prompt=...)`` and the like) as L1's
        mutable part, before a turn starts. It replaces an empty mutable part or the text
        an adapter set before (``Conversation.agent_system``, saved with the state: a
        conversation loaded from a store goes on with another agent as the live one does);
        a mutable part the host set itself raises ``ConfigError`` rather than lose either
        (an empty ``text`` leaves it as it is)."""
        conversation = self.conversation
        owned = conversation.agent_system
        if not text and not owned:
            return
        if conversation.system.mutable not in ("", owned, text):
            raise ConfigError(
                "system",
                "the framework sends a system prompt of its own and the conversation's L1 "
                "mutable part is set too: give the framework's prompt to the Conversation "
                "(or clear the mutable part) so neither is lost",
            )
        conversation.set_system(mutable=text)
        conversation.agent_system = text

    def start(self, query: str, tools_tokens: int = 0) -> AgentTurn:
        """The turn for ``query``: the current one, or a new one built by the conversation."""
        if self.agent is not None and self.query == query and not self._finished:
            return self.agent
        # The request before this turn's first: this session's last, else the handed
        # instructions the conversation saved (a session loaded from a store).
        previous = self.loops[-1].envelope if self.loops else self.conversation.agent_handoff
        self.agent = AgentTurn.start(
            self.conversation,
            query,
            self.pending,
            tool_headroom=self.tool_headroom,
            tools_tokens=tools_tokens,
        ).after(previous)
        self.attached, self.pending = self.pending, []
        self.query = query
        self._results = {}
        self._finished = False
        return self.agent

    @property
    def in_progress(self) -> bool:
        """Whether a turn was started and has no answer yet."""
        return self.agent is not None and not self._finished

    def is_current(self, text: str) -> bool:
        """Whether ``text`` is this turn's query or the user message Lamina rendered for it,
        as built or as sent (``Envelope.as_sent``: context deferred into it)."""
        env = self.envelope
        if self._finished or env is None:
            return False
        return text in (self.query, env.user_text, env.as_sent().user_text)

    def fit(self, steps: Sequence[tuple[str, Iterable[Call]]]) -> Loop:
        """The fitted loop for these (text, calls) model steps of the current turn."""
        if self.agent is None:
            raise ConversationError("no turn was started")
        agent = attrs.evolve(self.agent, steps=(), text_apart=self.text_apart)
        for text, calls in steps:
            made: list[AgentCall] = []
            for call in calls:
                result = self._results.setdefault(call.id, call.result)
                made.append(agent_call(call.name, call.args, result, id=call.id, sent=call.sent))
            agent = agent.step(*made, text=text)
        loop = agent.fit()
        if self.tools:
            loop = attrs.evolve(loop, tools=json.dumps(self.tools, sort_keys=True))
        self.loops.append(loop)
        return loop

    def fit_query(
        self,
        query: str,
        steps: Sequence[tuple[str, Iterable[Call]]],
        *,
        tools_tokens: int = 0,
        system: str | None = None,
        tools: Sequence[Mapping[str, Any]] = (),
    ) -> Loop:
        """The fitted loop of ``query``'s turn, started first when it is a new query (with
        the framework's ``system`` prompt, if any, adopted into L1 first; None within a
        turn: not seen again, another text: a handoff, see ``handoff``). ``tools`` (the
        request's definitions) are kept as ``self.tools``."""
        self.tools = list(tools)
        if not self.is_current(query):
            self.adopt_system(system or "")
            self.start(query, tools_tokens)
            self._sent_system = system or ""
        elif system is not None and system != self._sent_system:
            self.handoff(system)
        if self.agent is not None and self.agent.tools_tokens != tools_tokens:
            self.agent = attrs.evolve(self.agent, tools_tokens=tools_tokens)
        return self.fit(steps)

    def instructions_sent(self, texts: Sequence[str]) -> None:
        """The instructions the framework sent itself beside the last fitted request (after
        Lamina's system message: pydantic-ai's ``instructions``). When they differ from the
        request before's, that request's envelope report gets an ``instructions-changed``
        decision and warning: the prefix broke after the system message, which the
        envelopes alone do not show (``classify_break``, the trace and the usage read-back
        say so)."""
        now = tuple(texts)
        before, self._instructions = self._instructions, now
        if before is None or before == now or not self.loops:
            return
        loop = self.loops[-1]
        changed = sum(1 for a, b in itertools.zip_longest(before, now) if a != b)
        reason = (
            f"the framework's own instructions changed since the previous request ({changed} "
            f"of {len(now)} sent after the system message differ): the history after them "
            f"is sent uncached"
        )
        decision = Decision(
            "agent", "framework:instructions", "text", "text", reason, layer="L1",
            action=DecisionAction.INSTRUCTIONS_CHANGED,
        )  # fmt: skip
        report = loop.envelope.report
        report = attrs.evolve(
            report,
            decisions=(*report.decisions, decision),
            warnings=(*report.warnings, TurnWarning("instructions-changed", "", reason)),
        )
        self.loops[-1] = attrs.evolve(loop, envelope=attrs.evolve(loop.envelope, report=report))

    def handoff(self, system: str) -> None:
        """The framework's prompt changed within the turn (a handoff to an agent with other
        instructions): the loop's next requests send ``system`` as L1's mutable part after
        the same stable part (``AgentTurn.with_system``, a ``handoff`` decision). A mutable
        part the host set itself is never replaced: ``ConfigError``, as ``adopt_system``."""
        if self.agent is None:
            raise ConversationError("no turn was started")
        conversation = self.conversation.system
        if conversation.mutable not in ("", self.conversation.agent_system):
            raise ConfigError(
                "system",
                "the framework's system prompt changed within a turn (a handoff to an agent "
                "with other instructions) and the conversation's L1 mutable part is the "
                "host's own: give the agents' instructions to the framework only, or clear "
                "the mutable part, so neither is lost",
            )
        self.agent = self.agent.with_system(SystemPrompt(conversation.stable, system))
        self._sent_system = system

    def finish(self, answer: str) -> None:
        """End the turn: L4 keeps the query and ``answer``."""
        if self.agent is None or self._finished:
            raise ConversationError("finish() without a turn in progress")
        agent = self.agent
        agent.finish(self.conversation, answer)
        self._finished = True
        # What the turn's requests sent after a handoff, saved with the conversation: the
        # next turn's first request follows them, in this session or a loaded one.
        self.conversation.agent_handoff = agent.handed_system


class LoopAdapter:
    """What an adapter exposes to its host: the conversation, the fitted loops, attach, finish."""

    state: LoopState

    @property
    def conversation(self) -> Conversation:
        return self.state.conversation

    @property
    def loops(self) -> list[Loop]:
        """Every request as fitted, in order (what the model was sent)."""
        return self.state.loops

    def attach(self, *specs: Any) -> None:
        """Attachments for the next query (note, pdf, url... specs or their script form)."""
        self.state.pending.extend(specs)

    def finish(self, answer: str) -> None:
        """Record the run's final answer as the turn's reply."""
        self.state.finish(answer)
