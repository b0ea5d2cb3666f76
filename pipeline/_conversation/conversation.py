"""A conversation: L1 sections, the L2 library and L4 history kept between turns."""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from lamina.pipeline._conversation.batch import (
    NO_BATCH,
    BatchState,
    batch_turn,
    shed_counts,
    shed_keys,
    stale_key,
)
from lamina.pipeline._conversation.usage import Calibration, TurnUsage
from lamina.pipeline._errors import (
    ArgumentError,
    ConfigError,
    ConversationError,
    LaminaError,
    StageError,
)
from lamina.pipeline._input import validate as _validate
from lamina.pipeline._model.artifacts import (
    AttachmentSpec,
    Processed,
    SourceResolver,
    resolver_for_turn,
)
from lamina.pipeline._model.envelope import (
    Batch,
    CachedPrefix,
    Decision,
    DecisionAction,
    Envelope,
    Form,
    Segment,
    View,
)
from lamina.pipeline._model.history import HistoryEntry, strip_reply
from lamina.pipeline._model.kinds import AttachmentKinds, NoKinds
from lamina.pipeline._model.library import Library, LibraryEntry, LibraryPrefix
from lamina.pipeline._model.recall import RECALL_SOURCE, Retriever
from lamina.pipeline._recall.memory import RecallMemo
from lamina.pipeline._stages.builtin import Pipeline
from lamina.pipeline._tokens.counter import TokenCounter
from lamina.pipeline._turn.assemble import assemble
from lamina.pipeline._turn.budget import BudgetSettings
from lamina.pipeline._turn.graph import HistoryView, SystemPrompt, TurnContext, TurnGraph
from lamina.pipeline._turn.history import HistorySegments
from lamina.pipeline._turn.measure import request_tokens
from lamina.pipeline._turn.promotion import Promotion
from lamina.pipeline._views.summarize import Summarizer, SummaryCache, TextRankSummarizer
from lamina.pipeline._views.views import (
    Policy,
    SegmentRenderer,
    ViewMemo,
    renderer_memo,
    shared_views,
)

if TYPE_CHECKING:
    from lamina.pipeline._model.history import Head
    from lamina.pipeline._turn.budget import Budget

__all__ = [
    "CacheMeter",
    "Conversation",
    "ConversationState",
    "NoRenderer",
    "NoSources",
    "SystemPrompt",
]


Attachment = AttachmentSpec | Mapping[str, Any]


class CacheMeter(Protocol):
    """Measures a request's cached prefix against the request before it (``previous``:
    None on the first turn, or where it is not known), as sent: what ``Envelope.cache``
    holds. Comparing requests means laying them out as a provider receives them, which is
    the renderers' work, so the core takes it as an edge like ``sources`` and
    ``renderer``: ``lamina.renderers.cached_prefix`` is one, and ``lamina.Conversation``
    (and the host functions of ``lamina``) pass it."""

    def __call__(
        self,
        previous: Envelope | None,
        current: Envelope,
        counter: TokenCounter,
        *,
        budget: Budget | None = None,
    ) -> CachedPrefix: ...


# Renderings an item takes in a budgeted turn: its full block, its preview, and the empty
# preview a fitted preview is measured by (a 1,600-note folder at 200k rendered 4,800).
_RENDERS_PER_ITEM = 3


@attrs.frozen
class ConversationState:
    """Everything a conversation carries between turns, as plain typed data.

    A store saves this (cattrs unstructures it generically) and ``Conversation.restore``
    rebuilds a conversation whose next turn is byte-identical to the uninterrupted one.
    ``budget`` is None for a conversation without one (and in states saved before it).
    ``defer_library`` is False in states saved before it, so a stored chat keeps sending
    the requests it sent; ``batch`` is where its current batch settled. ``agent_system``
    is the L1 mutable text an agent framework's adapter set (``Conversation.agent_system``);
    ``agent_handoff`` the L1 mutable text the last turn's last request sent when a handoff
    within that turn set it (``Conversation.agent_handoff``). ``regret`` is the value the
    budget's requests have forgone since its last buy (``solver.solve``; 0 in states saved
    before it: the budget then starts counting again).
    """

    system: SystemPrompt
    library: tuple[LibraryEntry, ...] = ()
    history: tuple[HistoryEntry, ...] = ()
    vault_changes: tuple[tuple[str, str], ...] = ()
    last_system: SystemPrompt | None = None
    tokenizer: str = "o200k_base"
    policy: Policy = attrs.field(factory=Policy)
    history_view: HistoryView = attrs.field(factory=HistoryView)
    budget: BudgetSettings | None = None
    usage: tuple[TurnUsage, ...] = ()
    calibration: tuple[Calibration, ...] = ()
    defer_library: bool = False
    batch: BatchState | None = None
    agent_system: str = ""
    agent_handoff: str = ""
    regret: float = 0.0


class Conversation:
    """Builds one envelope per turn and carries L1, L2 and L4 to the next.

    The core takes its edges as arguments: ``sources`` (specs -> artifacts, e.g.
    ``lamina.processors.Sources``) and ``renderer`` (views -> text, e.g.
    ``lamina.renderers.XmlRenderer``).
    ``lamina.Conversation`` fills both in from a vault folder, and ``cache_meter``
    (``CacheMeter``): each envelope's ``cache`` then tells how much of its request repeats
    the request before it, measured when first read (None without a meter). A restored
    conversation has not seen the request before its first turn: that figure says so
    (``previous-not-rebuilt``, 0 tokens), unless it was loaded from a store
    (``load_conversation``, ``stateless_turn``), which rebuilds that request when the
    figure is read.

    ``defer_library`` sends each request as a byte extension of the one before until the
    prefix breaks anyway (``Envelope.batch``): a turn's new context stays in the user
    message that sent it instead of growing the library in the system message, which would
    push every history message after it out of the provider's cached prefix.
    """

    def __init__(
        self,
        system: str | SystemPrompt = "",
        *,
        sources: SourceResolver | None = None,
        tokenizer: str = "",
        policy: Policy | None = None,
        pipeline: Pipeline | None = None,
        renderer: SegmentRenderer | None = None,
        budget: Budget | None = None,
        summarizer: Summarizer | None = None,
        retriever: Callable[[], Retriever] | None = None,
        defer_library: bool = True,
        cache_meter: CacheMeter | None = None,
    ) -> None:
        _check_settings(system, tokenizer, policy, budget)
        if cache_meter is not None and not callable(cache_meter):
            got = type(cache_meter).__name__
            raise ArgumentError("cache_meter", f"must be a pipeline.CacheMeter, got {got}")
        _validate.flag("defer_library", defer_library)
        if retriever is not None and not callable(retriever):
            got = type(retriever).__name__
            raise ArgumentError("retriever", f"must make a pipeline.Retriever, got {got}")
        self._system = system if isinstance(system, SystemPrompt) else SystemPrompt(system)
        self._sources = sources if sources is not None else NoSources()
        # Without tokenizer= (""), the budget's model (Budget.for_model) decides; else o200k.
        self._counter = TokenCounter(
            tokenizer or (budget.tokenizer if budget is not None else None) or "o200k_base"
        )
        self.policy = policy or Policy()
        self.pipeline = pipeline or Pipeline.default()
        self.renderer = renderer if renderer is not None else NoRenderer()
        self._library = Library()
        # This turn's new items on their way into L2, made by a background thread while the
        # model answers; everything that reads the library or the mutable memos waits.
        self._promotion: Promotion | None = None
        # What the last promotion's preparing had left when this turn stopped it: it goes
        # on after the next promotion's library (``Promotion.carry``).
        self._preparing: tuple[Iterator[object], ...] = ()
        self._history: list[HistoryEntry] = []
        self._last_system: SystemPrompt | None = None
        self._vault_changes: dict[str, str] = {}
        self.budget = budget
        self.summarizer = summarizer or TextRankSummarizer()
        self.summaries = SummaryCache()
        self._views = shared_views()
        # The rendered library and system message, extended turn to turn.
        self._prefix = LibraryPrefix()
        # The history's rendered segments and L4's hash, extended turn to turn.
        self._l4 = HistorySegments()
        self._history_view = HistoryView()
        self._regret = 0.0
        # Earlier messages as passages and their index, made once a turn may recall.
        self._recall = RecallMemo(retriever)
        self._l1_compacted = False
        # The stored head this state continues (set by load_conversation and save_turn).
        self.saved_head: Head | None = None
        self._usage: dict[tuple[int, int], TurnUsage] = {}
        self._calibration: dict[str, Calibration] = {}
        self.defer_library = defer_library
        # Where the current batch settled and what it sent since (defer_library).
        self._batch: BatchState | None = None
        # The last request's batch (not saved): its messages are the next one's history.
        self._last_batch: Batch | None = None
        # The L1 mutable text an agent framework's adapter set (its agent's instructions),
        # saved: another agent's may replace it, never the host's own mutable part.
        self.agent_system = ""
        # The L1 mutable text the last turn's last request sent when a handoff within the
        # turn set it, else "" (saved): the next turn's first request follows that one, so
        # a session that did not see it (loaded from a store) still explains the change.
        self.agent_handoff = ""
        self.cache_meter = cache_meter
        # The last envelope this object built, as built: the next one's ``cache`` compares
        # with it (the meter's memo of what it renders to is by identity). A conversation
        # loaded from a store holds a function that rebuilds its last request instead
        # (``load_conversation``), called only if that figure is read.
        self._sent: Envelope | Callable[[], Envelope | None] | None = None

    def _settle(self, *, next_turn: bool = False) -> None:
        """Take the promoted library once it is made (waiting for the background thread;
        for the ``next_turn``, not for its preparing of later turns' summaries).
        If making it failed, the library stays as the turn found it and a StageError says
        why (once: the conversation goes on)."""
        promotion = self._promotion
        if promotion is None:
            return
        self._promotion = None
        try:
            self._library = promotion.result(next_turn=next_turn)
            self._preparing = (*self._preparing, *promotion.rest)
        except LaminaError:
            raise
        except Exception as exc:
            raise StageError("promote", f"{type(exc).__name__}: {exc}") from exc

    @property
    def counter(self) -> TokenCounter:
        """The conversation's token counter (after this turn's promotion has used it)."""
        self._settle()
        return self._counter

    @property
    def views(self) -> ViewMemo:
        self._settle()
        return self._views

    @property
    def prefix(self) -> LibraryPrefix:
        self._settle()
        return self._prefix

    @property
    def state(self) -> ConversationState:
        self._settle()
        return ConversationState(
            system=self._system,
            library=self._library.entries,
            history=tuple(self._history),
            vault_changes=tuple(sorted(self._vault_changes.items())),
            last_system=self._last_system,
            tokenizer=self.counter.name,
            policy=self.policy,
            history_view=self._history_view,
            regret=self._regret,
            budget=None if self.budget is None else BudgetSettings.of(self.budget),
            usage=tuple(self._usage[k] for k in sorted(self._usage)),
            calibration=tuple(self._calibration[m] for m in sorted(self._calibration)),
            defer_library=self.defer_library,
            batch=self._batch if self.defer_library else None,
            agent_system=self.agent_system,
            agent_handoff=self.agent_handoff,
        )

    @classmethod
    def restore(
        cls,
        state: ConversationState,
        *,
        sources: SourceResolver | None = None,
        pipeline: Pipeline | None = None,
        renderer: SegmentRenderer | None = None,
        budget: Budget | None = None,
        summarizer: Summarizer | None = None,
        retriever: Callable[[], Retriever] | None = None,
        cache_meter: CacheMeter | None = None,
    ) -> Conversation:
        """A conversation that continues exactly where ``state`` was taken.

        Without ``budget=``, the saved budget's numbers come back with the default cut
        order; an explicit ``budget`` wins (set ``conv.budget = None`` to drop it).
        """
        if budget is None and state.budget is not None:
            budget = state.budget.budget()
        conv = cls(
            state.system,
            sources=sources,
            tokenizer=state.tokenizer,
            policy=state.policy,
            pipeline=pipeline,
            renderer=renderer,
            budget=budget,
            summarizer=summarizer,
            retriever=retriever,
            defer_library=state.defer_library,
            cache_meter=cache_meter,
        )
        conv._batch = state.batch
        if state.vault_changes:
            conv._vault_changes = dict(state.vault_changes)
            conv._sources = conv._sources.with_changes(conv._vault_changes)
        conv._library = Library(state.library)
        conv._history = list(state.history)
        conv._last_system = state.last_system
        conv._history_view = state.history_view
        conv._regret = state.regret
        conv._usage = {(u.turn, u.call): u for u in state.usage}
        conv._calibration = {c.model: c for c in state.calibration}
        conv.agent_system = state.agent_system
        conv.agent_handoff = state.agent_handoff
        return conv

    @property
    def library(self) -> Library:
        self._settle()
        return self._library

    @property
    def history(self) -> tuple[HistoryEntry, ...]:
        return tuple(self._history)

    @property
    def system(self) -> SystemPrompt:
        return self._system

    @property
    def sources(self) -> SourceResolver:
        return self._sources

    def set_system(self, stable: str | None = None, mutable: str | None = None) -> None:
        """Change L1; a change of the stable part invalidates every cached prefix."""
        _validate.optional_text("stable", stable)
        _validate.optional_text("mutable", mutable)
        self._system = SystemPrompt(
            self._system.stable if stable is None else stable,
            self._system.mutable if mutable is None else mutable,
        )

    def turn(
        self,
        text: str,
        attach: Iterable[Attachment] = (),
        *,
        vault_changes: Mapping[str, str] | None = None,
        tools: Iterable[AttachmentSpec] = (),
        background: bool = True,
    ) -> Envelope:
        """Build this turn's envelope from the query, its attachments and tool results.

        ``tools`` are turn-scoped specs that carry their own content
        (``lamina.pipeline.tools.tool``, ``lamina.pipeline.tools.hits``): they go to the user
        message first and never enter L1, L2 or L4.
        A turn that raises leaves the conversation exactly as it was (vault changes too).
        The next turn's library is made on the background worker while the request is
        sent; ``background=False`` leaves it to the first use, without the preparing of
        library summaries for later turns (a caller that saves the turn at once, as
        ``stateless_turn`` does, would wait for both).
        """
        return self._build(
            text, attach, vault_changes=vault_changes, tools=tools, background=background
        )[0]

    def _build(
        self,
        text: str,
        attach: Iterable[Attachment] = (),
        *,
        vault_changes: Mapping[str, str] | None = None,
        tools: Iterable[AttachmentSpec] = (),
        background: bool = True,
        budget: Budget | None = None,
    ) -> tuple[Envelope, TurnGraph]:
        """``turn``, and the turn graph it was assembled from; ``budget`` (default: the
        conversation's) fits it: an agent loop fits its turn leaving room for its calls
        and keeps the graph, so its cuts go on in the turn's order (``AgentTurn.fit``)."""
        self._settle(next_turn=True)
        _validate.text("text", text)
        _validate.flag("background", background)
        attach = _validate.attachments("attach", attach)
        tools = _validate.tool_specs("tools", tools)
        changes = {} if vault_changes is None else _validate.text_mapping(
            "vault_changes", vault_changes
        )
        # Everything the turn changes is built aside and kept only once the turn succeeded.
        all_changes = {**self._vault_changes, **changes}
        own_sources = self._sources.with_changes(changes) if changes else self._sources
        started = time.perf_counter()
        hits, encoded = self.counter.hits, self.counter.encoded_chars
        summary_hits = self.summaries.hits
        view_hits, views_made = self.views.hits, self.views.made
        rendered = renderer_memo(self.renderer)
        render_hits, renders_made = (0, 0) if rendered is None else (rendered.hits, rendered.made)
        specs = [own_sources.parse(a) if isinstance(a, Mapping) else a for a in attach]
        sources = resolver_for_turn(own_sources)
        processed = [_self_contained(s) or sources.process(s) for s in [*tools, *specs]]
        process_time = time.perf_counter() - started
        # Room for a preview of each of this turn's items, twice over, before any is made.
        items = sum(len(p.artifacts) + len(p.embedded) for p in processed)
        self.views.reserve(2 * items)
        if rendered is not None:
            # And for each item's renderings (its full block and previews), twice over: the
            # promotion renders again the full blocks L3 rendered before the turn's previews.
            rendered.reserve(2 * _RENDERS_PER_ITEM * items)
        number = len(self._history) + 1
        ctx = TurnContext(
            number,
            self.counter,
            self.renderer,
            self.policy,
            budget=self.budget if budget is None else budget,
            summaries=self.summaries,
            summarizer=self.summarizer,
            views=self.views,
            prefix=self.prefix,
            l4=self._l4,
            recall=self._recall,
        )
        batch = self._batch if self.defer_library else None
        shed, sheds, stale = self._shed(batch)
        start = TurnGraph.build(
            processed,
            ctx,
            self._library,
            system=self._system,
            history=tuple(self._history),
            history_view=self._history_view,
            regret=self._regret,
            settled=None if batch is None else batch.settled,
            settled_tokens=0 if batch is None else batch.library_tokens,
            deferred=() if batch is None else tuple((t.turn, t.tokens) for t in batch.turns),
            shed=shed,
            sheds=sheds,
            stale=stale,
            query=text,
        )
        if self._last_system is not None and self._last_system != self._system:
            part = "stable" if self._last_system.stable != self._system.stable else "mutable"
            start = start.decide(
                Decision(
                    "system",
                    f"system:{part}",
                    "text",
                    "text",
                    "system prompt changed",
                    layer="L1",
                    action=DecisionAction.SYSTEM_CHANGED,
                )
            )
        if self._l1_compacted:
            # Last turn's budget shortened L1's mutable part; this turn starts from it whole.
            start = start.decide(
                Decision(
                    "system",
                    "system:mutable",
                    "text",
                    "text",
                    "L1 mutable part sent whole again (last turn's budget had shortened it)",
                    layer="L1",
                    action=DecisionAction.RESTORED,
                )
            )
        graph = self.pipeline.run(start)
        del start  # its graph was copied by the stages: not kept while the request is joined
        rendering = time.perf_counter()
        envelope = assemble(graph)
        timings = (
            ("process", process_time),
            *graph.timings,
            ("render", time.perf_counter() - rendering),
            ("total", time.perf_counter() - started),
        )
        meters = (
            ("token_cache_hits", self.counter.hits - hits),
            ("encoded_chars", self.counter.encoded_chars - encoded),
            ("summary_cache_hits", self.summaries.hits - summary_hits),
            ("view_memo_hits", self.views.hits - view_hits),
            ("render_memo_hits", 0 if rendered is None else rendered.hits - render_hits),
        )
        # And for every entry the turn made (library previews, fitted sizes), twice over.
        self.views.reserve(2 * (self.views.made - views_made))
        if rendered is not None:
            rendered.reserve(2 * (rendered.made - renders_made))
        report = attrs.evolve(
            envelope.report,
            stats=(*envelope.report.stats, *_layer_stats(envelope)),
            timings=timings,
            meters=meters,
        )
        envelope = attrs.evolve(envelope, report=report)
        batch = None
        if self.defer_library and budget is None:
            envelope, batch = self._batched(envelope, graph.library)
        fitted = envelope.report.budget
        if fitted is not None:  # the request as sent beside the envelope as built
            sent = fitted.used if envelope.batch is None else envelope.batch.tokens
            report = attrs.evolve(envelope.report, budget=attrs.evolve(fitted, sent=sent))
            envelope = attrs.evolve(envelope, report=report)
        last = envelope.batch
        # Kept for the next turn without this turn's user message (see batch_turn).
        self._batch = batch
        self._last_batch = None if last is None else attrs.evolve(last, user=_NO_MESSAGE)
        self._sources, self._vault_changes = own_sources, all_changes
        self._library = graph.library
        self._promotion = graph.promoted
        if graph.promoted is not None and background:
            graph.promoted.carry(self._preparing)
            self._preparing = ()
            graph.promoted.start()
        elif graph.promoted is not None:
            graph.promoted.without_preparing()
        self._history_view = graph.history_view
        self._regret = graph.regret
        self._l1_compacted = graph.system.mutable != self._system.mutable
        self._history.append(HistoryEntry(number, text))
        self._last_system = self._system
        self.agent_handoff = ""  # this turn's requests follow the handed one
        meter = self.cache_meter
        if meter is not None:  # without one, nothing is kept for the next turn
            previous, self._sent = self._sent, envelope
            built, conversation_budget = envelope, self.budget

            def measure() -> CachedPrefix:
                """Made when first read (a host may never ask); so is the counter asked
                for, since asking waits for this turn's promotion."""
                before = previous() if callable(previous) else previous
                return meter(before, built, self.counter, budget=conversation_budget)

            envelope = attrs.evolve(built, cache=measure)
        return envelope, graph

    def _shed(
        self, batch: BatchState | None
    ) -> tuple[tuple[tuple[int, int], ...], tuple[str, ...], str]:
        """The batch's messages' tokens as the next request would send them if its
        extension is over the limit (``shed_counts``), the growth's keys a change to which
        it sheds from (``shed_keys``) and the first entry whose block is stale
        (``stale_key``), all against the library's entries after the settled ones; none
        without a batch."""
        if batch is None:
            return (), (), ""
        growth = {e.key: (e.text, e.tokens) for e in self._library.entries[batch.settled :]}
        counter = self.counter
        sheds = shed_keys(batch, growth, counter)
        return shed_counts(batch, growth, counter), sheds, stale_key(batch, growth)

    def _batched(self, envelope: Envelope, library: Library) -> tuple[Envelope, BatchState]:
        """``envelope`` with the request it is sent as (``batch_turn``): the batch goes on
        unless the prefix breaks anyway or the extended request would not fit the budget;
        cut entries of ``library`` (the turn's, as built) whose whole forms fit what the
        request leaves free beyond the budget's headroom are sent whole again."""
        budget = self.budget
        settle = NO_BATCH if self._batch is None and envelope.turn > 1 else ""

        def room(used: int) -> int:
            if budget is None:
                return 0
            return budget.limit - budget.effective(used) - budget.headroom_tokens

        # An entry this turn's message sends (attached again, or recalled) is not sent
        # whole beside it.
        recalled = {
            s.key.removeprefix(f"{RECALL_SOURCE}:")
            for s in envelope.l3.segments
            if s.source_type == RECALL_SOURCE or s.form is not Form.REFERENCE
        }

        def wholes(
            settled: int, free: int, sent: Mapping[str, str]
        ) -> list[tuple[int, Callable[[], Segment]]]:
            entries = library.entries[:settled]
            return whole_forms(entries, free, sent, self.renderer, self.counter, recalled)

        return batch_turn(
            self._batch,
            envelope,
            renderer=self.renderer,
            counter=self.counter,
            count=self.count_request,
            fits=lambda used: budget is None or budget.effective(used) <= budget.limit,
            settle=settle,
            previous=self._last_batch,
            room=room,
            wholes=wholes,
        )

    def reply(self, text: str) -> None:
        """Record the assistant's answer to the last turn (context blocks stripped)."""
        _validate.text("text", text)
        if not self._history:
            raise ConversationError("reply() was called before any turn")
        last = self._history[-1]
        if last.assistant is not None:
            raise ConversationError(f"turn {last.turn} already has a reply")
        self._history[-1] = attrs.evolve(last, assistant=strip_reply(text))

    @property
    def usage(self) -> tuple[TurnUsage, ...]:
        """The usage read-backs recorded so far, by turn (an agent loop's by call)."""
        return tuple(self._usage[k] for k in sorted(self._usage))

    def calibration(self, model: str) -> Calibration | None:
        return self._calibration.get(model)

    def record_usage(self, usage: TurnUsage) -> None:
        """Keep a turn's usage read-back (saved with the state; one per turn and loop call,
        ``TurnUsage.call``, a later one replacing it); for a provider whose tokenizer is
        not local, the observed input tokens calibrate the budget's margin."""
        if not isinstance(usage, TurnUsage):
            got = type(usage).__name__
            raise ArgumentError("usage", f"must be a pipeline.TurnUsage, got {got}")
        if not 1 <= usage.turn <= len(self._history):
            raise ConversationError(f"usage for turn {usage.turn}, which was not built")
        self._usage[usage.turn, usage.call] = usage
        if usage.exact or usage.counted <= 0:
            return
        prior = self.budget.safety_margin if self.budget is not None else 0.0
        calibration = self._calibration.get(usage.model) or Calibration(usage.model, prior)
        calibration = calibration.observe(usage.counted, usage.observed.input_tokens)
        self._calibration[usage.model] = calibration
        if self.budget is not None:
            self.budget = attrs.evolve(self.budget, safety_margin=calibration.margin)

    def process(self, spec: Attachment) -> Processed:
        """Run one attachment through the sources (for hosts that inspect artifacts)."""
        parsed = self._sources.parse(spec) if isinstance(spec, Mapping) else spec
        return self._sources.process(parsed)

    def count_request(self, envelope: Envelope) -> int:
        """Exact tokens of the request as sent (``Envelope.as_sent``: a batched request
        too), with the budget's framing when the conversation has one."""
        if self.budget is not None:
            return self.budget.used(envelope, self.counter)
        return request_tokens(envelope, self.counter)


def _check_settings(system: object, tokenizer: object, policy: object, budget: object) -> None:
    """The constructor's arguments, checked before anything is built from them."""
    from lamina.pipeline._turn.budget import Budget

    if not isinstance(system, str | SystemPrompt):
        got = type(system).__name__
        raise ArgumentError("system", f"must be a str or a SystemPrompt, got {got}")
    if isinstance(system, SystemPrompt):
        _validate.text("system.stable", system.stable)
        _validate.text("system.mutable", system.mutable)
    _validate.text("tokenizer", tokenizer)
    if policy is not None and not isinstance(policy, Policy):
        raise ArgumentError("policy", f"must be a pipeline.Policy, got {type(policy).__name__}")
    if budget is not None and not isinstance(budget, Budget):
        raise ArgumentError("budget", f"must be a pipeline.Budget, got {type(budget).__name__}")


def whole_forms(
    entries: Sequence[LibraryEntry],
    room: int,
    sent: Mapping[str, str],
    renderer: SegmentRenderer,
    counter: TokenCounter,
    skip: Container[str] = (),
) -> list[tuple[int, Callable[[], Segment]]]:
    """The cut ``entries`` not ``sent`` in full already whose full blocks were at most
    ``room`` tokens, in library order, each with how to render its whole form
    (``choose_restores`` renders only those it may take). An entry folded into a library
    index counts as cut (its index line holds no text) unless its key is in the library
    on its own again; one in ``skip`` is left out."""
    keys = {entry.key for entry in entries}
    cut: list[tuple[LibraryEntry, View]] = []
    for entry in entries:
        if entry.whole is not None:
            cut.append((entry, entry.whole))
        for inner in entry.folded:
            if inner.key not in keys:
                cut.append((inner, inner.whole_view))

    def render(whole: View) -> Callable[[], Segment]:
        def segment() -> Segment:
            text = renderer.render(whole)
            return Segment.of_view(whole, text, counter.count(text))

        return segment

    return [
        (entry.full_tokens, render(whole))
        for entry, whole in cut
        if whole.form is Form.FULL
        and entry.full_tokens <= room
        and sent.get(entry.key) != whole.content_hash
        and entry.key not in skip
    ]


def _self_contained(spec: AttachmentSpec) -> Processed | None:
    """Specs that carry their content (tool results, retrieval hits) need no resolver."""
    processed = getattr(spec, "processed", None)
    return processed() if callable(processed) else None


def _layer_stats(envelope: Envelope) -> list[tuple[str, int]]:
    """Deterministic counts for the report: segments per layer, compacted context segments."""
    stats = [(f"segments_{layer.name}", len(layer.segments)) for layer in envelope.layers]
    shortened = (Form.PREVIEW, Form.SUMMARY, Form.EXCERPT)
    cut_to_reference = {
        d.target
        for d in envelope.report.decisions
        if d.action is DecisionAction.NOT_SENT
    }
    compacted = sum(1 for s in envelope.l2.segments if s.form is not Form.FULL) + sum(
        1 for s in envelope.l3.segments if s.form in shortened or s.key in cut_to_reference
    )
    context = len(envelope.l2.segments) + len(envelope.l3.segments)
    return [*stats, ("context_segments", context), ("compacted_segments", compacted)]


class NoSources:
    """The resolver of a conversation given none: every attachment is refused, by name."""

    def process(self, spec: AttachmentSpec) -> Processed:
        raise ConfigError("sources", f"cannot resolve {spec.describe()}: {_NO_EDGE}")

    def parse(self, data: Mapping[str, Any]) -> AttachmentSpec:
        raise ConfigError("sources", f"cannot read the attachment {dict(data)!r}: {_NO_EDGE}")

    def with_changes(self, changes: Mapping[str, str]) -> SourceResolver:
        if not changes:
            return self
        raise ConfigError("vault_changes", f"there is no vault to change: {_NO_EDGE}")

    @property
    def kinds(self) -> AttachmentKinds:
        return NoKinds()


class NoRenderer:
    """The renderer of a conversation given none: rendering a view is refused."""

    def render(self, view: View) -> str:
        raise ConfigError("renderer", f"cannot render {view.key}: {_NO_EDGE}")


_NO_MESSAGE = Segment("", Form.TEXT, "history", "", "", 0)

_NO_EDGE = "this Conversation was made without sources/renderer (use lamina.Conversation)"
