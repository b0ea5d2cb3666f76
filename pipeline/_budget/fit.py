"""One budget over the whole payload: L1..L5, message framing and the reserved output.

The ``budget`` stage measures the exact rendered request and first gives cut library
entries back their fuller forms when the plan's schedule allows (``restore``); then, while
the request does not fit, it cuts, recording each cut as a decision. The default policy,
``current-first``, follows the ``BudgetPlan``: library stubs over their share collapse into
indexes (``stubs``); the library is cut one form at a time across its entries down to its
floor, then history down to its last turns, then this turn's items to the largest preview
size that fits, then L1's memory and excerpts; only then do the floors give way; then
folder and tag groups' items are listed in one index each (``index.plan_index``), then
sent as honest not-sent references. Cuts are chosen from known counts and the request is
measured once per round. ``prefix-first`` (and any explicit ``order``) takes one cut at a
time from an order. If nothing is left to cut it raises ``BudgetExceeded``
carrying the report. Never cut: the query, the last history turn, L1's stable part.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from collections.abc import Callable, Sequence
from typing import Literal

import attrs

from lamina.pipeline._budget import engine
from lamina.pipeline._budget.index import (
    INDEX_SOURCE,
    is_index,
    is_omitted_only,
    plan_index,
    settle_empty,
)
from lamina.pipeline._budget.settings import BudgetSettings
from lamina.pipeline._budget.stubs import fold, plan_stubs, refold, settle_stubs, stub_group
from lamina.pipeline._errors import ConfigError
from lamina.pipeline._hashing import text_hash
from lamina.pipeline._model.artifacts import TurnWarning
from lamina.pipeline._model.envelope import (
    NOT_SENT,
    BudgetReport,
    Decision,
    DecisionAction,
    DecisionLayer,
    Envelope,
    Form,
    View,
)
from lamina.pipeline._model.library import Library, LibraryEntry
from lamina.pipeline._model.recall import Retriever
from lamina.pipeline._model.tools import chunk_source
from lamina.pipeline._tokens.counter import TokenCounter
from lamina.pipeline._tokens.profiles import (
    CHAT_TEMPLATES,
    Framing,
    framing_of,
    get_profile,
)
from lamina.pipeline._turn.assemble import draft, item_view, summary_target, visible_history
from lamina.pipeline._turn.draft import Draft
from lamina.pipeline._turn.graph import HistoryView, Placement, SystemPrompt, TurnGraph
from lamina.pipeline._turn.measure import request_tokens
from lamina.pipeline._views.preview import (
    ELLIPSIS,
    EXCERPT_MIN_TOKENS,
    cut_to_tokens,
    fitted_preview_of,
    make_excerpt,
    make_preview,
)
from lamina.pipeline._views.views import body_preview, reference_view

__all__ = [
    "CUT_POLICIES",
    "DEFAULT_ORDER",
    "MIN_PREVIEW_TOKENS",
    "NOT_SENT_HINT",
    "PREFIX_FIRST_ORDER",
    "Budget",
    "Cut",
    "CutPolicy",
    "Enforce",
    "TurnFitting",
    "compact_l1_mutable",
    "compact_l2",
    "compact_l3",
    "drop_history",
    "excerpt_non_recoverable",
    "restore",
    "shorten_replies",
    "slack_of",
    "turn_fitting",
    "turn_plans",
]

Cut = Callable[[TurnGraph, Draft], "tuple[TurnGraph, Decision] | None"]
"""One cut: the smallest next reduction of ``turn`` (and its decision), or None if none.

It gets the turn's ``Draft``: each layer's segments (text, tokens) and exact counts."""


def _decision(
    target: str,
    before: str,
    after: str,
    reason: str,
    layer: str,
    saved: int = 0,
    *,
    action: DecisionAction,
) -> Decision:
    return Decision("budget", target, before, after, reason, saved, layer=layer, action=action)


def drop_history(turn: TurnGraph, env: Draft) -> tuple[TurnGraph, Decision] | None:
    """Drop the oldest whole turns, ``history_step`` at a time, never the last one."""
    return _drop_history(turn, 1)


def _drop_history(turn: TurnGraph, keep: int) -> tuple[TurnGraph, Decision] | None:
    """``drop_history`` that keeps the last ``keep`` turns (at least one)."""
    assert turn.ctx.budget is not None
    shown = [entry for entry, _ in visible_history(turn)]
    keep = max(1, keep)
    if len(shown) <= keep:
        return None
    first, last = shown[0].turn, shown[-keep].turn
    start = min(first + turn.ctx.budget.history_step, last)
    view = attrs.evolve(turn.history_view, start=start)
    target = f"history:{first}" if start - 1 == first else f"history:{first}-{start - 1}"
    reason = f"oldest history turns dropped (cut point moves {turn.ctx.budget.history_step} turns)"
    return attrs.evolve(turn, history_view=view), _decision(
        target, "text", "dropped", reason, "L4", action=DecisionAction.HISTORY_CUT
    )


def shorten_replies(turn: TurnGraph, env: Draft) -> tuple[TurnGraph, Decision] | None:
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
                action=DecisionAction.SHORTENED,
            )
            return attrs.evolve(turn, history_view=view), decision
    return None


NOT_SENT_HINT = "true"  # NOT_SENT_INTRO, above the list, says how to get the item
MIN_PREVIEW_TOKENS = 64
"""The smallest preview block this turn's items are cut to before they go unsent."""

_NEXT_RECOVERABLE = {
    Form.FULL: Form.PREVIEW,
    Form.PREVIEW: Form.SUMMARY,
    Form.SUMMARY: Form.REFERENCE,
}


def compact_l3(turn: TurnGraph, env: Draft) -> tuple[TurnGraph, Decision] | None:
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
        marks = (*marks, (NOT_SENT, NOT_SENT_HINT))
        reason = "L3 item not sent for lack of room (a not-sent reference says how to get it)"
    items = list(turn.items)
    items[index] = attrs.evolve(item, form=to, marks=marks)
    action = DecisionAction.NOT_SENT if to is Form.REFERENCE else DecisionAction.COMPACTED
    decision = _decision(item.key, str(item.form), str(to), reason, "L3", action=action)
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


def _l2_summary_key(view: View) -> str:
    """The memo key of a library entry's summary: its content and the body summarized (a
    preview's, which differs with how it was fitted), so two conversations whose entries
    of the same note were cut differently do not share a summary through the process's
    pool (the second would get the first's, and decide from its size)."""
    return f"{view.content_hash}:l2:{text_hash(view.body)}"


def _summary_source(turn: TurnGraph, entry: LibraryEntry) -> tuple[str, str]:
    """The memo key and the text a library entry's summary is made from: the policy's
    preview of its whole form (or that form, if it entered the library as a preview),
    whatever preview it holds now, so a preview sized to a turn's need summarizes like
    any other, from what the promotion ranked ahead (``_prepare_summaries``)."""
    whole = entry.whole_view
    body = entry.view.body
    if whole.form is Form.FULL:
        ctx = turn.ctx
        body = body_preview(whole.body, ctx.counter, ctx.policy, ctx.views).text
    elif whole.form is Form.PREVIEW:
        body = whole.body
    return _l2_summary_key(attrs.evolve(whole, body=body)), body


def _l2_step(turn: TurnGraph, entry: LibraryEntry) -> LibraryEntry | None:
    ctx = turn.ctx
    assert ctx.budget is not None
    view = entry.view
    if not view.recoverable or view.source_type == INDEX_SOURCE:  # an index is its own cut
        return None
    if view.form is Form.FULL:
        preview = body_preview(view.body, ctx.counter, ctx.policy, ctx.views)
        new = attrs.evolve(view, form=Form.PREVIEW, body=preview.text)
    elif view.form is Form.PREVIEW:
        key, body = _summary_source(turn, entry)
        summary = ctx.summaries.summarize(ctx.summarizer, key, body, summary_target(turn, body))
        new = attrs.evolve(view, form=Form.SUMMARY, body=summary.text)
    elif view.form is Form.SUMMARY:
        new = attrs.evolve(view, form=Form.REFERENCE, body="", marks=(("evicted", "true"),))
    else:
        return None
    text = ctx.renderer.render(new)
    return LibraryEntry(
        new, text, ctx.counter.count(text), entry.turn, entry.full_tokens, whole=entry.whole_view
    )


def compact_l2(turn: TurnGraph, env: Draft) -> tuple[TurnGraph, Decision] | None:
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
        action = DecisionAction.EVICTED if to == "evicted" else DecisionAction.COMPACTED
        out = attrs.evolve(turn, library=turn.library.replace(new))
        if to == "evicted" and entry.key in referenced:
            # A reference must not point at a stub: the re-attached item is listed as not sent.
            out, _ = _unsend(out, {entry.key})
            reason += "; this turn's reference to it is listed as not sent"
        decision = _decision(entry.key, str(entry.form), to, reason, "L2", action=action)
        if new.form is Form.SUMMARY:
            summary_key, source = _summary_source(turn, entry)
            out = _summary_warnings(out, entry.key, summary_key, source)
        return out, decision
    return None


def compact_l1_mutable(turn: TurnGraph, env: Draft) -> tuple[TurnGraph, Decision] | None:
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
    compacted = DecisionAction.COMPACTED
    reason = "L1 mutable part compacted"
    decision = _decision("system:mutable", "text", to, reason, "L1", action=compacted)
    return attrs.evolve(turn, system=system), decision


def excerpt_non_recoverable(turn: TurnGraph, env: Draft) -> tuple[TurnGraph, Decision] | None:
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
            item.key, str(item.form), "excerpt", reason, "L3", action=DecisionAction.EXCERPTED
        )
    referenced = {i.key for i in turn.items if i.form is Form.REFERENCE}
    for entry in turn.library.entries:
        view = entry.view
        if view.recoverable or view.form is not Form.FULL or entry.key in referenced:
            continue  # (a reference must find its entry whole)
        limit = entry.tokens // 2
        if limit < EXCERPT_MIN_TOKENS:
            continue
        body = make_excerpt(view.body, turn.ctx.counter, limit).text
        new_view = attrs.evolve(view, form=Form.EXCERPT, body=body)
        text = turn.ctx.renderer.render(new_view)
        new = LibraryEntry(
            new_view,
            text,
            turn.ctx.counter.count(text),
            entry.turn,
            entry.full_tokens,
            whole=entry.whole_view,
        )
        decision = _decision(
            entry.key,
            "full",
            "excerpt",
            "non-recoverable library entry cut to an excerpt",
            "L2",
            action=DecisionAction.EXCERPTED,
        )
        return attrs.evolve(turn, library=turn.library.replace(new)), decision
    return None


PREFIX_FIRST_ORDER: tuple[Cut, ...] = (
    drop_history,
    shorten_replies,
    compact_l3,
    compact_l2,
    compact_l1_mutable,
    excerpt_non_recoverable,
)
"""The old default: this turn's items before the library, for the longest cached prefix."""

DEFAULT_ORDER: tuple[Cut, ...] = (
    compact_l2,
    drop_history,
    shorten_replies,
    compact_l1_mutable,
    compact_l3,
    excerpt_non_recoverable,
)
"""The current-first order one cut at a time (the default policy plans it in rounds)."""

CutPolicy = Literal["objective", "current-first", "prefix-first"]
CUT_POLICIES: dict[str, tuple[Cut, ...]] = {
    "objective": DEFAULT_ORDER,
    "current-first": DEFAULT_ORDER,
    "prefix-first": PREFIX_FIRST_ORDER,
}


@attrs.frozen
class Budget(BudgetSettings):
    """The whole-payload budget of one model: window, reserved output, framing, cut order.

    Counts are exact (tiktoken). Where a profile says the provider's tokenizer is not
    available locally, counts are scaled by ``1 + safety_margin`` before comparing.
    """

    order: tuple[Cut, ...] = attrs.field(
        default=attrs.Factory(lambda self: CUT_POLICIES.get(self.policy, ()), takes_self=True),
        eq=False,
    )

    def __attrs_post_init__(self) -> None:
        if self.policy not in CUT_POLICIES:
            raise ConfigError(
                "budget.policy",
                f"must be one of {', '.join(CUT_POLICIES)}, got {self.policy!r}",
            )
        if self.chat_template not in CHAT_TEMPLATES:
            raise ConfigError(
                "budget.chat_template",
                f"must be one of {', '.join(CHAT_TEMPLATES)}, got {self.chat_template!r}",
            )
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
        if not isinstance(name, str):
            raise ConfigError("model", f"must be a model name (str), got {type(name).__name__}")
        unknown = sorted(set(overrides) - {f.name for f in attrs.fields(cls)})
        if unknown:
            raise ConfigError(
                "budget",
                f"unknown setting(s) {', '.join(unknown)} "
                f"(known: {', '.join(f.name for f in attrs.fields(cls))})",
            )
        profile = get_profile(name)
        fields: dict[str, object] = {
            "context_window": profile.context_window,
            "reserve_output": profile.default_output_reserve,
            "per_message_tokens": profile.per_message_tokens,
            "priming_tokens": profile.priming_tokens,
            "safety_margin": 0.0 if profile.exact_tokens else profile.safety_margin,
            "tokenizer": profile.tokenizer,
            "content_lead": profile.content_lead,
            "trim_content": profile.trim_content,
            "chat_template": profile.chat_template,
            "tool_call_tokens": profile.tool_call_tokens,
            "default_system": profile.default_system,
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
            plan=(
                *self.plan.fields(),
                ("library_floor_tokens", str(math.floor(self.limit * self.plan.library_floor))),
                ("slack_tokens", str(math.floor(self.limit * self.plan.slack))),
            ),
        )

    @property
    def framing(self) -> Framing:
        """The chat framing this budget counts around contents (from the model profile)."""
        return framing_of(self)

    def used(self, env: Envelope | Draft, counter: TokenCounter) -> int:
        """Exact request tokens of ``env`` with this budget's message framing."""
        return request_tokens(env, counter, self.framing)


@attrs.frozen
class _Fitting:
    """The engine's state for a turn: the turn, its draft and the request's exact tokens."""

    turn: TurnGraph
    draft: Draft
    used: int

    def layer_tokens(self) -> tuple[tuple[str, int], ...]:
        return self.draft.layer_tokens()


TurnFitting = _Fitting
"""The engine's state of a turn (its graph, draft and count), as an agent loop keeps it."""


Plan = Callable[[TurnGraph, Draft, int, Budget], "tuple[TurnGraph, list[Decision]] | None"]


def _step(plan: Plan, budget: Budget) -> engine.Plan[_Fitting]:
    """``plan`` as an engine plan: the cut turn is drafted again from the last draft (only
    the blocks the cut changed are rendered and counted) and measured."""

    def run(state: _Fitting, over: int) -> tuple[_Fitting, list[Decision]] | None:
        step = plan(state.turn, state.draft, over, budget)
        if step is None:
            return None
        turn, made = step
        drafted = draft(turn, state.draft)
        return _Fitting(turn, drafted, budget.used(drafted, turn.ctx.counter)), made

    return run


def _too_big(budget: Budget) -> Callable[[_Fitting, int], str]:
    def message(state: _Fitting, cuts: int) -> str:
        return (
            f"turn {state.turn.ctx.turn}: {budget.effective(state.used)} tokens do not fit the "
            f"limit of {budget.limit} (window {budget.context_window} - reserve "
            f"{budget.reserve_output}) even after {cuts} cuts"
        )

    return message


@attrs.frozen
class Enforce:
    """The budget stage: fit the exact rendered request into the window, or raise.

    The default policy plans its cuts in rounds from known counts (``_PLANS``); any other
    order takes one cut at a time. Both run on the fitting engine over the turn's draft."""

    name: str = "budget"
    after: tuple[str, ...] = ("reference",)
    before: tuple[str, ...] = ("promote",)
    retriever: Callable[[], Retriever] | None = None
    """What ranks units by relevance to the query for the objective policy."""

    def __call__(self, turn: TurnGraph) -> TurnGraph:
        budget = turn.ctx.budget
        if budget is None:
            return turn
        if budget.policy == "objective" and budget.order is DEFAULT_ORDER:
            from lamina.pipeline._budget.objective import Solve

            return Solve(retriever=self.retriever)(turn)
        if _planned(budget):
            # The library as the model last saw it: an edited note's preview leads with
            # what changed since.
            turn = attrs.evolve(turn, seen=turn.library)
        drafted = draft(turn)
        used = budget.used(drafted, turn.ctx.counter)
        before = drafted.layer_tokens()
        restored: list[Decision] = []
        if budget.plan.restore:
            back = restore(turn, used, budget, drafted)
            if back is not None:
                turn, restored = back
                drafted = draft(turn, drafted)
                used = budget.used(drafted, turn.ctx.counter)
            if budget.effective(used) > budget.limit:
                swapped = _swap_resent(turn)
                if swapped is not None:
                    turn, more = swapped
                    restored += more
                    drafted = draft(turn, drafted)
                    used = budget.used(drafted, turn.ctx.counter)
        start = _Fitting(turn, drafted, used)
        steps = turn_plans(budget)
        done, report = engine.fit(start, steps, budget, _too_big(budget), before)
        done, report = _settle(done, report, steps, budget)
        if budget.plan.restore:
            done, report = _refill(turn.library, done, report, steps, budget)
        if restored:
            report = attrs.evolve(report, decisions=(*restored, *report.decisions))
        slack = str(slack_of(done.turn, budget, done.draft))
        plan = tuple((k, slack if k == "slack_tokens" else v) for k, v in report.plan)
        report = attrs.evolve(report, plan=plan)
        decided = attrs.evolve(done.turn, budget_report=report, measured=done.draft)
        return decided.decide(*report.decisions)


def slack_of(turn: TurnGraph, budget: Budget, measured: Draft) -> int:
    """The room a cut leaves free beyond the excess, a restore after it and a refill up
    to: what the conversation's last ``BudgetPlan.slack_turns`` turns added to history
    (queries and replies with their framing, from ``measured``'s L4; while it has fewer
    turns, or history no longer shows some, the mean of those it shows stands for the
    rest), at most ``slack`` of the limit; ``slack`` of the limit before the first reply,
    or with ``slack_turns`` 0. The steady growth is what a slack can absorb: an
    attachment comes in a step no slack would."""
    plan = budget.plan
    cap = math.floor(budget.limit * plan.slack)
    n = plan.slack_turns
    first = turn.ctx.turn - n
    if not n:
        return cap
    sizes: dict[int, int] = {}
    for seg in measured.l4.segments:
        parts = seg.key.split(":")
        if len(parts) > 2 and parts[0] == "history" and parts[1].isdigit():
            at = int(parts[1])
            if at >= first:
                sizes[at] = sizes.get(at, 0) + seg.tokens + budget.per_message_tokens
    if not sizes:
        return cap
    return min(cap, sum(sizes.values()) * n // len(sizes))


def _refill(
    library: Library,
    done: _Fitting,
    report: BudgetReport,
    steps: Sequence[engine.Plan[_Fitting]],
    budget: Budget,
) -> tuple[_Fitting, BudgetReport]:
    """A turn whose fit cut the library breaks the cached prefix at the first entry it
    changed: cut entries after that point are given back the fullest forms that fit
    (``restore``'s order, indexes folded before this turn partly unfolded), up to the
    limit less the plan's slack. A cut's forms and folds come in steps (a preview, a
    group's index), so the fit often frees more than the excess and the slack; this
    gives back what it took beyond them, in the turn that breaks the prefix anyway. Not
    where the fit cut anything but the library: this turn's items and history come
    first. ``library``: the library before the fit."""
    if any(d.layer is not DecisionLayer.L2 for d in report.decisions):
        return done, report  # this turn's items (or history) gave way: they come first
    now = done.turn.library.entries
    start = next(
        (i for i, (a, b) in enumerate(zip(library.entries, now, strict=False)) if a is not b),
        min(len(library.entries), len(now)),
    )
    if start >= len(now) and len(now) == len(library.entries):
        return done, report
    room = budget.limit - budget.effective(done.used) - slack_of(done.turn, budget, done.draft)
    if room <= 0:
        return done, report
    old = {id(e) for e in library.entries}
    turn, decisions, gained, _ = _restored(done.turn, room, start)
    turn, unfolded, _ = _unfolded(turn, room - gained, start, keep=old)
    decisions += unfolded
    if not decisions:
        return done, report
    drafted = draft(turn, done.draft)
    state = _Fitting(turn, drafted, budget.used(drafted, turn.ctx.counter))
    done, refit = engine.fit(state, steps, budget, _too_big(budget), before=report.before)
    report = attrs.evolve(refit, decisions=(*report.decisions, *decisions, *refit.decisions))
    return done, report


def _swap_resent(turn: TurnGraph) -> tuple[TurnGraph, list[Decision]] | None:
    """Items this turn re-attaches, sent in full because a budget cut their library
    entries, refer to those entries restored whole instead; only in a turn that must cut
    (the prefix breaks anyway): sent in L3, the item would go again next turn and the
    cuts made for it would be restored then, breaking the prefix twice for one re-send."""
    ctx = turn.ctx
    library = turn.library
    items = list(turn.items)
    decisions: list[Decision] = []
    for i, item in enumerate(items):
        entry = library.get(item.key)
        if item.form is not Form.FULL or entry is None or entry.whole is None:
            continue
        whole = entry.whole
        same = whole.content_hash == turn.artifact(item.key).content_hash
        if whole.form is not Form.FULL or not same or not whole.recoverable:
            continue  # (a non-recoverable entry is excerpted in place: not one to refer to)
        text = ctx.renderer.render(whole)
        new = LibraryEntry(whole, text, ctx.counter.count(text), entry.turn, entry.full_tokens)
        library = library.replace(new)
        marks = tuple(m for m in item.marks if m[0] != "library")
        items[i] = attrs.evolve(item, form=Form.REFERENCE, marks=marks)
        reason = "library entry restored whole: this turn re-attaches it"
        decisions += [
            _decision(entry.key, str(entry.form), "full", reason, "L2", entry.tokens - new.tokens,
                      action=DecisionAction.RESTORED),
            _decision(item.key, "full", "reference", "re-attached item refers to its library "
                      "entry, restored whole", "L3", action=DecisionAction.REFERENCED),
        ]  # fmt: skip
    if not decisions:
        return None
    return attrs.evolve(turn, library=library, items=tuple(items)), decisions


def _settle(
    done: _Fitting, report: BudgetReport, steps: Sequence[engine.Plan[_Fitting]], budget: Budget
) -> tuple[_Fitting, BudgetReport]:
    """The fitted turn with its library's stubs under their share (``stubs.settle_stubs``)
    and no block that holds only an omitted-sections line (``index.settle_empty``); both
    only save tokens, so a fit again is a rare safety net."""
    for _ in range(3):
        made: list[Decision] = []
        turn = done.turn
        for settle in (settle_stubs, settle_empty):
            settled = settle(turn, done.draft)
            if settled is not None:
                turn, more = settled
                made.extend(more)
        if not made:
            break
        drafted = draft(turn, done.draft)
        state = _Fitting(turn, drafted, budget.used(drafted, turn.ctx.counter))
        done, refit = engine.fit(state, steps, budget, _too_big(budget), before=report.before)
        report = attrs.evolve(refit, decisions=(*report.decisions, *made, *refit.decisions))
    return done, report


def _planned(budget: Budget) -> bool:
    return budget.policy in ("objective", "current-first") and budget.order is DEFAULT_ORDER


def turn_plans(budget: Budget) -> tuple[engine.Plan[_Fitting], ...]:
    """The turn's cut order as engine plans (the default policy's rounds, or one cut at a
    time from ``budget.order``): the budget stage's, and an agent loop's once its own
    cuts of tool results are spent, so both cut library and history in one order."""
    plans = _PLANS if _planned(budget) else tuple(_single(cut) for cut in budget.order)
    return tuple(_step(plan, budget) for plan in plans)


def turn_fitting(turn: TurnGraph, measured: Draft, budget: Budget) -> _Fitting:
    """The engine's state of a turn already measured (``measured``), for ``turn_plans``."""
    return _Fitting(turn, measured, budget.used(measured, turn.ctx.counter))


# -- reversible cuts: cut library entries given back their fuller forms --


def _breaks_at(turn: TurnGraph) -> int | None:
    """Where this turn's cached prefix breaks before the budget acts: 0 when L1 changed,
    an entry's position when the library changed it in place (a refresh), else None.
    Read from the turn's decisions, so a restored conversation decides the same."""
    at: int | None = None
    positions = {key: i for i, key in enumerate(turn.library.keys())} if turn.decisions else {}
    for d in turn.decisions:
        if d.layer is DecisionLayer.L1:
            return 0
        if d.layer is DecisionLayer.L2 and d.target in positions:
            i = positions[d.target]
            at = i if at is None else min(at, i)
    return at


def _fuller(
    turn: TurnGraph, entry: LibraryEntry, room: int, *, whole_only: bool
) -> LibraryEntry | None:
    """The fullest form of cut ``entry`` (its whole form, then, unless ``whole_only``,
    each cut of that) that is larger than it is now and grows it by at most ``room``
    tokens, or None."""
    ctx = turn.ctx
    whole = entry.whole_view
    text = ctx.renderer.render(whole)
    form: LibraryEntry | None = LibraryEntry(
        whole, text, ctx.counter.count(text), entry.turn, entry.full_tokens
    )
    while form is not None and form.tokens > entry.tokens:
        if form.tokens - entry.tokens <= room:
            return form
        form = None if whole_only else _l2_step(turn, form)
    return None


def _restored(
    turn: TurnGraph, room: int, start: int
) -> tuple[TurnGraph, list[Decision], int, int | None]:
    """Cut entries at positions ``start`` on given their fullest forms within ``room``:
    whole forms first, the largest growth first (so no entry is left cut whose whole form
    alone would fit), then shortened forms, oldest first. The turn, the decisions, the
    tokens given back and the first position restored."""
    sent = {i.key for i in turn.items if i.form is not Form.REFERENCE}
    library = turn.library
    cut = [
        i
        for i, e in enumerate(library.entries)
        if i >= start and e.cut and e.key not in sent
        and not (e.whole_view.form is Form.FULL and e.full_tokens - e.tokens > room)
    ]  # fmt: skip (a full block known to be too large is not rendered to find out)
    wholes = []
    for i in cut:
        new = _fuller(turn, library.entries[i], room, whole_only=True)
        if new is not None:
            wholes.append((new.tokens - library.entries[i].tokens, i, new))
    wholes.sort(key=lambda c: (-c[0], c[1]))
    decisions: list[Decision] = []
    gained = 0
    first: int | None = None

    def take(i: int, new: LibraryEntry) -> None:
        nonlocal library, gained, first
        entry = library.entries[i]
        gain = new.tokens - entry.tokens
        gained += gain
        first = i if first is None else min(first, i)
        reason = f"library entry restored to a {new.form} (room freed up)"
        decisions.append(
            _decision(
                entry.key, str(entry.form), str(new.form), reason, "L2", -gain,
                action=DecisionAction.RESTORED,
            )
        )  # fmt: skip
        library = library.replace(new)

    for gain, i, new in wholes:
        if gain <= room - gained:
            take(i, new)
    for i in cut:
        entry = library.entries[i]
        if entry.cut and gained < room:
            ahead = attrs.evolve(turn, library=library)
            new = _fuller(ahead, entry, room - gained, whole_only=False)
            if new is not None:
                take(i, new)
    return attrs.evolve(turn, library=library), decisions, gained, first


def _unfolded(
    turn: TurnGraph, room: int, start: int, *, keep: set[int] | None = None
) -> tuple[TurnGraph, list[Decision], int]:
    """Library indexes at positions ``start`` on (stubs collapsed past their share) given
    back, oldest first, as the entries they fold in their whole forms: all of them when
    they fit in ``room`` together, else as many of the first as fit, in the index's place,
    before the index of the rest (so one large index is not all-or-nothing, and a fold
    deeper than a turn needed is undone as far as room allows). An entry whose key is in
    the library again, or sent this turn, stays out. The turn, the decisions and the
    tokens given back. ``keep``: only the indexes of these ids (not one folded this turn,
    whose entries would come back in other places)."""
    sent = {i.key for i in turn.items if i.form is not Form.REFERENCE}
    library = turn.library
    decisions: list[Decision] = []
    gained = 0
    for index in [e for e in library.entries[start:] if e.folded]:
        if keep is not None and id(index) not in keep:
            continue
        taken = set(library.keys()) | sent  # an entry comes back once, where it is not
        stays: list[LibraryEntry] = []
        for entry in index.folded:
            if entry.key not in taken:
                taken.add(entry.key)
                stays.append(entry)
        wholes = [_fuller(turn, entry, room - gained, whole_only=True) for entry in stays]
        back = [w if w is not None else e for w, e in zip(wholes, stays, strict=True)]
        growth = sum(e.tokens for e in back) - index.tokens
        if back and 0 < growth <= room - gained:
            library = library.unfold(index.key, back)
            rest: LibraryEntry | None = None
        else:
            part = _part_unfolded(turn, index, stays, wholes, room - gained)
            if part is None:
                continue
            back, rest, growth = part
            library = library.unfold(index.key, [*back, rest])
        gained += growth
        if rest is None:
            reason = "library index unfolded: the entries it listed come back (room freed up)"
            decisions.append(
                _decision(index.key, "index", "full", reason, "L2", -growth,
                          action=DecisionAction.RESTORED)
            )  # fmt: skip
        else:
            reason = (
                f"library index partly unfolded: {len(back)} of the entries it listed come "
                "back (room freed up)"
            )
            decisions.append(
                _decision(index.key, "index", "index", reason, "L2", -growth,
                          action=DecisionAction.RESTORED)
            )  # fmt: skip
        for entry in back:
            decisions.append(
                _decision(entry.key, "index", str(entry.form), reason, "L2", 0,
                          action=DecisionAction.RESTORED)
            )  # fmt: skip
    return attrs.evolve(turn, library=library), decisions, gained


def _part_unfolded(
    turn: TurnGraph,
    index: LibraryEntry,
    stays: list[LibraryEntry],
    wholes: list[LibraryEntry | None],
    room: int,
) -> tuple[list[LibraryEntry], LibraryEntry, int] | None:
    """The most of ``index``'s first entries (those whose whole form fits ``room``, in
    order) that come back whole within ``room`` beside the index of the others
    (``stubs.refold``), the index and the growth; None if not even one does. Found by
    bisection (``_first``): the growth rises with every entry brought back."""
    able = [i for i, w in enumerate(wholes) if w is not None]
    splits: dict[int, tuple[list[LibraryEntry], LibraryEntry, int]] = {}

    def split(k: int) -> tuple[list[LibraryEntry], LibraryEntry, int]:
        if k not in splits:
            taken = set(able[:k])
            back = [w for i, w in enumerate(wholes) if i in taken and w is not None]
            rest = refold(turn, index, [e for i, e in enumerate(stays) if i not in taken])
            splits[k] = back, rest, sum(e.tokens for e in back) + rest.tokens - index.tokens
        return splits[k]

    most = len(able) - 1 if len(able) == len(stays) else len(able)
    k = _first(1, most, lambda k: not 0 < split(k)[2] <= room) - 1
    return split(k) if k > 0 else None


def restore(
    turn: TurnGraph, used: int, budget: Budget, measured: Draft
) -> tuple[TurnGraph, list[Decision]] | None:
    """Give cut library entries back the fullest form that fits, oldest first, leaving
    the plan's slack free (so the restore is not cut again at once); None if none is due.
    ``used``: the request's tokens as ``measured`` (the turn's draft).

    A restore rewrites the system message from the first entry it restores, so the cached
    prefix breaks there. Where the prefix breaks anyway (L1 changed, an entry refreshed)
    every cut entry after that point that fits is restored; any other restore is made as
    one batch, and only when it gives back at least ``BudgetPlan.restore_min`` of the
    limit (one break for many entries, not one per entry). An entry this turn sends in L3
    is left as it is (the library is not sent twice)."""
    plan = budget.plan
    room = budget.limit - budget.effective(used) - slack_of(turn, budget, measured)
    if room <= 0 or not any(e.cut or e.folded for e in turn.library.entries):
        return None
    # A restore gives back at most ``room`` (each step takes only what is left of it), so
    # with less room than a batch needs none is tried: a library index of 532 entries was
    # unfolded (each rendered and counted, a decision each) and dropped every turn.
    if room >= math.ceil(budget.limit * plan.restore_min):
        out, decisions, gained, _ = _restored(turn, room, 0)
        out, unfolded, more = _unfolded(out, room - gained, 0)
        decisions, gained = decisions + unfolded, gained + more
        if decisions and gained >= math.ceil(budget.limit * plan.restore_min):
            return out, decisions
    breaks = _breaks_at(turn)
    if breaks is None:
        return None
    out, decisions, gained, _ = _restored(turn, room, breaks)
    out, unfolded, more = _unfolded(out, room - gained, breaks)
    decisions += unfolded
    return (out, decisions) if decisions else None


# -- the current-first policy: cuts planned from known counts, one measurement per round --


_LEVELS = ((Form.FULL,), (Form.PREVIEW, Form.EXCERPT), (Form.SUMMARY,))
"""The passes of a library cut: entries whole, then previews, then summaries."""


SMALL_EVICTION = 64
"""A whole entry so small that no shorter form saves anything (or none saves
``MIN_CUT_SAVING``) is only evicted to a stub in a last pass, for what the other passes
could not save: a stub of a 40-token note saves a few tokens and loses the note (on a
documentation vault of small templates, a turn evicted 52 such notes for 1,100 tokens
before it summarized one large entry)."""

MIN_CUT_SAVING = 16
"""The fewest tokens a library cut saves: a shorter form that saves less is passed over
for the next one down, and a stub (which loses the entry's content) must also save
``MIN_STUB_SHARE`` of the entry, else the entry is not cut and the fit saves elsewhere
(the next entry, a fold into the group's index). On the public vault at 4k, two 48-token
daily notes became 46-token stubs and a 41-token note a 34-token one."""

MIN_STUB_SHARE = 0.25
"""The least share of its entry a stub saves (``MIN_CUT_SAVING``)."""


def _saves_enough(entry: LibraryEntry, new: LibraryEntry) -> bool:
    """Whether cutting ``entry`` to ``new`` saves enough to be worth it (``MIN_CUT_SAVING``)."""
    gain = entry.tokens - new.tokens
    if new.form is Form.REFERENCE:
        return gain >= max(MIN_CUT_SAVING, math.ceil(entry.tokens * MIN_STUB_SHARE))
    return gain >= MIN_CUT_SAVING


def _library_cuts(
    turn: TurnGraph,
    env: Draft,
    over: int,
    budget: Budget,
    *,
    floor: int,
    referenced: bool,
    tiny: bool = False,
) -> tuple[TurnGraph, list[Decision]] | None:
    """Step library entries down one form a pass, oldest first (those this turn attaches
    last), until the excess is saved: every entry is previewed before any is summarized,
    and summarized before any becomes a stub, so a cut goes only as deep as it must.
    Within a pass the cut goes on for the plan's slack beyond the excess (the next turns
    grow without breaking the prefix again); no entry goes a form deeper for the slack
    alone. The library keeps ``floor`` tokens. ``referenced``: cut only the entries this
    turn's references point at (the last resort: each such item is then listed as not
    sent, never a reference to a cut entry); otherwise those entries are not cut. Unless
    ``tiny`` (the plans of last resort), a cut saves ``MIN_CUT_SAVING`` at least."""
    slack = slack_of(turn, budget, env)
    pointed = {i.key for i in turn.items if i.form is Form.REFERENCE}
    used_now = {i.key for i in turn.items}
    entries = turn.library.entries
    passing = over <= _resent(turn, env)
    if passing:
        slack = 0  # the next turn has the re-sent items' room back: nothing to keep free
    ordered = sorted(
        (i for i, e in enumerate(entries) if (e.key in pointed) == referenced),
        key=lambda i: (entries[i].key in used_now, -i if passing else entries[i].turn, i),
    )
    library = turn.library
    out = turn
    decisions: list[Decision] = []
    total = sum(e.tokens for e in entries)
    saved = 0
    keys = [entries[i].key for i in ordered]
    # Entries whole, previews, summaries; then small whole entries folded into their
    # group's index (not for the last resort, whose entries are each listed as not sent);
    # then those a fold did not take, to stubs.
    passes: list[tuple[tuple[Form, ...] | None, bool]] = [
        *((level, False) for level in _LEVELS),
        *(() if referenced else ((None, False),)),
        ((Form.FULL,), True),
    ]
    for level, small in passes:
        if saved >= over:
            break
        if level is None:
            library, folded, more = _fold_small(
                out, library, [e for k in keys if (e := library.get(k)) is not None],
                over + slack - saved, total - saved - floor, tiny=tiny,
            )  # fmt: skip
            decisions.extend(folded)
            saved += more
            continue
        for key in keys:
            if saved >= over + slack:
                break
            entry = library.get(key)
            if entry is None or entry.form not in level:
                continue
            ahead = attrs.evolve(out, library=library)
            new = _l2_step(ahead, entry)
            passed = False  # a shorter form passed over for saving too little
            while new is not None and (
                new.tokens >= entry.tokens if tiny else not _saves_enough(entry, new)
            ):
                passed = passed or new.tokens < entry.tokens
                new = _l2_step(ahead, new)  # saves (too) little: the next form down
            if new is None:
                continue
            gain = entry.tokens - new.tokens
            want = min(over + slack - saved, total - saved - floor)
            if gain > want > 0 and new.form is not Form.REFERENCE and not small:
                # The last cut of a pass: a preview of the size that saves what is left.
                least = want if tiny else max(want, MIN_CUT_SAVING)
                sized = _sized_preview(ahead, entry, entry.tokens - least)
                if sized is not None and sized.tokens > new.tokens and (
                    tiny or _saves_enough(entry, sized)
                ):
                    new, gain = sized, entry.tokens - sized.tokens
            if total - saved - gain < floor:
                continue
            # A small whole entry straight to a stub: only in the last pass (``small``).
            if (new.form is Form.REFERENCE and entry.form is Form.FULL
                    and (gain < SMALL_EVICTION or passed)) != small:
                continue
            to = "evicted" if new.form is Form.REFERENCE else str(new.form)
            reason = (
                "library entry evicted to a stub that keeps key, title and locator"
                if to == "evicted"
                else f"library entry compacted to a {to}"
            )
            action = DecisionAction.EVICTED if to == "evicted" else DecisionAction.COMPACTED
            decisions.append(
                _decision(entry.key, str(entry.form), to, reason, "L2", gain, action=action)
            )
            library = library.replace(new)
            if new.form is Form.SUMMARY:
                summary_key, source = _summary_source(ahead, entry)
                out = _summary_warnings(out, entry.key, summary_key, source)
            saved += gain
    if not decisions:
        return None
    out = attrs.evolve(out, library=library)
    if referenced:
        out, unsent = _unsend(out, {d.target for d in decisions})
        decisions.extend(unsent)
    return out, decisions


def _resent(turn: TurnGraph, env: Draft) -> int:
    """Tokens this turn's L3 spends on items the library already holds (sent again in
    full beside a shorter library form): room the next turn has back, since the library
    does not grow by them."""
    sizes = {s.key: s.tokens for s in env.l3.segments}
    library = turn.library
    return sum(
        sizes.get(item.key, 0)
        for item in turn.items
        if item.form is not Form.REFERENCE and item.key in library
    )


_OMITTED_TAIL = re.compile(r"\[\.\.\. (\d+) more sections? omitted \.\.\.\]\s*$")


def _sized_preview(turn: TurnGraph, entry: LibraryEntry, tokens: int) -> LibraryEntry | None:
    """A preview of ``entry`` of at most about ``tokens`` (its block), smaller than it is
    now, or None: whole sections chosen as ``fitted_preview_of`` chooses them, from its
    whole body when that is full, else from the preview it holds (a fitted preview that
    entered the library as sent; the sections that one omitted stay counted). A cut that
    saves what the excess needs where the policy's preview or a summary would save much
    more."""
    whole = entry.whole_view
    if not whole.recoverable or whole.source_type == INDEX_SOURCE:
        return None
    omitted = 0
    if whole.form is Form.FULL:
        body = whole.body
    elif whole.form is Form.PREVIEW and entry.form is Form.PREVIEW:
        body = entry.view.body
        tail = _OMITTED_TAIL.search(body)
        if tail is not None:
            omitted, body = int(tail.group(1)), body[: tail.start()].rstrip()
    else:
        return None
    ctx = turn.ctx
    empty = attrs.evolve(whole, form=Form.PREVIEW, body="")
    limit = tokens - ctx.counter.count(ctx.renderer.render(empty)) - 2 - (12 if omitted else 0)
    if limit < MIN_PREVIEW_TOKENS:
        return None
    key = ("l2-fit", text_hash(body), ctx.counter.name, limit)
    text = ctx.views.get(key, lambda: fitted_preview_of(body, ctx.counter, limit)).text
    if omitted:
        tail = _OMITTED_TAIL.search(text)
        more = int(tail.group(1)) if tail is not None else 0
        head = text[: tail.start()].rstrip() if tail is not None else text.rstrip()
        text = f"{head}\n\n[... {omitted + more} more sections omitted ...]"
    if not text.strip() or is_omitted_only(text):
        return None
    view = attrs.evolve(whole, form=Form.PREVIEW, body=text)
    rendered = ctx.renderer.render(view)
    new = LibraryEntry(
        view, rendered, ctx.counter.count(rendered), entry.turn, entry.full_tokens, whole=whole
    )
    return new if new.tokens < entry.tokens else None


def _stub(turn: TurnGraph, entry: LibraryEntry) -> LibraryEntry:
    """``entry`` as an evicted stub (key, title, locator) that keeps its whole form."""
    ctx = turn.ctx
    view = attrs.evolve(entry.view, form=Form.REFERENCE, body="", marks=(("evicted", "true"),))
    text = ctx.renderer.render(view)
    return LibraryEntry(
        view, text, ctx.counter.count(text), entry.turn, entry.full_tokens, whole=entry.whole_view
    )


def _fold_small(
    turn: TurnGraph,
    library: Library,
    ordered: Sequence[LibraryEntry],
    need: int,
    allowance: int,
    *,
    tiny: bool = False,
) -> tuple[Library, list[Decision], int]:
    """The library's last pass: whole entries still left (too small for a shorter form to
    save ``SMALL_EVICTION``), oldest group first, listed in their group's library index
    (``stubs.fold``) as far as ``need`` tokens require and no further than ``allowance``
    (the floor): each line saves nearly all of its entry, where a stub would save a few
    tokens and then pile up until the stubs collapsed anyway (on the public documentation
    vault at 8k, a re-attached note's 1,400 tokens evicted 89 notes and folded the library
    from 5,439 to 427 tokens). Each entry folded is a decision; restores unfold them.
    Unless ``tiny``, a fold saves ``MIN_CUT_SAVING`` an entry (``_fold_count``)."""
    groups: dict[str, list[LibraryEntry]] = {}
    for entry in ordered:
        view = entry.view
        if entry.form is Form.FULL and view.recoverable and view.source_type != INDEX_SOURCE:
            groups.setdefault(stub_group(view), []).append(entry)
    decisions: list[Decision] = []
    saved = 0
    for group, members in groups.items():
        if saved >= need:
            break
        stubs = [_stub(turn, m) for m in members]

        k = _fold_count(
            turn, library, group, stubs, need - saved, allowance - saved, worth_it=not tiny
        )
        if k <= 0:
            continue
        new, gain, _ = _folded(turn, library, group, stubs[:k])
        if gain <= 0:
            continue
        reason = (
            f"library entry listed in the library's index of {group} (too small for a "
            "shorter form to save room)"
        )
        for stub in stubs[:k]:
            whole = library.get(stub.key)
            assert whole is not None
            decisions.append(
                _decision(whole.key, "full", "index", reason, "L2", whole.tokens - stub.tokens,
                          action=DecisionAction.INDEXED)
            )  # fmt: skip
        library = new
        saved += gain
    return library, decisions, saved


def _folded(
    turn: TurnGraph, library: Library, group: str, stubs: Sequence[LibraryEntry]
) -> tuple[Library, int, int]:
    """``library`` with the entries of ``stubs`` folded into ``group``'s index, in library
    order (``stubs.fold``), the tokens that saves and the tokens the entries took."""
    keys = library.keys()
    at = {key: i for i, key in enumerate(keys)} if len(stubs) > 1 else {}
    chosen = sorted(stubs, key=lambda e: at.get(e.key, 0))
    new, _, grew = fold(turn, library, group, chosen)
    before = 0
    for e in chosen:
        entry = library.get(e.key)
        before += entry.tokens if entry is not None else 0
    return new, before - grew, before


def _fold_count(
    turn: TurnGraph,
    library: Library,
    group: str,
    stubs: Sequence[LibraryEntry],
    need: int,
    allowance: int,
    *,
    worth_it: bool = True,
) -> int:
    """How many of ``stubs`` (oldest first) to fold: the fewest that save ``need`` tokens
    (all of them if none do), with ``worth_it`` more while the fold saves too little to be
    worth it (``MIN_CUT_SAVING`` an entry and ``MIN_STUB_SHARE`` of them: a new index
    costs its own block, so folding a few entries can save next to nothing), then no more
    than save ``allowance``; 0 when no such fold is worth it. Savings grow with every entry
    folded (and so does their share, as the index's own cost is spread), so all three are
    found by bisection."""
    n = len(stubs)
    memo: dict[int, tuple[int, int]] = {}

    def saving(k: int) -> int:
        return measure(k)[0]

    def measure(k: int) -> tuple[int, int]:
        if k not in memo:
            memo[k] = _folded(turn, library, group, stubs[:k])[1:]
        return memo[k]

    def worth(k: int) -> bool:
        if not worth_it:
            return True
        gain, before = measure(k)
        return gain >= max(MIN_CUT_SAVING * k, math.ceil(before * MIN_STUB_SHARE))

    k = min(_first(1, n, lambda k: saving(k) >= need), n)
    k = _first(k, n, worth)
    if k > n:
        return 0
    if saving(k) > allowance:
        k = _first(1, k, lambda k: saving(k) > allowance) - 1
    return k if k > 0 and worth(k) else 0


def _first(lo: int, hi: int, holds: Callable[[int], bool]) -> int:
    """The least ``k`` in ``lo``..``hi`` for which ``holds(k)`` (it holds for every larger
    ``k`` once it does), or ``hi + 1`` if none: the one bisection of the budget's searches
    (the fewest entries a fold needs, the most a partial unfold brings back)."""
    while lo <= hi:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid - 1
        else:
            lo = mid + 1
    return lo


def _unsend(turn: TurnGraph, keys: set[str]) -> tuple[TurnGraph, list[Decision]]:
    """This turn's references to ``keys`` (library entries just cut) listed as not sent."""
    items = list(turn.items)
    decisions: list[Decision] = []
    for i, item in enumerate(items):
        if item.form is not Form.REFERENCE or item.key not in keys or _unsent(item):
            continue
        items[i] = attrs.evolve(item, marks=(*item.marks, (NOT_SENT, NOT_SENT_HINT)))
        reason = "re-attached item not sent: its library entry was cut for lack of room"
        action = DecisionAction.NOT_SENT
        decisions.append(_decision(item.key, "reference", "reference", reason, "L3", action=action))
    return attrs.evolve(turn, items=tuple(items)), decisions


def _unsent(item: Placement) -> bool:
    return any(name == NOT_SENT for name, _ in item.marks)


def _plan_library(
    turn: TurnGraph, env: Draft, over: int, budget: Budget
) -> tuple[TurnGraph, list[Decision]] | None:
    """Library entries cut while the library keeps its floor (``BudgetPlan.library_floor``
    of the limit): this turn's new material does not take the whole window from it."""
    floor = math.floor(budget.limit * budget.plan.library_floor)
    return _library_cuts(turn, env, over, budget, floor=floor, referenced=False)


def _plan_library_below_floor(
    turn: TurnGraph, env: Draft, over: int, budget: Budget
) -> tuple[TurnGraph, list[Decision]] | None:
    """Library entries cut below the floor: only when this turn's items could otherwise
    not be seen at all (they are already previews at their smallest)."""
    return _library_cuts(turn, env, over, budget, floor=0, referenced=False)


def _plan_referenced(
    turn: TurnGraph, env: Draft, over: int, budget: Budget
) -> tuple[TurnGraph, list[Decision]] | None:
    """The last resort: entries this turn re-attaches are cut and the items listed as not
    sent (a reference must find its entry whole in the library); cuts that save less than
    ``MIN_CUT_SAVING`` too."""
    return _library_cuts(turn, env, over, budget, floor=0, referenced=True, tiny=True)


def _plan_tiny(
    turn: TurnGraph, env: Draft, over: int, budget: Budget
) -> tuple[TurnGraph, list[Decision]] | None:
    """Library cuts that save less than ``MIN_CUT_SAVING``: only when nothing else in the
    library or history is left to cut, before this turn's items are indexed or go unsent."""
    return _library_cuts(turn, env, over, budget, floor=0, referenced=False, tiny=True)


def _plan_history(
    turn: TurnGraph, env: Draft, over: int, budget: Budget
) -> tuple[TurnGraph, list[Decision]] | None:
    """The oldest history turns dropped while the last ``BudgetPlan.history_turns`` stay."""
    step = _drop_history(turn, budget.plan.history_turns)
    return None if step is None else (step[0], [step[1]])


def _plan_history_below_floor(
    turn: TurnGraph, env: Draft, over: int, budget: Budget
) -> tuple[TurnGraph, list[Decision]] | None:
    """History down to its last turn: only when this turn's items could otherwise not be
    seen at all."""
    step = drop_history(turn, env)
    return None if step is None else (step[0], [step[1]])


def _single(cut: Cut) -> Plan:
    def plan(
        turn: TurnGraph, env: Draft, over: int, budget: Budget
    ) -> tuple[TurnGraph, list[Decision]] | None:
        step = cut(turn, env)
        return None if step is None else (step[0], [step[1]])

    return plan


def _shrinkable(turn: TurnGraph, item: Placement) -> bool:
    if item.form not in (Form.FULL, Form.PREVIEW) or chunk_source(item.key) is not None:
        return False
    artifact = turn.artifact(item.key)
    return artifact.recoverable and not is_index(artifact)  # an index only drops lines


def _cap(sizes: list[int], room: int) -> int:
    """The largest cap ``c`` with ``sum(min(s, c)) <= room`` (water-filling), -1 if none."""
    ordered = sorted(sizes)
    prefix = [0, *itertools.accumulate(ordered)]
    best = -1
    lo, hi = 0, ordered[-1] if ordered else 0
    while lo <= hi:
        mid = (lo + hi) // 2
        k = bisect.bisect_right(ordered, mid)
        if prefix[k] + mid * (len(ordered) - k) <= room:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def _plan_previews(
    turn: TurnGraph, env: Draft, over: int, budget: Budget
) -> tuple[TurnGraph, list[Decision]] | None:
    """This turn's items capped at the largest size that fits, down to previews of
    ``MIN_PREVIEW_TOKENS`` (``_plan_current``)."""
    return _plan_current(turn, env, over, budget, unsent=False)


def _plan_unsent(
    turn: TurnGraph, env: Draft, over: int, budget: Budget
) -> tuple[TurnGraph, list[Decision]] | None:
    """The largest of this turn's items go unsent (``_plan_current``)."""
    return _plan_current(turn, env, over, budget, unsent=True)


def _cut_to_preview(
    item: Placement, size: int, limit: int, reason: str
) -> tuple[Placement, Decision]:
    """``item`` (now ``size`` tokens) as a preview of at most ``limit``, and its decision."""
    decision = _decision(
        item.key, str(item.form), "preview", reason, "L3", size - limit,
        action=DecisionAction.COMPACTED,
    )  # fmt: skip
    return attrs.evolve(item, form=Form.PREVIEW, limit=limit), decision


def _plan_current(
    turn: TurnGraph, env: Draft, over: int, budget: Budget, *, unsent: bool
) -> tuple[TurnGraph, list[Decision]] | None:
    """This turn's recoverable items all capped at the one largest size that fits (fine
    steps: a preview can have any size); below ``MIN_PREVIEW_TOKENS``, with ``unsent``,
    the largest go unsent (a reference that says so) until the excess is covered."""
    sizes = {s.key: s.tokens for s in env.l3.segments}
    candidates = [(i, item) for i, item in enumerate(turn.items) if _shrinkable(turn, item)]
    if not candidates:
        return None
    current = [sizes.get(item.key, 0) for _, item in candidates]
    cap = _cap(current, sum(current) - over)
    items = list(turn.items)
    decisions: list[Decision] = []
    pairs = list(zip(candidates, current, strict=True))
    if cap >= MIN_PREVIEW_TOKENS:
        for (i, item), size in pairs:
            if size <= cap:
                continue
            limit = cap
            if item.limit:
                # A preview that came out over its limit gets a smaller one, by at least as
                # much as it was over: a preview at its smallest (its tag and title) then
                # reaches the floor in a few rounds, not one round per token.
                limit = min(cap, item.limit - max(1, size - item.limit))
            if limit < MIN_PREVIEW_TOKENS:
                continue  # as small as previews go here: the unsent plan decides
            why = f"L3 item cut to a {limit}-token preview (this turn's items share room)"
            items[i], decision = _cut_to_preview(item, size, limit, why)
            decisions.append(decision)
        if decisions:
            return attrs.evolve(turn, items=tuple(items)), decisions
        if not unsent:
            return None
        # Every item over the cap is as small as previews go: on to the unsent cut below.
    least = MIN_PREVIEW_TOKENS
    at_min = [
        (i, item, size)
        for (i, item), size in pairs
        if size > least and not (item.form is Form.PREVIEW and 0 < item.limit <= least)
    ]
    for i, item, size in at_min:
        items[i], decision = _cut_to_preview(
            item, size, least, f"L3 item cut to a {least}-token preview"
        )
        decisions.append(decision)
    if not at_min and unsent:
        saved = 0
        ctx = turn.ctx
        for (i, item), size in sorted(pairs, key=lambda c: (-c[1], c[0][0])):
            if saved >= over:
                break
            marks = (*item.marks, (NOT_SENT, NOT_SENT_HINT))
            ref_view = reference_view(turn.artifact(item.key), marks)
            gain = size - ctx.counter.count(ctx.renderer.render(ref_view))
            items[i] = attrs.evolve(item, form=Form.REFERENCE, marks=marks, limit=0)
            reason = "L3 item not sent for lack of room (a not-sent reference says how to get it)"
            decisions.append(
                _decision(
                    item.key,
                    str(item.form),
                    "reference",
                    reason,
                    "L3",
                    gain,
                    action=DecisionAction.NOT_SENT,
                )
            )
            saved += gain
    if not decisions:
        return None
    return attrs.evolve(turn, items=tuple(items)), decisions


_PLANS: tuple[Plan, ...] = (
    plan_stubs,  # only while stubs are over their share
    # Above their floors, the library and history give way first ...
    _plan_library,
    _plan_history,
    _single(shorten_replies),
    # ... then this turn's items share what is left, down to their smallest previews ...
    _plan_previews,
    _single(compact_l1_mutable),
    _single(excerpt_non_recoverable),
    # ... and only then, so that they can be seen at all, the floors give way.
    _plan_library_below_floor,
    _plan_history_below_floor,
    _plan_tiny,
    # An index line is smaller than a not-sent reference and tells more: groups go first.
    plan_index,
    _plan_unsent,
    _plan_referenced,
)
"""The current-first plan (``BudgetPlan`` sets its shares, floors and slack)."""
