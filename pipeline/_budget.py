"""One budget over the whole payload: L1..L5, message framing and the reserved output.

The ``budget`` stage measures the exact rendered request and, while it does not fit,
takes the next cut from an explicit order (cheapest loss and most cache-friendly first),
recording each as a decision. If nothing is left to cut it raises ``BudgetExceeded``
carrying the report. Never cut: the query, the last history turn, L1's stable part.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import attrs

from pipeline._artifacts import TurnWarning
from pipeline._assemble import assemble, complete, item_view, summary_target, visible_history
from pipeline._conversation import request_tokens
from pipeline._envelope import BudgetReport, Decision, Envelope, Form
from pipeline._errors import BudgetExceeded, ConfigError
from pipeline._graph import HistoryView, SystemPrompt, TurnGraph
from pipeline._library import LibraryEntry
from pipeline._preview import (
    ELLIPSIS,
    EXCERPT_MIN_TOKENS,
    cut_to_tokens,
    make_excerpt,
    make_preview,
)
from pipeline._profiles import get_profile
from pipeline._tokens import TokenCounter

__all__ = [
    "DEFAULT_ORDER",
    "Budget",
    "Cut",
    "Enforce",
    "compact_l1_mutable",
    "compact_l2",
    "compact_l3",
    "drop_history",
    "excerpt_non_recoverable",
    "shorten_replies",
]

Cut = Callable[[TurnGraph, Envelope], "tuple[TurnGraph, Decision] | None"]
"""One cut: the smallest next reduction of ``turn`` (and its decision), or None if none.

The envelope a cut gets is a measurement: its segments (text, tokens) are real, its
joined layer and message texts and hashes are left empty."""


def _decision(target: str, before: str, after: str, reason: str, layer: str) -> Decision:
    return Decision("budget", target, before, after, reason, layer=layer)


def drop_history(turn: TurnGraph, env: Envelope) -> tuple[TurnGraph, Decision] | None:
    """Drop the oldest whole turns, ``history_step`` at a time, never the last one."""
    assert turn.ctx.budget is not None
    shown = [entry for entry, _ in visible_history(turn)]
    if len(shown) <= 1:
        return None
    first, last = shown[0].turn, shown[-1].turn
    start = min(first + turn.ctx.budget.history_step, last)
    view = attrs.evolve(turn.history_view, start=start)
    target = f"history:{first}" if start - 1 == first else f"history:{first}-{start - 1}"
    reason = f"oldest history turns dropped (cut point moves {turn.ctx.budget.history_step} turns)"
    return attrs.evolve(turn, history_view=view), _decision(target, "text", "dropped", reason, "L4")


def shorten_replies(turn: TurnGraph, env: Envelope) -> tuple[TurnGraph, Decision] | None:
    """Shorten the oldest long reply (not the last turn's) to ``reply_tokens``."""
    budget = turn.ctx.budget
    assert budget is not None
    shown = visible_history(turn)
    for entry, reply in shown[:-1]:
        if reply is None or entry.turn in turn.history_view.shortened:
            continue
        if turn.ctx.counter.count(reply) > budget.reply_tokens:
            view = HistoryView(
                turn.history_view.start, tuple(sorted({*turn.history_view.shortened, entry.turn}))
            )
            decision = _decision(
                f"history:{entry.turn}:assistant",
                "text",
                "excerpt",
                "long old reply shortened",
                "L4",
            )
            return attrs.evolve(turn, history_view=view), decision
    return None


_NEXT_RECOVERABLE = {
    Form.FULL: Form.PREVIEW,
    Form.PREVIEW: Form.SUMMARY,
    Form.SUMMARY: Form.REFERENCE,
}


def compact_l3(turn: TurnGraph, env: Envelope) -> tuple[TurnGraph, Decision] | None:
    """Step the largest recoverable L3 item down: full -> preview -> summary -> reference."""
    sizes = {s.key: s.tokens for s in env.l3.segments}
    candidates = [
        (i, item)
        for i, item in enumerate(turn.items)
        if item.form in _NEXT_RECOVERABLE and turn.artifact(item.key).recoverable
    ]
    if not candidates:
        return None
    index, item = max(candidates, key=lambda c: (sizes.get(c[1].key, 0), -c[0]))
    to = _NEXT_RECOVERABLE[item.form]
    if to is Form.PREVIEW:
        # A short item's preview is no shorter than the item: go on to the summary.
        preview = item_view(turn, attrs.evolve(item, form=Form.PREVIEW))
        if turn.ctx.counter.count(turn.ctx.renderer.render(preview)) >= sizes.get(item.key, 0):
            to = Form.SUMMARY
    marks = item.marks
    reason = f"L3 item compacted to a {to}"
    if to is Form.REFERENCE:
        marks = (*marks, ("refetch", "not sent for lack of room: ask for it by key or path"))
        reason = "L3 item sent as a reference with a re-fetch hint"
    items = list(turn.items)
    items[index] = attrs.evolve(item, form=to, marks=marks)
    decision = _decision(item.key, str(item.form), str(to), reason, "L3")
    turn = attrs.evolve(turn, items=tuple(items))
    if to is Form.SUMMARY:
        artifact = turn.artifact(item.key)
        turn = _summary_warnings(turn, item.key, artifact.content_hash, artifact.payload.body())
    return turn, decision


def _summary_warnings(turn: TurnGraph, key: str, memo_key: str, text: str) -> TurnGraph:
    """Summarize now (memoized) so failed chunks are reported as warnings of the turn."""
    ctx = turn.ctx
    result = ctx.summaries.summarize(ctx.summarizer, memo_key, text, summary_target(turn, text))
    if not result.failures:
        return turn
    notes = tuple(
        TurnWarning("summary-failed", key, f"summary: {failure}") for failure in result.failures
    )
    return attrs.evolve(turn, warnings=(*turn.warnings, *notes))


def _l2_step(turn: TurnGraph, entry: LibraryEntry) -> LibraryEntry | None:
    ctx = turn.ctx
    assert ctx.budget is not None
    view = entry.view
    if not view.recoverable:
        return None
    if view.form is Form.FULL:
        preview = make_preview(
            view.body,
            ctx.counter,
            max_sections=ctx.policy.max_sections,
            section_tokens=ctx.policy.section_tokens,
            headless_tokens=ctx.policy.headless_tokens,
        )
        new = attrs.evolve(view, form=Form.PREVIEW, body=preview.text)
    elif view.form is Form.PREVIEW:
        summary = ctx.summaries.summarize(
            ctx.summarizer, f"{view.content_hash}:l2", view.body, summary_target(turn, view.body)
        )
        new = attrs.evolve(view, form=Form.SUMMARY, body=summary.text)
    elif view.form is Form.SUMMARY:
        new = attrs.evolve(view, form=Form.REFERENCE, body="", marks=(("evicted", "true"),))
    else:
        return None
    text = ctx.renderer.render(new)
    return LibraryEntry(new, text, ctx.counter.count(text), entry.turn)


def compact_l2(turn: TurnGraph, env: Envelope) -> tuple[TurnGraph, Decision] | None:
    """Step the oldest L2 entry down: -> preview -> summary -> evicted stub (key, title, path).

    Entries this turn refers to are compacted last, so a reference keeps its content.
    """
    referenced = {i.key for i in turn.items if i.form is Form.REFERENCE}
    ordered = sorted(turn.library.entries, key=lambda e: e.key in referenced)
    for entry in ordered:
        new = _l2_step(turn, entry)
        if new is None:
            continue
        to = "evicted" if new.form is Form.REFERENCE else str(new.form)
        reason = (
            "library entry evicted to a stub that keeps key, title and locator"
            if to == "evicted"
            else f"library entry compacted to a {to}"
        )
        decision = _decision(entry.key, str(entry.form), to, reason, "L2")
        out = attrs.evolve(turn, library=turn.library.replace(new, turn.ctx.counter))
        if new.form is Form.SUMMARY:
            out = _summary_warnings(out, entry.key, f"{entry.content_hash}:l2", entry.view.body)
        return out, decision
    return None


def compact_l1_mutable(turn: TurnGraph, env: Envelope) -> tuple[TurnGraph, Decision] | None:
    """Compact L1's mutable part (memory, project overlays): preview, then halve it."""
    text = turn.system.mutable
    counter = turn.ctx.counter
    tokens = counter.count(text)
    if tokens <= EXCERPT_MIN_TOKENS:
        return None
    preview = make_preview(text, counter, section_tokens=turn.ctx.policy.section_tokens).text
    if counter.count(preview) < tokens:
        new, to = preview, "preview"
    else:
        new, to = cut_to_tokens(text, counter, tokens // 2) + " " + ELLIPSIS, "excerpt"
    system = SystemPrompt(turn.system.stable, new)
    decision = _decision("system:mutable", "text", to, "L1 mutable part compacted", "L1")
    return attrs.evolve(turn, system=system), decision


def excerpt_non_recoverable(turn: TurnGraph, env: Envelope) -> tuple[TurnGraph, Decision] | None:
    """Halve the largest non-recoverable item as a marked head+tail excerpt (never summarize)."""
    sizes = {s.key: s.tokens for s in env.l3.segments}
    best = None
    for i, item in enumerate(turn.items):
        if turn.artifact(item.key).recoverable or item.form not in (Form.FULL, Form.EXCERPT):
            continue
        current = item.limit if item.form is Form.EXCERPT else sizes.get(item.key, 0)
        limit = current // 2
        if limit >= EXCERPT_MIN_TOKENS and (best is None or current > best[2]):
            best = (i, item, current, limit)
    if best is not None:
        i, item, _, limit = best
        items = list(turn.items)
        items[i] = attrs.evolve(item, form=Form.EXCERPT, limit=limit)
        reason = f"non-recoverable item cut to a {limit}-token excerpt (head and tail kept)"
        return attrs.evolve(turn, items=tuple(items)), _decision(
            item.key, str(item.form), "excerpt", reason, "L3"
        )
    for entry in turn.library.entries:
        view = entry.view
        if view.recoverable or view.form is not Form.FULL:
            continue
        limit = entry.tokens // 2
        if limit < EXCERPT_MIN_TOKENS:
            continue
        body = make_excerpt(view.body, turn.ctx.counter, limit).text
        new_view = attrs.evolve(view, form=Form.EXCERPT, body=body)
        text = turn.ctx.renderer.render(new_view)
        new = LibraryEntry(new_view, text, turn.ctx.counter.count(text), entry.turn)
        decision = _decision(
            entry.key, "full", "excerpt", "non-recoverable library entry cut to an excerpt", "L2"
        )
        return attrs.evolve(turn, library=turn.library.replace(new, turn.ctx.counter)), decision
    return None


DEFAULT_ORDER: tuple[Cut, ...] = (
    drop_history,
    shorten_replies,
    compact_l3,
    compact_l2,
    compact_l1_mutable,
    excerpt_non_recoverable,
)


def _positive(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value <= 0:
        raise ConfigError(f"budget.{attribute.name}", f"must be a positive number, got {value}")


@attrs.frozen
class Budget:
    """The whole-payload budget of one model: window, reserved output, framing, cut order.

    Counts are exact (tiktoken). Where a profile says the provider's tokenizer is not
    available locally, counts are scaled by ``1 + safety_margin`` before comparing.
    """

    context_window: int = attrs.field(validator=_positive)
    reserve_output: int = 4096
    per_message_tokens: int = 3
    priming_tokens: int = 3
    safety_margin: float = 0.0
    history_step: int = attrs.field(default=4, validator=_positive)
    reply_tokens: int = attrs.field(default=400, validator=_positive)
    summary_tokens: int = attrs.field(default=256, validator=_positive)
    order: tuple[Cut, ...] = attrs.field(default=DEFAULT_ORDER, eq=False)

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.reserve_output < self.context_window:
            raise ConfigError(
                "budget.reserve_output",
                f"must be >= 0 and below the window ({self.context_window}), "
                f"got {self.reserve_output}",
            )
        if not 0.0 <= self.safety_margin < 1.0:
            raise ConfigError(
                "budget.safety_margin", f"must be in [0, 1), got {self.safety_margin}"
            )

    @classmethod
    def for_model(cls, name: str, **overrides: object) -> Budget:
        """The budget of a model profile (``get_profile``); keyword arguments override."""
        profile = get_profile(name)
        fields: dict[str, object] = {
            "context_window": profile.context_window,
            "reserve_output": profile.default_output_reserve,
            "per_message_tokens": profile.per_message_tokens,
            "priming_tokens": profile.priming_tokens,
            "safety_margin": 0.0 if profile.exact_tokens else profile.safety_margin,
        }
        fields.update(overrides)
        return cls(**fields)  # type: ignore[arg-type]

    @property
    def limit(self) -> int:
        """The most request tokens (as counted locally) that may be sent."""
        return math.floor((self.context_window - self.reserve_output) / (1.0 + self.safety_margin))

    def effective(self, tokens: int) -> int:
        return math.ceil(tokens * (1.0 + self.safety_margin))

    def report(
        self,
        used: int,
        before: tuple[tuple[str, int], ...],
        after: tuple[tuple[str, int], ...],
        decisions: Sequence[Decision],
    ) -> BudgetReport:
        """The report of a fit: this budget's window and limit, the use, and the cuts."""
        return BudgetReport(
            window=self.context_window,
            reserve_output=self.reserve_output,
            limit=self.limit,
            used=used,
            effective=self.effective(used),
            before=before,
            after=after,
            decisions=tuple(decisions),
        )

    def used(self, env: Envelope, counter: TokenCounter) -> int:
        """Exact request tokens of ``env`` with this budget's message framing."""
        return request_tokens(
            env, counter, per_message=self.per_message_tokens, priming=self.priming_tokens
        )


def _layer_tokens(env: Envelope) -> tuple[tuple[str, int], ...]:
    return tuple((str(layer.name), layer.tokens) for layer in env.layers)


@attrs.frozen
class Enforce:
    """The budget stage: fit the exact rendered request into the window, or raise."""

    name: str = "budget"
    after: tuple[str, ...] = ("reference",)
    before: tuple[str, ...] = ("promote",)

    def __call__(self, turn: TurnGraph) -> TurnGraph:
        budget = turn.ctx.budget
        if budget is None:
            return turn
        env = assemble(turn, measure_only=True)
        used = budget.used(env, turn.ctx.counter)
        before = _layer_tokens(env)
        decisions: list[Decision] = []
        while budget.effective(used) > budget.limit:
            for cut in budget.order:
                step = cut(turn, env)
                if step is not None:
                    break
            else:
                report = budget.report(used, before, _layer_tokens(env), decisions)
                raise BudgetExceeded(
                    f"turn {turn.ctx.turn}: {budget.effective(used)} tokens do not fit "
                    "the limit of "
                    f"{budget.limit} (window {budget.context_window} - reserve "
                    f"{budget.reserve_output}) even after {len(decisions)} cuts",
                    report,
                )
            turn, decision = step
            env = assemble(turn, measure_only=True)
            now = budget.used(env, turn.ctx.counter)
            decisions.append(attrs.evolve(decision, tokens_saved=used - now))
            used = now
        report = budget.report(used, before, _layer_tokens(env), decisions)
        measured = (complete(env, turn), turn.render_inputs())
        return attrs.evolve(turn, budget_report=report, measured=measured).decide(*decisions)
