"""The budget stage: a turn's units as ladders of forms, one solve, measured exactly.

1. Every unit the request can carry becomes a ladder (``solver.Ladder``): L1's mutable
   part, each library entry (whole, preview, summary, excerpts, stub, its line in its
   group's index; an index unfolds into its entries), history older than the last turn
   (kept as a recent contiguous suffix), each item attached this turn (full, previews,
   excerpts, its line in its group's index or its count there, or a not-sent reference).
   Text-free rungs (lines, counts, stubs) share one bound, ``Budget.text_free_share``
   of the window: a folder's members past it are counted in its index. A rung's tokens are
   its block's count (a fitted preview's, its limit); its value is what it tells the
   model (``_value``).
2. ``solver.solve`` picks one rung a ladder: the most value less the cache price of the
   tokens after the first changed prefix unit, within the limit less what is fixed (the
   query, the last turn, L1's stable part, framing).
3. The choice is applied and the request drafted and measured exactly; if the estimate
   was short, the room shrinks by the overshoot and the same ladders are solved again;
   between a room that fit and one that measured over, the fit's room grows by what its
   measure left (halfway to the other, when that one was as large) while rounds last
   (``MAX_ROUNDS``). Guessed previews the solve takes are made, and it solves again
   only if they freed more than ``SOLVE_TOLERANCE`` of the room (``_as_made``). Every
   changed unit is one decision.

Restores, cuts, folds into an index and unfolds are all outcomes of the one solve against
the rungs last turn sent: nothing runs as a pass of its own.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from lamina.pipeline._budget.index import (
    INDEX_SOURCE,
    IndexLine,
    _groups,
    _Member,
    _with_index,
    index_artifact,
    is_index,
)
from lamina.pipeline._budget.solver import (
    Carried,
    Hulls,
    Ladder,
    Rung,
    Solution,
    lasting_value,
    rent,
    scored,
    solve,
    topped,
)
from lamina.pipeline._budget.stubs import SET_ASIDE, _Renderer, fold, stub_group
from lamina.pipeline._collector import paused
from lamina.pipeline._errors import BudgetExceeded
from lamina.pipeline._hashing import text_hash
from lamina.pipeline._model.artifacts import Artifact, TurnWarning
from lamina.pipeline._model.envelope import (
    BLOCK_SEP,
    NOT_SENT,
    Decision,
    DecisionAction,
    Form,
    Segment,
    View,
)
from lamina.pipeline._model.library import Library, LibraryEntry
from lamina.pipeline._model.recall import RECALL_SOURCE, RecallItem, Retriever, recalled_artifact
from lamina.pipeline._model.tools import chunk_source
from lamina.pipeline._recall.memory import HISTORY_BLOCK, Passage
from lamina.pipeline._tokens.counter import TokenCounter, count_with_sep_from
from lamina.pipeline._turn.assemble import (
    draft,
    fitted_preview,
    summary_cap,
    summary_target,
    visible_history,
)
from lamina.pipeline._turn.draft import Draft, ItemBlock
from lamina.pipeline._turn.graph import HistoryView, Placement, SystemPrompt, TurnGraph
from lamina.pipeline._turn.measure import sent_tokens
from lamina.pipeline._views.preview import (
    EXCERPT_MIN_TOKENS,
    fitted_preview_of,
    has_prose,
    make_excerpt,
    make_preview,
    refitted_preview,
)
from lamina.pipeline._views.views import (
    ViewMemo,
    body_preview,
    excerpt_view,
    full_view,
    reference_view,
)

if TYPE_CHECKING:
    from lamina.pipeline._turn.budget import Budget

__all__ = [
    "MAX_ROUNDS",
    "MIN_PREVIEW_TOKENS",
    "Solve",
    "TurnFitting",
    "shrink",
    "turn_fitting",
]

MAX_ROUNDS = 6
"""Solves a turn makes at most: each after the first shrinks the room by what the last
measured request was over (separators and framing the rungs' counts do not hold), or
grows it by what the best fit left."""

SOLVE_TOLERANCE = 0.001
"""The share of the room a solve may leave unspent once its guessed previews are made
(each measures at most its guess): the solve is not run again to spend less than that."""

MIN_PREVIEW_TOKENS = 64
"""The smallest preview block of an item: below it a preview holds a heading at most."""

_SEP = 2
"""Tokens a block costs beside its own (the blank line between blocks)."""

_STEPS = 8
"""An item's previews (or excerpts) are fitted to sevenths, sixths ... of its size: the
steps the room is shared in."""

_READ = 1500
"""Characters of a unit's text its relevance is read from (its title and opening)."""

_MESSAGE_WORTH = 0.8
"""What a token of an earlier message tells the model at weight 1, in the suffix or
recalled: a little less than a token of a note's whole form (``_value``), so history
gives way before notes of the same weight. Set with the objective's first version, not
measured against another value."""

_CUT = frozenset({Form.PREVIEW, Form.SUMMARY, Form.EXCERPT})
"""The forms that hold part of a unit's text: one holding no prose is never sent."""

_TEXT = _CUT | {Form.FULL}
"""The forms that hold a unit's text (a stub or an index holds none)."""


@attrs.frozen
class _Choice:
    """One rung of a unit: what applying it changes, and its label for decisions."""

    form: str
    entry: LibraryEntry | None = None
    placement: Placement | None = None
    start: int = 0
    text: str = ""
    unfold: tuple[LibraryEntry, ...] = ()
    guess: bool = False
    """A fitted preview whose tokens are its limit until it is made (``_made``)."""
    summary: tuple[str, str, int] | None = None
    """A library summary not made yet (its memo key, the text, the target size): its
    tokens are the target's until the solve takes it and it is made (``_summarized``),
    so a summarizer (an LLM's, maybe) runs only for summaries a solve chooses."""
    failures: tuple[str, ...] = ()
    """Why a summarizer's chunks failed (a summary made in their place): reported as
    the turn's warnings when this form is sent."""

    @property
    def line(self) -> bool:
        """A library entry's line in its group's index (an index entry's own ``index``
        form carries the entry): the rung that pays a share of a new index's head."""
        return self.form == "index" and self.entry is None


_Join = tuple[float, int | None]
"""The cache price of the prefix between an index and an entry after it, and the index's
place in the prefix (None: no index stands before the entry)."""


@attrs.frozen
class _Unit:
    """A unit (``kind``: l1, library, history, item), its key, rungs and their choices."""

    kind: str
    key: str
    ladder: Ladder
    choices: tuple[_Choice, ...]


@attrs.frozen
class _Whole:
    """The library entry of an item attached again while it holds a cut form (the item
    is sent in L3 once more): the entry whole (``grown``), the tokens that adds to the
    form it holds, its place in the prefix and the cache price of the prefix from there
    on (``Rung.at``, ``Rung.join``)."""

    grown: LibraryEntry
    tokens: int
    at: int
    join: float


def _value(weight: float, whole: int, tokens: int, *, text_free: bool, cap: int) -> float:
    """What a form tells the model: ``weight`` times the square root of the text it
    carries times the unit's whole size, so value grows with text but less per token
    (a preview is worth more per token than the whole); a text-free form (a line, a
    stub: a title and how to ask for it) is worth half of that. A form tells at most what
    the whole does, however its framing counts. The whole counts at most ``cap`` (the
    limit: what one request holds): a note larger than that tells the model no more than a
    request of it could, and counted whole, a preview of a note many windows long was
    worth more per token than the cache of everything before it, so each such
    attachment took the library's room and the next turn rebuilt it."""
    worth = weight * math.sqrt(max(0, min(tokens, whole)) * max(1, min(whole, cap)))
    return worth / 2 if text_free else worth


def _limit(turn: TurnGraph) -> int:
    """The turn's limit (``Budget.limit``): the most a unit's whole counts (``_value``'s
    ``cap``)."""
    budget = turn.ctx.budget
    assert budget is not None
    return budget.limit


def _words(
    retriever: Retriever | None, query: str, items: Sequence[RecallItem]
) -> dict[str, float]:
    """Each key's relevance to ``query`` in [0, 1] (its score over the best), by
    ``retriever`` over ``items`` (this turn's units' texts)."""
    if retriever is None or not items or not query.strip():
        return {}
    retriever.index(items)
    found = retriever.search(query, len(items))
    top = max((score for _, score in found), default=0.0)
    if top <= 0:
        return {}
    return {key: max(0.0, score) / top for key, score in found}


def _relevance(turn: TurnGraph, factory: Callable[[], Retriever] | None) -> dict[str, float]:
    """Each unit's relevance to the query (library entries, this turn's items, history
    turns), by a fresh retriever from ``factory`` over their titles and openings."""
    if factory is None or not turn.query.strip():
        return {}
    items: list[RecallItem] = []
    for entry in turn.library.entries:
        view = entry.whole_view
        items.append(RecallItem(entry.key, entry.turn, f"{view.title}\n{view.body[:_READ]}"))
    for item in turn.items:
        artifact = turn.artifact(item.key)
        items.append(
            RecallItem(
                item.key, turn.ctx.turn, f"{artifact.title}\n{artifact.payload.body()[:_READ]}"
            )
        )
    for said, reply in visible_history(turn)[:-1]:
        items.append(RecallItem(f"history:{said.turn}", said.turn, f"{said.user}\n{reply or ''}"))
    return _words(factory(), turn.query, items)


def _weight(budget: Budget, source: str, age: int, relevance: float) -> float:
    """A unit's weight: its source's (``Budget.source_weights``), recency (1 for what the
    user attached now, age 0, halving over about four turns, never below half) and
    relevance (up to x2). Recency is continuous in age: a step at age 0 (it was x1.5)
    made each turn's attachment worth far more than the one before it, so every
    attachment took the library's room and the next turn rebuilt it."""
    recency = 0.5 + 0.5 * 0.85 ** max(0, age)
    return budget.source_weight(source) * recency * (1.0 + relevance)


def _message_value(budget: Budget, tokens: int, age: int, relevance: float) -> float:
    """What ``tokens`` of an earlier message ``age`` turns old tell the model, in the
    suffix, a start of it earlier or recalled: ``_MESSAGE_WORTH`` a token, weighed as
    history (``_weight``)."""
    return _MESSAGE_WORTH * tokens * _weight(budget, "history", age, relevance)


def _entry(turn: TurnGraph, view: View, of: LibraryEntry) -> LibraryEntry:
    """``view`` as a library entry in the place of ``of`` (keeping its whole form)."""
    ctx = turn.ctx
    text = ctx.renderer.render(view)
    whole = None if view == of.whole_view else of.whole_view
    return LibraryEntry(view, text, ctx.counter.count(text), of.turn, of.full_tokens, whole=whole)


def _index_line_tokens(turn: TurnGraph, key: str, title: str, full: int) -> int:
    return turn.ctx.counter.count(IndexLine(key, title, full).render()) + 1


@attrs.frozen
class _Form:
    """A library entry's form as its ladder needs it: the choice, its tokens, whether it
    is text-free, and a value of its own (an unfold's: its entries'), else None."""

    choice: _Choice
    tokens: int
    text_free: bool = False
    value: float | None = None


def _excerpt(views: ViewMemo, memo: tuple[object, ...], body: str, counter: TokenCounter,
             limit: int) -> str:  # fmt: skip
    """``body``'s excerpt of ``limit`` tokens, remembered under ``memo``."""
    return views.get(memo, lambda: make_excerpt(body, counter, limit).text)


def _fitted(views: ViewMemo, memo: tuple[object, ...], whole: View, counter: TokenCounter,
            limit: int) -> str:  # fmt: skip
    """A preview of ``whole`` (a note, or a preview of one) fitted to ``limit`` tokens,
    remembered under ``memo``."""
    if whole.form is Form.PREVIEW:
        return views.get(memo, lambda: refitted_preview(whole.body, counter, limit))
    return views.get(memo, lambda: fitted_preview_of(whole.body, counter, limit).text)


def _library_forms(turn: TurnGraph, entry: LibraryEntry, *, sent: bool) -> tuple[_Form, ...]:
    """A library entry's forms: the one it has now first, its whole form, the policy's
    preview and previews fitted to halving sizes, a summary, excerpts (non-recoverable),
    a stub, its index line and set aside (counted in an index not sent); an
    index's, unfolded into its entries and kept as a count. An entry's forms are
    remembered by its text and all else they carry of it (its turn, its full size, the
    summarizer and the summaries it made: the memo is shared by every conversation of
    the process; the ladder's values change with the query, the forms do not)."""
    ctx = turn.ctx
    if entry.view.source_type == INDEX_SOURCE:
        return _index_forms(turn, entry, sent=sent)
    # A cut entry's whole by its text too: one note's wholes of two sizes (previews made
    # for two windows) may be cut to the same text.
    whole = "" if entry.whole is None else text_hash(entry.whole.body)
    key = ("l2-forms", entry.key, text_hash(entry.text), entry.whole_view.content_hash, whole,
           entry.turn, entry.full_tokens, ctx.counter.name, ctx.summarizer.id)  # fmt: skip
    forms = ctx.views.get(key, lambda: _entry_forms(turn, entry))
    guessed = [f.choice.summary for f in forms if f.choice.summary is not None]
    made = [ctx.summaries.made(ctx.summarizer, k, t) for k, _, t in guessed]
    if any(m is not None for m in made):
        # Its summary was made since: the forms are remembered with it from now on, by its
        # text (another conversation's summarizer of the same id may have made another).
        texts = tuple("" if m is None else text_hash(m.text) for m in made)
        forms = ctx.views.get((*key, "summarized", *texts), lambda: _entry_forms(turn, entry))
    return forms


def _index_forms(turn: TurnGraph, entry: LibraryEntry, *, sent: bool) -> tuple[_Form, ...]:
    """A library index's forms: as it is, unfolded into its entries (their value), and
    its count only (not sent)."""
    sep = _SEP if entry.text else 0  # an index not sent has no block
    forms = [_Form(_Choice("index", entry), entry.tokens + sep, bool(entry.text))]
    if not entry.folded or sent:
        return tuple(forms)
    taken = {i.key for i in turn.items}
    keys = [e.key for e in entry.folded]
    if len(set(keys)) == len(keys) and not any(k in turn.library or k in taken for k in keys):
        back = tuple(_entry(turn, e.whole_view, e) for e in entry.folded)
        size = sum(e.tokens + _SEP for e in back)
        forms.append(_Form(_Choice("full", unfold=back), size, value=-1.0))
    if "\n" in entry.view.body:
        counted = _Renderer(turn).entry(
            entry.view.locator, (), (), 0, len(entry.folded), entry.turn, entry.folded, entry.key
        )
        forms.append(_Form(_Choice("count", counted), counted.tokens, value=0.0))
    return tuple(forms)


def _entry_forms(turn: TurnGraph, entry: LibraryEntry) -> tuple[_Form, ...]:
    ctx = turn.ctx
    budget = ctx.budget
    assert budget is not None
    whole = entry.whole_view
    full = max(entry.full_tokens, entry.tokens)
    forms = [
        _Form(_Choice(str(entry.form), entry), entry.tokens + _SEP, entry.form is Form.REFERENCE)
    ]

    def add(form: str, view: View, failures: tuple[str, ...] = ()) -> None:
        if view.form in _CUT and not has_prose(view.body):
            return  # a cut form holding no prose is never sent
        new = _entry(turn, view, entry)
        if view.form in _CUT and new.tokens >= full:
            return  # a cut form no smaller than the whole (its framing) is never sent
        forms.append(_Form(_Choice(form, new, failures=failures), new.tokens + _SEP))

    if entry.cut:
        add("full", whole)
    if not whole.recoverable:
        body = whole.body
        limit = full // 2
        while limit >= EXCERPT_MIN_TOKENS:
            memo = ("l2-excerpt", text_hash(body), ctx.counter.name, limit)
            text = _excerpt(ctx.views, memo, body, ctx.counter, limit)
            add("excerpt", attrs.evolve(whole, form=Form.EXCERPT, body=text))
            limit //= 2
        return tuple(forms)
    if whole.form in (Form.FULL, Form.PREVIEW):
        size = full
        if whole.form is Form.FULL:
            preview = body_preview(whole.body, ctx.counter, ctx.policy, ctx.views)
            if preview.text != whole.body:
                add("preview", attrs.evolve(whole, form=Form.PREVIEW, body=preview.text))
        else:  # held as the preview first sent: previews of it, halving from its size
            size = _entry(turn, whole, entry).tokens
        empty = ctx.renderer.render(attrs.evolve(whole, form=Form.PREVIEW, body=""))
        limit = (size - ctx.counter.count(empty)) // 2
        while limit >= MIN_PREVIEW_TOKENS:
            fit = ("l2-fit", text_hash(whole.body), str(whole.form), ctx.counter.name, limit)
            text = _fitted(ctx.views, fit, whole, ctx.counter, limit)
            add("preview", attrs.evolve(whole, form=Form.PREVIEW, body=text))
            limit //= 2
    if full > 2 * summary_cap(ctx.policy):
        body = whole.body
        if whole.form is Form.FULL:
            body = body_preview(whole.body, ctx.counter, ctx.policy, ctx.views).text
        memo_key = f"{whole.content_hash}:l2:{text_hash(body)}"
        target = summary_target(turn, body)
        summary = ctx.summaries.made(ctx.summarizer, memo_key, target)
        if summary is None:
            empty = ctx.renderer.render(attrs.evolve(whole, form=Form.SUMMARY, body=""))
            tokens = ctx.counter.count(empty) + target + _SEP
            forms.append(_Form(_Choice("summary", summary=(memo_key, body, target)), tokens))
        elif summary.text.strip():
            summary_view = attrs.evolve(whole, form=Form.SUMMARY, body=summary.text)
            add("summary", summary_view, tuple(summary.failures))
    stub = attrs.evolve(whole, form=Form.REFERENCE, body="", marks=(("evicted", "true"),))
    new = _entry(turn, stub, entry)
    forms.append(_Form(_Choice("evicted", new), new.tokens + _SEP, True))
    line = _index_line_tokens(turn, entry.key, whole.title, full)
    forms.append(_Form(_Choice("index"), line, True))
    forms.append(_Form(_Choice("count"), 0, value=0.0))
    return tuple(forms)


def _library_unit(
    turn: TurnGraph, entry: LibraryEntry, weight: float, head: int, *, sent: bool
) -> _Unit:
    """A library entry's ladder: its forms (``_library_forms``) valued at ``weight``. Its
    line in its group's index also costs ``head`` (its share of a new index's head). A
    fold changes nothing before the entry (``stubs.fold``), so a line breaks the prefix
    where the entry stands; its count (set aside, not sent) costs nothing."""
    forms = _library_forms(turn, entry, sent=sent)
    if sent:  # sent again in L3 this turn: the library does not give it back (not twice,
        # not even when its whole form is smaller than the preview it holds)
        forms = tuple(
            f
            for f in forms
            if f is forms[0] or (f.tokens < forms[0].tokens and f.choice.form != "full")
        )
    full = max(entry.full_tokens, entry.tokens)
    cap = _limit(turn)
    rungs = []
    choices = []
    for form in forms:
        if form.choice.line:
            form = attrs.evolve(form, tokens=form.tokens + head)
        if form.value is None:
            value = _value(weight, full, form.tokens - _SEP, text_free=form.text_free, cap=cap)
        elif form.choice.unfold:  # an unfold: what its entries are worth
            back = form.choice.unfold
            value = sum(_value(weight, e.tokens, e.tokens, text_free=False, cap=cap) for e in back)
        else:
            value = form.value
        rungs.append(Rung(form.tokens, value, form.text_free))
        choices.append(form.choice)
    return _Unit("library", entry.key, Ladder(tuple(rungs), 0), tuple(choices))


def _limits(size: int, least: int, recoverable: bool, asked: Collection[int] = ()) -> list[int]:
    """An item's preview (or excerpt) limits, largest first: eighths of its ``size``, then
    halving down to ``least``, with the sizes a round fitted to the room (``asked``,
    ``_sized``), and ``least`` itself for a recoverable item larger than it: fine steps
    where the room is."""
    limits = sorted({size * k // _STEPS for k in range(_STEPS - 1, 0, -1)}, reverse=True)
    while limits and limits[-1] // 2 >= least:
        limits.append(limits[-1] // 2)
    limits = [limit for limit in limits if limit >= least]
    if asked:
        limits = sorted({*limits, *(x for x in asked if least <= x < size)}, reverse=True)
    if recoverable and (not limits or limits[-1] > least) and size > least:
        limits.append(least)
    return limits


def _item_unit(
    turn: TurnGraph,
    item: Placement,
    size: int,
    weight: float,
    exact: dict[tuple[str, int], tuple[int, int] | None],
    extra: dict[str, set[int]],
    *,
    line: int | None = None,
    head: int = 0,
    framed: int | None = None,
    held: _Whole | None = None,
) -> _Unit | None:
    """An item attached this turn: the form it has now, previews fitted to halving sizes
    down to ``MIN_PREVIEW_TOKENS`` (recoverable) or excerpts (not), then its line in its
    group's index and its count there (the group, the item the user attached, reaches
    the model by its title and count whatever its members' forms), else a not-sent
    reference. An item the library holds cut (``held``) may instead grow whole there, a
    change of the prefix at its place (``Rung.at``), and be counted in its group's
    index or, in none, referred to. A form holding what the library holds of it is
    valued by what it adds to that (the library's ladder values what it holds). A member
    of a group sent as a reference (re-attached: its text is in the library) is that
    reference or its count in the index (``_reference_unit``). ``line``: the tokens of its
    line in its group's index (None: in no group). None for what has one form only."""
    artifact = turn.artifact(item.key)
    if is_index(artifact) or chunk_source(item.key) is not None:
        return None
    cap = _limit(turn)
    if item.form is Form.REFERENCE:
        return None if line is None else _reference_unit(item, size, weight, head, framed, cap)
    if item.form not in (Form.FULL, Form.PREVIEW, Form.EXCERPT):
        return None
    # A copy of what the library holds tells the model only what it adds to that.
    entry = turn.library.get(item.key)
    held_text = 0
    if entry is not None and entry.content_hash == artifact.content_hash and entry.form in _TEXT:
        held_text = entry.tokens
    base = _value(weight, size, held_text, text_free=False, cap=cap)

    def adds(tokens: int) -> float:
        return max(0.0, _value(weight, size, tokens, text_free=False, cap=cap) - base)

    choices = [_Choice(str(item.form), placement=item)]
    top = _framed(size, framed)  # the whole as the request frames it
    rungs = [Rung(top, adds(size))]
    recoverable = artifact.recoverable
    least = MIN_PREVIEW_TOKENS if recoverable else EXCERPT_MIN_TOKENS
    limits = _limits(size, least, recoverable, extra.get(item.key, ()))
    form = Form.PREVIEW if recoverable else Form.EXCERPT
    name, key, marks = str(form), item.key, item.marks
    for limit in limits:
        placement = Placement(key, form, marks, limit)
        tokens, cost = limit, limit + _SEP
        guess = recoverable and (key, limit) not in exact
        if form is Form.EXCERPT:  # counted as made (an excerpt is cheap; not many are sent)
            ctx = turn.ctx
            view = excerpt_view(artifact, ctx.counter, limit, item.marks, ctx.views)
            if view.body == artifact.payload.body():
                continue  # the whole text under another name: it cuts nothing
            tokens, cost = _block(turn, view)
        elif not guess:
            made = exact[key, limit]
            if made is None:
                break  # a preview holding no section is never sent (nor a smaller one)
            tokens, cost = made
        if cost >= top:
            continue  # no smaller than the whole, once framed
        choices.append(_Choice(name, placement=placement, guess=guess))
        rungs.append(Rung(cost, adds(tokens)))
    if recoverable:
        if line is not None:
            choices.append(_Choice("index"))
            worth = _value(weight, size, line, text_free=True, cap=cap)
            rungs.append(Rung(line + head, worth, True))
            # Counted in its group's index: a line's worth goes, its tokens too, so the
            # text-free share binds the lines like any other text-free form.
            choices.append(_Choice("count"))
            rungs.append(Rung(head, 0.0, True))
        else:
            # A reference to the library's copy (its mark says which form), else to a
            # note not sent.
            marks = item.marks if held_text else (*item.marks, (NOT_SENT, "true"))
            referred, tokens = _referred(turn, item, marks)
            choices.append(_Choice("reference", placement=referred))
            rungs.append(Rung(tokens, _value(weight, size, tokens, text_free=True, cap=cap), True))
    if held is not None:  # beside it: counted in its group's index, else referred to
        # (the library holds it whole now: no mark of a cut form)
        unmarked = tuple(m for m in item.marks if m[0] != "library")
        beside, part = (None, head) if line is not None else _referred(turn, item, unmarked)
        choices.append(_Choice("grown", entry=held.grown, placement=beside))
        rungs.append(Rung(held.tokens + part, adds(size), at=held.at, join=held.join))
    return _Unit("item", item.key, Ladder(tuple(rungs)), tuple(choices))


def _reheaded(unit: _Unit, old: int, head: int) -> _Unit:
    """An item's ``unit`` with its share of its group's index head ``head`` instead of
    ``old``: the forms that send the index (its line, its count, its library entry grown
    with it counted there) cost the difference, the others stay."""
    if old == head:
        return unit
    rungs = tuple(
        attrs.evolve(r, tokens=r.tokens - old + head)
        if c.form in ("index", "count") or (c.form == "grown" and c.placement is None)
        else r
        for r, c in zip(unit.ladder.rungs, unit.choices, strict=True)
    )
    return attrs.evolve(unit, ladder=attrs.evolve(unit.ladder, rungs=rungs))


def _referred(
    turn: TurnGraph, item: Placement, marks: tuple[tuple[str, str], ...]
) -> tuple[Placement, int]:
    """``item`` sent as a reference with ``marks``, and that block's tokens in the
    request (its separator counted)."""
    ref = turn.ctx.renderer.render(reference_view(turn.artifact(item.key), marks))
    placement = attrs.evolve(item, form=Form.REFERENCE, marks=marks, limit=0)
    return placement, turn.ctx.counter.count(ref) + _SEP


def _reference_unit(
    item: Placement, size: int, weight: float, head: int, framed: int | None, cap: int
) -> _Unit:
    """A group's member sent as a reference to its library entry (attached again): the
    reference, or its count in the group's index. Both are text-free, so the share bounds
    them with the rest; with one form only, a folder the library holds whole sent a
    reference for each note, over the share, and the library was cut to make room for
    them (``test_a_re_attached_folder_counts_its_references_within_the_share``)."""
    rungs = (
        Rung(_framed(size, framed), _value(weight, size, size, text_free=True, cap=cap), True),
        Rung(head, 0.0, True),
    )
    return _Unit("item", item.key, Ladder(rungs), (_Choice("reference", placement=item),
                                                    _Choice("count")))  # fmt: skip


def _history_unit(
    turn: TurnGraph,
    sizes: Mapping[int, int],
    relevance: dict[str, float],
    used: int,
    join: _Join = (0.0, None),
) -> _Unit | None:
    """History before the last turn as a recent contiguous suffix, cut from its oldest
    end at ``_cut_points`` (so the cut point, and the cached prefix with it, moves only
    by cuts that free at least the headroom); a turn's value is its tokens weighed by
    recency and relevance, so the oldest go first. ``sizes``: the measured request's
    history turns' tokens (``_turn_tokens``), ``used`` its tokens; a suffix other than
    last turn's breaks the prefix at ``join``'s place, priced the cache before it."""
    budget = turn.ctx.budget
    assert budget is not None
    shown = turn.history_view.start  # the turns L4 shows (``visible_history``) but the last
    turns = [entry.turn for entry in turn.history if entry.turn >= shown][:-1]
    if not turns:
        return None
    size = [sizes.get(t, 0) for t in turns]
    worth = [
        _message_value(budget, n, turn.ctx.turn - t, relevance.get(f"history:{t}", 0.0))
        for t, n in zip(turns, size, strict=True)
    ]
    after = [0] * (len(size) + 1)  # the tokens of the turns from each on
    for i in range(len(size) - 1, -1, -1):
        after[i] = after[i + 1] + size[i]
    rungs: list[Rung] = []
    choices: list[_Choice] = []
    recall = budget.recall and turn.ctx.recall is not None
    for cut in _cut_points(budget, size, recall=recall):
        start = turns[cut] if cut < len(turns) else turns[-1] + 1
        at = (0.0, None) if not rungs else join  # the first rung: last turn's suffix
        rungs.append(Rung(after[cut], sum(worth[cut:]), at=at[1], join=at[0]))
        choices.append(_Choice("text" if cut == 0 else "dropped", start=start))
        if cut >= len(turns):
            break
    free = budget.limit - used
    for start, tokens, value in _earlier(turn, budget, relevance, rungs[0], free):
        rungs.append(Rung(tokens, value, at=join[1], join=join[0]))
        choices.append(_Choice("text", start=start))
    # Last turn's request showed all of these (its own turn aside): the first rung.
    return _Unit("history", "history", Ladder(tuple(rungs), 0, lasting=False), tuple(choices))


def _cut_points(budget: Budget, sizes: list[int], *, recall: bool) -> list[int]:
    """Where the history suffix may start: indices into ``sizes`` (the shown turns'
    tokens, oldest first). None cut, all cut, and between them each point where the turns
    cut since the last point free at least a step: a cut re-sends every turn it keeps
    uncached whatever it frees, and the solve takes the smallest cut that fits, so a cut
    freeing less than the room a turn leaves free would be paid again a turn later.

    The step is the headroom; with ``recall``, at least ``sqrt(2 S g)`` (S the turns'
    tokens, g a turn's on average), the size that makes cuts cheapest over the chat: a cut
    freeing F re-sends about S once for the F / g turns its room lasts, and the room it
    leaves is refilled at most by recalled passages, sent uncached every turn (F / 2 on
    average), and S g / F + F / 2 is least there. Without recall the turns cut are out of
    reach for good, worth more than their price, so cuts stay as small as the headroom."""
    step = max(budget.headroom_tokens, 1)
    if recall and sizes:
        total = sum(sizes)
        step = max(step, math.isqrt(2 * total * total // len(sizes)))
    points, freed = [0], 0
    for at, tokens in enumerate(sizes[:-1], 1):
        freed += tokens
        if freed >= step:
            points.append(at)
            freed = 0
    return [*points, len(sizes)] if sizes else points


def _earlier(
    turn: TurnGraph, budget: Budget, relevance: dict[str, float], shown: Rung, free: int
) -> list[tuple[int, int, float]]:
    """The suffix started earlier again, a turn at a time (its start, tokens and value, as
    far as the ``free`` room could hold): a suffix cut is not for ever, so a turn that gave
    the suffix's room to passages does not leave every later request short of it. Counted
    by the recall memo (so only with recall: nothing else cuts deeper than it must)."""
    memo = turn.ctx.recall
    start = turn.history_view.start
    if memo is None or not budget.recall or not turn.history or turn.history[0].turn >= start:
        return []
    count = turn.ctx.counter
    out: list[tuple[int, int, float]] = []
    tokens, value = shown.tokens, shown.value
    for entry in reversed(turn.history[:-1]):
        if entry.turn >= start:
            continue
        size = sum(
            memo.tokens(f"{entry.turn}:{role}", text, count.count) + budget.per_message_tokens
            for role, text in (("user", entry.user), ("assistant", entry.assistant))
            if text is not None
        )
        worth = _message_value(budget, size, turn.ctx.turn - entry.turn,
                               relevance.get(f"history:{entry.turn}", 0.0))  # fmt: skip
        tokens, value = tokens + size, value + worth
        if tokens - shown.tokens > free:
            break
        out.append((entry.turn, tokens, value))
    return out


RECALL_PRICE = 0.25
"""The least relevance (the retriever's score: 0.5 matches about half the query's weight)
a passage needs to be offered: every recalled token is sent uncached, in this turn only.
Chosen on LoCoMo conversations 26, 41 and 43 (against a gate on the query's best match
and a price per recalled token) as the lowest that keeps the replay's cached share at
least recall off's at 4k, 8k and 16k (docs/BUDGET.md, "Memory"); 0.3 before the
suffix's cuts were sized to last (``_cut_points``)."""


def _recallable(turn: TurnGraph, *, fits: bool) -> bool:
    """Whether ``turn`` may recall: recall on, and a message before the last turn that
    the suffix does not show (or may stop showing: the request does not fit)."""
    budget = turn.ctx.budget
    history = turn.history
    return (
        budget is not None
        and budget.recall
        and turn.ctx.recall is not None
        and len(history) > 1
        and (not fits or history[0].turn < turn.history_view.start)
    )


def _regrows(turn: TurnGraph, sizes: Mapping[int, int], budget: Budget, used: int) -> bool:
    """Whether the suffix could start a turn earlier again (``_earlier``) in the room a
    request that fits leaves beside the reserve (``sizes``: ``_turn_tokens``)."""
    free = budget.limit - _reserve(sizes, budget) - budget.effective(used)
    return bool(_earlier(turn, budget, {}, Rung(0, 0.0), free))


_ABSENT = Rung(0, 0.0)
_PASSAGE_CHOICES = (_Choice("absent"), _Choice("recalled"))


def _passage_units(
    turn: TurnGraph, budget: Budget, *, fits: bool
) -> tuple[list[_Unit], dict[str, Passage], dict[str, float]]:
    """Every earlier message the query matches at least at ``RECALL_PRICE`` as a ladder of
    its own (absent, or sent in the turn's recalled block): valued per token as a history
    turn of its age and relevance is (so a recent suffix turn, cached, is never worth less
    than an older copy of the same words). Best first, as many as the limit could hold.
    A passage is new this turn (after every cached unit).

    Also each suffix turn's relevance on the same scale (its best passage's), so a message
    is worth the same in the suffix as recalled: the suffix's relevance is otherwise read
    against its own best turn, and a suffix that hardly matches the query would be worth
    as much as passages that do."""
    memo = turn.ctx.recall
    if not _recallable(turn, fits=fits) or memo is None or not turn.query.strip():
        return [], {}, {}
    passages = memo.passages(turn.history)
    if not passages:
        return [], {}, {}
    count = turn.ctx.counter.count
    units: list[_Unit] = []
    offered: dict[str, Passage] = {}
    total = 0
    start = turn.history_view.start
    relevances = memo.relevant(passages, turn.query, RECALL_PRICE, start)
    best: dict[int, float] = {}
    for key in memo.since(passages, start):  # the passages the suffix shows (some of)
        rel = relevances.get(key)
        if rel is not None:
            passage, rel = passages[key], min(1.0, rel)
            for at in range(passage.item.turn, passage.last + 1):
                if best.get(at, -1.0) < rel:
                    best[at] = rel
    shown = {f"history:{at}": rel for at, rel in best.items()}
    ranked = sorted(
        ((key, rel) for key, rel in relevances.items() if rel >= RECALL_PRICE),
        key=lambda h: (-h[1], h[0]),
    )
    for key, rel in ranked:
        if total > budget.limit:
            break  # best first: the rest are worth less, or could not fit beside these
        passage = passages[key]
        tokens = memo.cost(passage.item, count)
        total += tokens
        worth = _message_value(budget, tokens, turn.ctx.turn - passage.last, min(1.0, rel))
        ladder = Ladder((_ABSENT, Rung(tokens, worth)), lasting=False)
        units.append(_Unit("passage", key, ladder, _PASSAGE_CHOICES))
        offered[key] = passage
    return units, offered, shown


def _l1_unit(turn: TurnGraph, measured: Draft) -> _Unit | None:
    """L1's mutable part: whole, its preview, then halving excerpts."""
    text = turn.system.mutable
    counter = turn.ctx.counter
    tokens = counter.count(text)
    if tokens <= EXCERPT_MIN_TOKENS:
        return None
    choices = [_Choice("text", text=text)]
    cap = _limit(turn)
    rungs = [Rung(tokens, _value(1.5, tokens, tokens, text_free=False, cap=cap))]
    preview = make_preview(text, counter, section_tokens=turn.ctx.policy.section_tokens).text
    size = counter.count(preview)
    if size < tokens:
        choices.append(_Choice("preview", text=preview))
        rungs.append(Rung(size, _value(1.5, tokens, size, text_free=False, cap=cap)))
    limit = tokens // 2
    while limit >= EXCERPT_MIN_TOKENS:
        cut = make_excerpt(text, counter, limit).text
        choices.append(_Choice("excerpt", text=cut))
        rungs.append(Rung(counter.count(cut), _value(1.5, tokens, limit, text_free=False, cap=cap)))
        limit //= 2
    return _Unit("l1", "system:mutable", Ladder(tuple(rungs), 0), tuple(choices))


def _open_groups(turn: TurnGraph) -> dict[str, tuple[int, tuple[str, ...]]]:
    """Each library group a new index would start in: its head's tokens (with its
    separator) and the entries after its last index (those it would take). A fold
    extends the group's first index after the entry, so where one stands the entry is
    in no group here; an entry set aside costs no head: that index is not sent."""
    entries = turn.library.entries
    later: set[str] = set()  # groups with an index after the entry being read
    open_: dict[str, list[str]] = {}  # each group's entries after its last index
    for entry in reversed(entries):
        if entry.view.source_type == INDEX_SOURCE:
            later.add(entry.view.locator)
            continue
        group = stub_group(entry.whole_view)
        if group not in later:
            open_.setdefault(group, []).append(entry.key)
    return {g: (_Renderer(turn).head(g) + _SEP, tuple(keys)) for g, keys in open_.items()}


def _heads(
    groups: Mapping[str, tuple[int, tuple[str, ...]]], taking: Mapping[str, int]
) -> dict[str, int]:
    """Each library entry's share of a new index's head in its group (``_open_groups``): the
    head split over as many lines as a measured round's index of the group took
    (``taking``), else over every entry it could take. An index line's rung costs its
    share, so a head one line would carry alone is priced whole once measured."""
    heads: dict[str, int] = {}
    for group, (whole, keys) in groups.items():
        heads.update(_shares(whole, keys, taking.get(group, len(keys))))
    return heads


def _taking(
    units: Sequence[_Unit],
    choice: Sequence[int],
    groups: Mapping[str, tuple[int, tuple[str, ...]]],
    taking: Mapping[str, int],
) -> dict[str, int]:
    """``taking`` narrowed to what ``choice`` (a measured round's) gives each group's new
    index: where it lists fewer lines than the head is split over (``_heads``), the head
    is split over those from now on. A split only narrows, so the rounds do not swing
    between two prices of one head."""
    group_of = {key: g for g, (_, keys) in groups.items() for key in keys}
    lines: dict[str, int] = {}
    for unit, c in zip(units, choice, strict=True):
        g = group_of.get(unit.key) if unit.kind == "library" else None
        if g is not None and unit.choices[c].line:
            lines[g] = lines.get(g, 0) + 1
    out = dict(taking)
    for g, n in lines.items():
        if n < out.get(g, len(groups[g][1])):
            out[g] = n
    return out


def _sent_heads(
    units: Sequence[_Unit],
    choice: Sequence[int],
    of: _Items,
    groups: Mapping[str, tuple[int, tuple[str, ...]]],
    drafted: Draft,
) -> dict[str, int]:
    """The head of each of this turn's groups' indexes ``drafted`` sends whose head its
    members' rungs still share (``groups``' head not 0), to be fixed: the block less the
    lines ``choice`` gave it, as measured, or the head with a count line
    (``_Items.groups``) if that is more, as a later round may count members a lines-only
    index did not."""
    sent = drafted.with_sep()
    heads: dict[str, int] = {}
    for group, (head, keys) in groups.items():
        block = sent.get(f"{INDEX_SOURCE}:{group}")
        if block is None or not head:
            continue
        members = set(keys)
        lines = sum(
            of.lines.get(u.key, 0)
            for u, c in zip(units, choice, strict=True)
            if u.kind == "item" and u.key in members and u.choices[c].form == "index"
        )
        heads[group] = max(block - lines, of.groups[group][0])
    return heads


def _shares(whole: int, keys: Sequence[str], slots: int | None = None) -> dict[str, int]:
    """``whole`` (an index head) split into ``slots`` shares (one per key by default)
    that sum to it, dealt to ``keys`` in turn: any ``slots`` keys in a row carry it
    once. Rounding each share up would count a large group's head once per member."""
    n = max(1, len(keys) if slots is None else slots)
    return {key: whole * (i % n + 1) // n - whole * (i % n) // n for i, key in enumerate(keys)}


def _cached_units(
    turn: TurnGraph,
    measured: Draft,
    budget: Budget,
    relevance: dict[str, float],
    sizes: Mapping[int, int],
    used: int,
    heads: Mapping[str, int],
) -> tuple[list[_Unit], dict[str, _Whole]]:
    """The units of the cached prefix, in its order: L1's mutable part, the library,
    history (``sizes``: ``measured``'s history turns' tokens, ``used`` its tokens;
    ``heads``: each entry's share of a new index's head, ``_heads``); and the entries of
    the items sent again in L3 that could grow whole in their place (``_wholes``)."""
    units: list[_Unit] = []
    l1 = _l1_unit(turn, measured)
    if l1 is not None:
        units.append(l1)
    referenced = {i.key for i in turn.items if i.form is Form.REFERENCE}
    sent = {i.key for i in turn.items if i.form is not Form.REFERENCE}
    now = turn.ctx.turn
    place = {entry.key: len(units) + i for i, entry in enumerate(turn.library.entries)}
    for entry in turn.library.entries:
        # Re-attached: what the user asks for now, age 0.
        age = 0 if entry.key in referenced else now - entry.turn
        w = _weight(budget, entry.view.source_type, age, relevance.get(entry.key, 0.0))
        head = heads.get(entry.key, 0)
        units.append(_library_unit(turn, entry, w, head, sent=entry.key in sent))
    # The library's growth since the batch settled is sent in history's messages: a cut
    # of history sends the library as built, so it breaks the prefix at that growth.
    grown = _grown(turn)
    held = sum(e.tokens + _SEP for e in grown)
    at = (budget.cache_weight * held, place[grown[0].key]) if grown else (0.0, None)
    history = _history_unit(turn, sizes, relevance, used, at)
    if history is not None:
        units.append(history)
    return units, _wholes(turn, units, sent, budget)


def _wholes(
    turn: TurnGraph, units: Sequence[_Unit], sent: Collection[str], budget: Budget
) -> dict[str, _Whole]:
    """Each library entry holding less than its note while the note is attached again
    (sent in L3, ``sent``): the entry whole in its place, its tokens over the form it
    holds and the cache price of the prefix from its place. Grown there, the item needs
    no copy in L3 (it is a reference, or counted in its group's index) and the next turn
    nothing to give back; the library's own ladder holds no whole while the item is sent
    (not twice)."""
    ctx = turn.ctx
    after = 0
    wholes: dict[str, _Whole] = {}
    for at in range(len(units) - 1, -1, -1):
        unit = units[at]
        after += unit.ladder.rungs[unit.ladder.previous or 0].tokens
        entry = turn.library.get(unit.key) if unit.kind == "library" else None
        if entry is None or unit.key not in sent:
            continue
        artifact = turn.artifact(unit.key)
        if entry.content_hash != artifact.content_hash or not artifact.recoverable:
            continue  # pinned to an older version, or not to be sent whole again
        view = full_view(artifact)
        text = ctx.renderer.render(view)
        tokens = ctx.counter.count(text)
        now = unit.ladder.rungs[0]
        if tokens + _SEP <= now.tokens:
            continue
        grown = LibraryEntry(view, text, tokens, ctx.turn, tokens)
        join = budget.cache_weight * after
        wholes[unit.key] = _Whole(grown, tokens + _SEP - now.tokens, at, join)
    return wholes


def _grown(turn: TurnGraph) -> tuple[LibraryEntry, ...]:
    """The library entries taken in since the batch settled (``TurnGraph.settled``): the
    request as sent holds them in history's messages, not in its system message."""
    return () if turn.settled is None else turn.library.entries[turn.settled :]


@attrs.frozen
class _Items:
    """What every ladder of this turn's items reads from the measured request and the
    groups, the same in each of a turn's rounds: made once a turn (``_items_of``)."""

    sizes: dict[str, int]
    """Each item's tokens as measured."""
    framed: dict[str, int | None]
    """Each item's tokens with its separator, as the request frames it."""
    lines: dict[str, int]
    """The tokens of each grouped item's line in its group's index (an item in no group
    has none)."""
    groups: dict[str, tuple[int, tuple[str, ...]]]
    """Each group's index head (with its separator) and its members, split over them as
    ``_heads`` says."""


def _items_of(turn: TurnGraph, measured: Draft) -> _Items:
    """``_Items`` of ``turn`` as ``measured``: each group's index head is the block of
    one line and a count of the rest, less the line."""
    sizes = {s.key: s.tokens for s in measured.l3.segments}
    groups = _groups(turn)
    lines = {
        m.key: _index_line_tokens(turn, m.key, turn.artifact(m.key).title, sizes.get(m.key, 0))
        for members in groups.values()
        for m in members
    }
    heads: dict[str, tuple[int, tuple[str, ...]]] = {}
    ctx = turn.ctx
    for group, members in groups.items():
        if not members:
            continue
        first = members[0].key
        line = IndexLine(first, turn.artifact(first).title, sizes.get(first, 0))
        index = index_artifact(group, (line,), unlisted=len(members))
        head = ctx.counter.count(ctx.renderer.render(full_view(index))) - lines[first]
        heads[group] = (head + _SEP, tuple(m.key for m in members))
    return _Items(sizes, measured.with_sep(), lines, heads)


def _item_units(
    turn: TurnGraph,
    of: _Items,
    budget: Budget,
    relevance: dict[str, float],
    exact: dict[tuple[str, int], tuple[int, int] | None],
    extra: dict[str, set[int]],
    growing: Mapping[str, _Whole],
    heads: Mapping[str, int],
    previous: Sequence[_Unit] = (),
    stale: Collection[str] = (),
) -> list[_Unit]:
    """The units of this turn's items, after every cached unit (``growing``: the library
    entries they may grow, ``_wholes``; ``heads``: each grouped item's share of its
    group's index head, ``_heads``): those of ``previous`` (the same turn's, made before)
    again but for the ``stale`` keys' (their ``exact``, ``extra`` or share grew), made
    anew."""
    kept = {u.key: u for u in previous if u.key not in stale}
    units: list[_Unit] = []
    for i, item in enumerate(turn.items):
        if item.key in kept:
            units.append(kept[item.key])
            continue
        artifact = turn.artifact(item.key)
        w = _weight(budget, artifact.source_type, 0, relevance.get(item.key, 0.0))
        w *= 1.0 - i / (1000.0 * (len(turn.items) + 1))  # ties: the first placed first
        unit = _item_unit(
            turn, item, of.sizes.get(item.key, 0), w, exact, extra,
            line=of.lines.get(item.key), head=heads.get(item.key, 0),
            framed=of.framed.get(item.key), held=growing.get(item.key),
        )  # fmt: skip
        if unit is not None:
            units.append(unit)
    return units


_ACTIONS = {
    "preview": DecisionAction.COMPACTED,
    "summary": DecisionAction.COMPACTED,
    "excerpt": DecisionAction.EXCERPTED,
    "evicted": DecisionAction.EVICTED,
    "index": DecisionAction.INDEXED,
    "reference": DecisionAction.NOT_SENT,
    "dropped": DecisionAction.HISTORY_CUT,
}

_LAYERS = {"l1": "L1", "library": "L2", "history": "L4", "item": "L3"}


def _decision(unit: _Unit, old: _Choice, new: _Choice, saved: int) -> Decision:
    layer = _LAYERS[unit.kind]
    grows = saved < 0
    action = (
        DecisionAction.RESTORED
        if grows and unit.kind != "item"
        else _ACTIONS.get(new.form, DecisionAction.COMPACTED)
    )
    if unit.kind == "history" and grows:
        return Decision("budget", f"history:{new.start}-{old.start - 1}", "dropped", "text",
                        "earlier history turns given back (room and value outweigh the cache "
                        "it breaks)", saved, layer=layer, action=action)  # fmt: skip
    if unit.kind == "history":
        action = DecisionAction.HISTORY_CUT
        return Decision("budget", f"history:{old.start}-{new.start - 1}", "text", "dropped",
                        "the oldest history turns dropped (the objective keeps a recent suffix)",
                        saved, layer=layer, action=action)  # fmt: skip
    why = (
        "given back (room and value outweigh the cache it breaks)"
        if grows
        else "cut (the objective's best use of the room)"
    )
    to = new.form
    unsent = new.placement is None or (NOT_SENT, "true") in new.placement.marks
    if new.form == "reference" and not unsent:  # a reference to the library's copy
        action = DecisionAction.REFERENCED
    if new.form == "count":
        to = "dropped"  # set aside: kept in the library's index not sent (``SET_ASIDE``)
    elif new.form not in ("preview", "summary", "excerpt", "evicted", "index", "reference", "text"):
        to = "full"  # whole again, or an index unfolded into its entries
    return Decision(
        "budget",
        unit.key,
        old.form,
        to,
        f"{unit.kind} {why}: {old.form} -> {new.form}",
        saved,
        layer=layer,
        action=action,
    )


def _apply(
    turn: TurnGraph,
    units: Sequence[_Unit],
    choice: Sequence[int],
    passages: Mapping[str, Passage],
    *,
    join: bool = False,
) -> tuple[TurnGraph, list[Decision], ItemBlock | None]:
    """``turn`` with each unit in its chosen form, and a decision per changed unit; the
    chosen ``passages`` (those before the suffix's start) in one recalled block, also
    given as measured (None: no passage). With ``join`` a fold extends its group's index
    before its entries rather than start a new one (``stubs.fold``)."""
    library = turn.library
    items = list(turn.items)
    at = {item.key: i for i, item in enumerate(items)}
    history = turn.history_view
    system = turn.system
    decisions: list[Decision] = []
    warnings: list[TurnWarning] = []
    folds: dict[str, tuple[list[LibraryEntry], list[LibraryEntry]]] = {}
    indexed: dict[str, bool] = {}
    unfolds: list[tuple[str, tuple[LibraryEntry, ...]]] = []
    recalled: list[Passage] = []
    # Items grown whole in the library: its entry's own choice gives way.
    grown = {u.key for u, c in zip(units, choice, strict=True) if u.choices[c].form == "grown"}
    for unit, c in zip(units, choice, strict=True):
        ladder = unit.ladder
        base = ladder.previous if ladder.previous is not None else 0
        if c == base or (unit.kind == "library" and unit.key in grown):
            continue
        if unit.kind == "passage":
            recalled.append(passages[unit.key])
            continue
        old, new = unit.choices[base], unit.choices[c]
        saved = ladder.rungs[base].tokens - ladder.rungs[c].tokens
        if new.form == "grown":
            assert new.entry is not None
            current = library.get(unit.key)
            assert current is not None
            library = library.replace(new.entry)
            decisions.append(Decision(
                "budget", unit.key, str(current.form), "full",
                f"library given back whole in place of its copy in L3: {current.form} -> full",
                current.tokens - new.entry.tokens, layer="L2", action=DecisionAction.RESTORED,
            ))  # fmt: skip
            if new.placement is None:
                indexed[unit.key] = False  # counted in its group's index
            else:
                items[at[unit.key]] = new.placement
            continue
        if unit.kind != "item" or new.form not in ("index", "count"):
            decisions.append(_decision(unit, old, new, saved))
        warnings += (TurnWarning("summary-failed", unit.key, f"summary: {f}") for f in new.failures)
        if unit.kind == "l1":
            system = SystemPrompt(system.stable, new.text)
        elif unit.kind == "history":
            history = HistoryView(new.start, history.shortened)
        elif unit.kind == "library":
            current = library.get(unit.key)
            assert current is not None
            if new.unfold:
                unfolds.append((unit.key, new.unfold))
            elif new.form in ("index", "count") and new.entry is None:
                stub = attrs.evolve(
                    current.whole_view, form=Form.REFERENCE, body="", marks=(("evicted", "true"),)
                )
                # Lines join their group's index; counts the library's one count.
                group = stub_group(current.whole_view) if new.form == "index" else SET_ASIDE
                lines, counts = folds.setdefault(group, ([], []))
                (lines if new.form == "index" else counts).append(_entry(turn, stub, current))
            else:
                assert new.entry is not None
                library = library.replace(new.entry)
        elif new.form in ("index", "count"):
            indexed[unit.key] = new.form == "index"
        else:
            assert new.placement is not None
            items[at[unit.key]] = new.placement
    changed = {d.target for d in decisions if d.layer == "L2"} - grown
    for i, item in enumerate(items):
        if (
            item.form is Form.REFERENCE
            and item.key in changed
            and (NOT_SENT, "true") not in item.marks
        ):
            # A reference must find its entry as it was: the item is listed as not sent.
            items[i] = attrs.evolve(item, marks=(*item.marks, (NOT_SENT, "true")))
            reason = "re-attached item not sent: its library entry was cut for lack of room"
            decisions.append(Decision("budget", item.key, "reference", "reference", reason,
                                      layer="L3", action=DecisionAction.NOT_SENT))  # fmt: skip
    for key, back in unfolds:
        # An entry the library holds on its own again (attached anew, or back from another
        # index this turn) stays where it is: the index gives back only the others.
        held = {e.key for e in library.entries} - {key}
        library = library.unfold(key, [e for e in back if e.key not in held])
    for group, (lines, counts) in folds.items():
        library, _, _ = fold(turn, library, group, lines, counts, join=join)
    for key, back in unfolds:
        library = _in_place(library, key, [e.key for e in back])
    recalled = [p for p in recalled if p.last < history.start]
    block = None
    if recalled:
        block = recalled_block(recalled, turn)
        graph = turn.graph.copy()
        graph.add_node(block.artifact.key, kind="artifact", artifact=block.artifact)
        items.append(block.placement)
        turn = attrs.evolve(turn, graph=graph)
        decisions.append(_recalled_decision(recalled, block.segment.tokens))
    out = attrs.evolve(
        turn,
        library=library,
        items=tuple(items),
        history_view=history,
        system=system,
        warnings=(*turn.warnings, *warnings),
    )
    for group, members in _groups(out).items():
        gone = [m.key for m in members if m.key in indexed]
        if gone:
            out, made = _indexed(out, group, members, gone, {k for k in gone if indexed[k]})
            decisions.append(made)
    return out, decisions, block


def _recalled_decision(recalled: Sequence[Passage], tokens: int) -> Decision:
    """The one decision of a turn's recalled block: how many passages, from which turns
    (one decision a turn, not one a passage: a long chat's trace stays its size)."""
    turns = sorted({p.item.turn for p in recalled})
    span = f"turn {turns[0]}" if len(turns) == 1 else f"turns {turns[0]}-{turns[-1]}"
    n = len(recalled)
    return Decision(
        "budget",
        f"{RECALL_SOURCE}:{HISTORY_BLOCK}",
        "dropped",
        "full",
        f"{n} earlier message{'s' if n != 1 else ''} the query matches ({span}, "
        f"{tokens} tokens), sent in this turn only",
        layer="L3",
        action=DecisionAction.RECALLED,
    )


def _in_place(library: Library, key: str, unfolded: Sequence[str]) -> Library:
    """``library`` with the index ``key`` (made again this turn by a fold of its group,
    after it was unfolded) where the old one stood: right before the first of the
    entries it unfolded that is still there (a fold makes it where the first entry it
    takes stood, before or after that), so no key moves past another."""
    index = library.get(key)
    anchor = next((k for k in unfolded if k in library and k != key), None)
    if index is None or anchor is None:
        return library
    keys = library.keys()
    if keys.index(key) == keys.index(anchor) - 1:
        return library
    rest = [e for e in library.entries if e.key != key]
    at = next(i for i, e in enumerate(rest) if e.key == anchor)
    return Library((*rest[:at], index, *rest[at:]))


def _indexed(
    turn: TurnGraph, group: str, members: Sequence[_Member], gone: Sequence[str], lines: set[str]
) -> tuple[TurnGraph, Decision]:
    """``turn`` with the items ``gone`` (in placement order) in ``group``'s index: those of
    ``lines`` as lines, the rest counted; and the group's one decision."""
    listed = [k for k in gone if k in lines]
    counted = len(gone) - len(listed)
    rest = set(gone) - lines  # the counted
    # Counted references (attached again) to entries the library holds as they were: their
    # text is in the conversation already (``_apply`` marks the others not sent).
    earlier = sum(
        1
        for i in turn.items
        if i.key in rest and i.form is Form.REFERENCE and (NOT_SENT, "true") not in i.marks
    )
    unlisted = counted - earlier
    if listed:
        out = _with_index(turn, group, members, set(listed), unlisted, earlier)
        out = attrs.evolve(out, items=tuple(i for i in out.items if i.key not in rest))
    else:  # nothing listed: the index counts them all, in the first one's place
        key = f"{INDEX_SOURCE}:{group}"
        out = _with_index(turn, group, members, rest)
        out = out.with_artifact(index_artifact(group, (), unlisted, earlier=earlier))
        kept = tuple(i for i in out.items if i.key not in rest or i.key == key)
        out = attrs.evolve(out, items=kept)
    why = (
        "no form of each fits"
        if not counted
        else f"{counted} counted: their lines are worth less than the room and the text-free "
        "share they take"
    )
    reason = (
        f"{len(gone)} item{'s' if len(gone) != 1 else ''} of {group} listed in its index ({why})"
    )
    return out, Decision(
        "budget", group, "items", "index", reason, layer="L3", action=DecisionAction.INDEXED
    )


def _summarized(turn: TurnGraph, units: Sequence[_Unit], choice: Sequence[int]) -> bool:
    """Make the library summaries ``choice`` takes that were not made yet (memoized by the
    turn's summary cache); whether there were any."""
    ctx = turn.ctx
    made = False
    for unit, c in zip(units, choice, strict=True):
        wanted = unit.choices[c].summary
        if wanted is not None:
            memo_key, body, target = wanted
            ctx.summaries.summarize(ctx.summarizer, memo_key, body, target)
            made = True
    return made


def _made(
    turn: TurnGraph,
    units: Sequence[_Unit],
    choice: Sequence[int],
    exact: dict[tuple[str, int], tuple[int, int] | None],
) -> set[str]:
    """Make the guessed previews ``choice`` takes (their exact tokens, alone and framed as
    a block of the request, into ``exact``; None for one that holds no section); the keys
    of the units made. Where one measures more than its guess (a preview's floor: its title
    and first lines), every unit's guessed rung next above its choice is made too: the
    next solve would take those one at a time, each over its guess in turn."""
    made: set[str] = set()
    over = False
    for unit, c in zip(units, choice, strict=True):
        chosen = unit.choices[c]
        if not chosen.guess or chosen.placement is None:
            continue
        made.add(unit.key)
        # The smaller ones too: the next solve may take them.
        for j, other in enumerate(unit.choices):
            placement = other.placement
            if other.guess and placement is not None and placement.limit <= chosen.placement.limit:
                cost = _make(turn, unit.key, placement, exact)
                over = over or (j == c and cost > unit.ladder.rungs[c].tokens)
    if over:
        for unit, c in zip(units, choice, strict=True):
            up = next((o for o in reversed(unit.choices[:c]) if o.guess), None)
            if up is not None and up.placement is not None:
                _make(turn, unit.key, up.placement, exact)
                made.add(unit.key)
    return made


def _as_made(
    guessed: Sequence[_Unit],
    units: Sequence[_Unit],
    solution: Solution,
    room: int,
    cache_price: float,
    carried: Carried | None,
    text_free: int,
) -> Solution | None:
    """``solution`` on ``units``, the ladders its guessed previews were made into, if it
    still fits ``room`` and the made previews freed at most ``SOLVE_TOLERANCE`` of it,
    that spent on this turn's items' made forms by the greedy's last pass
    (``solver.topped``; None: solve again).
    A made preview measures a few tokens under its guess, and each solve after spent them
    on the next guess: 20 of a 1,600-note folder turn's 27 solves at 200k."""
    if len(guessed) != len(units):
        return None
    choice: list[int] = []
    for old, new, c in zip(guessed, units, solution.choice, strict=True):
        want = old.choices[c]
        at = c if old.choices is new.choices else next(
            (j for j, o in enumerate(new.choices)
             if (o.form, o.placement, o.entry) == (want.form, want.placement, want.entry)),
            None,
        )  # fmt: skip
        if at is None:
            return None
        choice.append(at)
    ladders = [u.ladder for u in units]
    tokens = sum(ladder.rungs[c].tokens for ladder, c in zip(ladders, choice, strict=True))
    # Extending the batch, the choice fits the room less what that carries; it is scored
    # against the room itself (``scored`` takes that off).
    fits = room
    if carried is not None and not solution.sent_as_built:
        fits -= carried.tokens
    if tokens > fits or (solution.tokens - tokens) > fits * SOLVE_TOLERANCE:
        return None
    # What the made previews freed goes to this turn's items (new in the request: no
    # cache price), never to a guessed preview (one is made only when a solve takes it).
    items = [j for j, u in enumerate(units) if u.kind == "item"]
    barred = {
        (j, k)
        for j in items
        for k, c in enumerate(units[j].choices)
        if c.guess or ladders[j].rungs[k].at is not None  # a guess, or a change of the prefix
    }
    choice = list(topped(ladders, choice, fits, text_free, items, barred))
    out = scored(ladders, choice, cache_price, room, carried)
    return attrs.evolve(out, free_value=solution.free_value, bought=solution.bought)


def _make(
    turn: TurnGraph,
    key: str,
    placement: Placement,
    exact: dict[tuple[str, int], tuple[int, int] | None],
) -> int:
    """Make one guessed preview into ``exact``; its framed tokens (0: it holds no prose)."""
    view = fitted_preview(turn, placement)
    if not has_prose(view.body):
        exact[key, placement.limit] = None
        return 0
    exact[key, placement.limit] = made = _block(turn, view)
    return made[1]


def _block(turn: TurnGraph, view: View) -> tuple[int, int]:
    """``view``'s block as the request sends it: its tokens, and with the blank line
    after it (``_framed``)."""
    counter = turn.ctx.counter
    text = turn.ctx.renderer.render(view)
    tokens = counter.count(text)
    return tokens, _framed(tokens, count_with_sep_from(text, tokens, BLOCK_SEP, counter.count))


def _sized(
    units: Sequence[_Unit], solution: Solution, room: int, extra: dict[str, set[int]]
) -> str | None:
    """A preview sized to the room ``solution`` leaves (into ``extra``) for the item it
    cut whose next rung up does not fit, the one of most value per token: the greedy's
    fractional step, made whole. The key of the item given one (None: none).
    ``solution``'s previews are made (``_made``): a guessed one measures at most its
    limit, so a room sized before they are is lost again when they are."""
    left = room - solution.tokens
    best: tuple[float, _Unit, int] | None = None
    for unit, c in zip(units, solution.choice, strict=True):
        if unit.kind != "item" or c == 0 or left < MIN_PREVIEW_TOKENS // 2:
            continue
        chosen, top = unit.ladder.rungs[c], unit.ladder.rungs[0]
        placement = unit.choices[c].placement
        if placement is None or placement.form is Form.REFERENCE:
            continue
        slope = (top.value - chosen.value) / max(1, top.tokens - chosen.tokens)
        if best is None or slope > best[0]:
            best = (slope, unit, chosen.tokens - _SEP + left)
    if best is None:
        return None
    _, unit, limit = best
    extra.setdefault(unit.key, set()).add(limit)
    return unit.key


def _held(
    units: Sequence[_Unit], choice: Sequence[int], passages: Mapping[str, Passage]
) -> set[str]:
    """The chosen passages that the chosen history suffix shows too."""
    start = next(
        (u.choices[c].start for u, c in zip(units, choice, strict=True) if u.kind == "history"),
        None,
    )
    if start is None:
        return set()
    return {
        u.key
        for u, c in zip(units, choice, strict=True)
        if u.kind == "passage" and c == 1 and passages[u.key].last >= start
    }


def _text_free_tokens(drafted: Draft) -> int:
    """Tokens of the drafted request's blocks without prose: index blocks and references
    (library stubs, not-sent items), as measured."""
    return sum(
        s.tokens
        for s in (*drafted.l2.segments, *drafted.l3.segments)
        if s.source_type == INDEX_SOURCE or s.form is Form.REFERENCE
    )


def _turn_tokens(measured: Draft, budget: Budget) -> dict[int, int]:
    """Each history turn's tokens in the ``measured`` request (its messages, framed)."""
    turns: dict[int, int] = {}
    for seg in measured.l4.segments:
        parts = seg.key.split(":")
        if len(parts) > 2 and parts[1].isdigit():
            at = int(parts[1])
            turns[at] = turns.get(at, 0) + seg.tokens + budget.per_message_tokens
    return turns


def _carried(turn: TurnGraph, measured: Draft, used: int) -> int:
    """The tokens the request as sent holds beyond ``measured`` (the request as built,
    ``used`` tokens) if it extends the batch: its system message holds the settled
    entries only, its earlier user messages the library's growth and what came with it
    where the build has their queries. Those messages as they were sent
    (``TurnGraph.deferred``) if that fits the limit or the batch cannot shed, else as
    the batch's shed sends them (``TurnGraph.shed``), the fewer of the two where both
    are over (a cut may make either fit)."""
    budget = turn.ctx.budget
    if not turn.deferred or turn.settled is None or budget is None:
        return 0
    sent = _as_sent(turn, measured, used, turn.deferred)
    if budget.effective(sent) <= budget.limit or not turn.shed:
        return sent - used
    shed = sent if turn.shed == turn.deferred else _as_sent(turn, measured, used, turn.shed)
    return min(sent, shed) - used


def _as_sent(
    turn: TurnGraph, measured: Draft, used: int, counts: Sequence[tuple[int, int]]
) -> int:
    """The tokens of ``measured`` (``used``) sent with the batch's messages of ``counts``
    ((turn, tokens)) where it has their queries (``_carried``)."""
    budget = turn.ctx.budget
    assert budget is not None and turn.settled is not None
    messages = {f"history:{t}:user": n for t, n in counts}
    queries = {s.key: s.tokens for s in measured.l4.segments}
    more = sum(n - queries[k] for k, n in messages.items() if k in queries)
    if more <= 0 and measured.l2.tokens == turn.settled_tokens:
        return used + more  # the messages hold their queries only, the system message the library
    return sent_tokens(measured, turn.settled, turn.settled_tokens, messages,
                       turn.ctx.counter, budget.framing)  # fmt: skip


def _carrying(
    turn: TurnGraph, units: Sequence[_Unit], sizes: Mapping[int, int], carried: int
) -> Carried | None:
    """What the request as sent carries (``_carried``) from the first unit the request as
    built changes against it: the first library entry taken in since the batch settled
    (the later ones whose blocks the batch cannot shed from, ``TurnGraph.sheds``, held),
    else history's suffix from the batch's first message (``sizes``: ``_turn_tokens``),
    else none (the batch began with the last turn, whose message every choice sends)."""
    if carried <= 0:
        return None
    grown = {entry.key for entry in _grown(turn)}
    first = min(t for t, _ in turn.deferred)
    for j, u in enumerate(units):
        if u.kind == "library" and u.key in grown:
            held = frozenset(
                k for k in range(j + 1, len(units))
                if units[k].kind == "library" and units[k].key in grown
                and units[k].key not in turn.sheds and units[k].ladder.previous is not None
            )  # fmt: skip
            return Carried(j, carried, held=held)
        if u.kind == "history":
            shown = u.choices[u.ladder.previous or 0].start
            last = turn.history[-1].turn
            resent = sum(n for t, n in sizes.items() if max(first, shown) <= t < last)
            return Carried(j if first < last else len(units), carried, resent)
    return Carried(len(units), carried)


def _shed_from_stale(turn: TurnGraph, units: list[_Unit]) -> list[_Unit]:
    """``units`` with every change to a library entry the batch sheds from
    (``TurnGraph.sheds``) after its first stale block (``TurnGraph.stale``) breaking the
    prefix at that block (``Rung.at``): the shed re-sends from there, not from the entry.
    Priced at its own place, a give-back of the last three entries of a 296-entry folder
    looked nearly free and re-sent 13,000 tokens from a note compacted as it entered the
    library (zettel-yoshi at 32k)."""
    if not turn.stale:
        return units
    sheds = set(turn.sheds)
    place = 0
    at: int | None = None
    out = []
    for unit in units:
        ladder = unit.ladder
        if ladder.previous is None:
            out.append(unit)
            continue
        if unit.key == turn.stale:
            at = place
        elif at is not None and unit.kind == "library" and unit.key in sheds:
            rungs = tuple(
                r if i == ladder.previous or (r.at is not None and r.at <= at)
                else attrs.evolve(r, at=at)
                for i, r in enumerate(ladder.rungs)
            )  # fmt: skip
            unit = attrs.evolve(unit, ladder=attrs.evolve(ladder, rungs=rungs))
        out.append(unit)
        place += 1
    return out


def _reserve(turns: Mapping[int, int], budget: Budget) -> int:
    """What a turn that changes forms leaves free for the next turns' growth: what the
    last turn added to history (its query and reply, framed: ``turns``, the measured
    request's ``_turn_tokens``), at least ``Budget.headroom`` of the limit."""
    grew = turns[max(turns)] if turns else 0
    return max(math.floor(budget.limit * budget.headroom), grew)


def _kept(
    units: Sequence[_Unit],
    solution: Solution,
    price: float,
    room: int,
    text_free: int,
    reserve: int,
    shown: Collection[str],
    carried: Carried | None = None,
) -> tuple[int, ...] | None:
    """The request as it is (every unit in its present form, the first rung: it fits
    ``room``) with the passages that fit beside it outside ``reserve``, if that is worth
    at least ``solution``: a request that fits is changed only for more. Passages are
    this turn's only; they leave ``reserve`` free: what the request as sent carries
    beyond this count (it extends the last one, ``Envelope.batch``, whose messages hold
    more tokens than the build: ``_carried``), and at least the reserve where the library
    has grown since the batch settled (``TurnGraph.settled``). One that passages push over
    the limit as sent is sent as built: a settle, its prefix broken from the batch's
    first message or, the library grown, from its growth. The suffix keeps its start, so
    a passage it shows (``shown``: their keys) is never sent (``_apply``): none takes room
    another could use. With ``carried`` (what the request over the limit as sent
    carries), it is priced as the settle it makes: sent as built (``solver.Carried``)."""
    whole = [u.ladder for u in units]
    choice = tuple(0 for _ in units)
    if any(u.kind == "passage" for u in units):
        base = sum(u.ladder.rungs[0].tokens for u in units if u.kind != "passage")
        # Forms that alone exceed ``room`` keep it (no request kept: None below).
        beside = max(room - reserve, min(base, room))
        at = [j for j, u in enumerate(units) if u.kind != "passage" or u.key not in shown]
        others = [units[j] for j in at]
        if _plain_passages(others):
            found = _passages_beside(others, beside)
        else:
            ladders = [
                u.ladder if u.kind == "passage" else Ladder((u.ladder.rungs[0],), 0) for u in others
            ]
            kept = solve(ladders, beside, cache_price=price, text_free=text_free)
            found = None if kept is None else kept.choice
        if found is None:
            return None
        picked = [0] * len(units)
        for j, c in zip(at, found, strict=True):
            picked[j] = c if units[j].kind == "passage" else 0
        choice = tuple(picked)
    # Over the limit as sent (``carried``), the request kept settles: it is sent as built.
    score = scored(whole, choice, price, None if carried is None else room, carried)
    return choice if score.objective >= solution.objective else None


def _regret(
    turn: TurnGraph,
    units: Sequence[_Unit],
    solution: Solution,
    choice: Sequence[int],
    *,
    extending: bool,
) -> float:
    """The regret the next turn starts from (``solver.solve``): none once ``choice`` is
    the bought one, else this turn's plus what ``choice`` forgoes of the free value (of
    the units whose forms last: history's suffix gives way to the chat's growth within
    turns and recall brings its messages back uncached, a passage leaves with its turn).

    A break the choice pays while the batch extends (``extending``: the solve saw what
    its messages carry) is the batch's rent: it counts too (this turn's already in this
    turn's buy, ``solver.solve``), so the choice the regret buys, sent as built, settles
    the batch once the breaks made to keep it cost what a settle does (ski rental, as
    for the value forgone). A turn after a request sent as built (the batch settled:
    ``TurnGraph.deferred`` holds that turn alone) starts over: that break paid for what
    the regret would have bought."""
    if solution.bought and tuple(choice) == solution.choice:
        return 0.0
    value = lasting_value([u.ladder for u in units], choice)
    regret = 0.0 if len(turn.deferred) == 1 else turn.regret
    if tuple(choice) == solution.choice:
        regret += rent(solution, extending=extending)
    return regret + max(0.0, solution.free_value - value)


def _least_growth(units: Sequence[_Unit], choice: Sequence[int]) -> int:
    """The fewest tokens a unit's form chosen in ``choice`` grows by to its next larger
    rung (the most an int holds: none grows)."""
    least = sys.maxsize
    for unit, c in zip(units, choice, strict=True):
        now = unit.ladder.rungs[c].tokens
        for rung in unit.ladder.rungs:
            if now < rung.tokens < now + least:
                least = rung.tokens - now
    return least


def _next_short(fitted: int, tight: int, free: int, growth: int) -> int | None:
    """The ``short`` the next round solves with, between the best fit so far (solved with
    ``fitted``), which measured ``free`` tokens under the room it may fill, and a ``short``
    that measured too much (``tight``): the room grows by what the fit left, unless a room
    that large already measured too much, then halfway between the two. None when the fit
    left less than ``growth`` (``_least_growth`` of its choice: no form grows into what is
    left, and each round is a solve, an apply and a draft) or no ``short`` lies between."""
    if free <= 0 or free < growth:
        return None
    guess = fitted - free
    if tight < guess < fitted:
        return guess
    half = (fitted + tight) // 2
    return half if tight < half < fitted else None


def _plain_passages(units: Sequence[_Unit]) -> bool:
    """Whether ``_passages_beside`` makes ``_kept``'s solve: every passage a new ladder of
    two rungs (none, sent with text), no rung of another unit placed in a block before it
    (``Rung.at``)."""
    for unit in units:
        rungs = unit.ladder.rungs
        if unit.kind != "passage":
            if rungs[0].at is not None:
                return False
            continue
        if unit.ladder.previous is not None or len(rungs) != 2:
            return False
        none, sent = rungs
        if (none.tokens, none.value, none.text_free, none.at) != (0, 0.0, False, None):
            return False
        if sent.text_free or sent.at is not None or sent.tokens < 1:
            return False
    return True


def _passages_beside(units: Sequence[_Unit], room: int) -> tuple[int, ...] | None:
    """What ``solve`` chooses when every unit but the passages has its first rung only
    (``_kept``'s ladders; their shape ``_plain_passages``), made directly: every break
    point leaves the same ladders free, a passage's one hull step climbs by its value per
    token and no text-free rung can move, so the solve is a first fit of the passages by
    falling value per token (ties by place) beside the fixed rungs. None when those do
    not fit ``room``."""
    fixed = 0
    steps: list[tuple[float, int, int]] = []
    for j, unit in enumerate(units):
        sent = unit.ladder.rungs[-1]
        if unit.kind != "passage":
            fixed += unit.ladder.rungs[0].tokens
        elif sent.value > 0:
            steps.append((-(sent.value / sent.tokens), j, sent.tokens))
    if fixed > room:
        return None
    left = room - fixed
    choice = [0] * len(units)
    for _, j, tokens in sorted(steps):
        if tokens <= left:
            choice[j] = 1
            left -= tokens
    return tuple(choice)


@attrs.frozen
class Solve:
    """The budget stage: one objective over the turn's ladders, one solve, measured."""

    name: str = "budget"
    after: tuple[str, ...] = ("reference",)
    before: tuple[str, ...] = ("promote",)
    retriever: Callable[[], Retriever] | None = None
    """What ranks units by relevance to the query (the default pipeline gives it BM25,
    ``Bm25Retriever``; a host's embeddings go through the same ``Retriever`` protocol);
    None: no relevance."""

    def __call__(self, turn: TurnGraph) -> TurnGraph:
        # The rounds' ladders are many small values, freed by reference counting: the
        # cyclic collector's full passes over the host's heap would free none of them.
        with paused():
            return self._fitted(turn)

    def _fitted(self, turn: TurnGraph) -> TurnGraph:
        budget = turn.ctx.budget
        if budget is None:
            return turn
        turn = attrs.evolve(turn, seen=turn.library)
        measured = draft(turn)
        used = budget.used(measured, turn.ctx.counter)
        before = measured.layer_tokens()
        fits = budget.effective(used) <= budget.limit
        # The request as sent may not fit where the build does: the batch's earlier
        # messages carry what the build does not hold (``_carried``), fitting as built or
        # not. One that would pass the limit so settles if kept as it stands, and is
        # priced so (``_kept``); a changed request leaves the reserve free, which holds
        # what is carried first; beyond it the solve weighs cuts that keep the batch
        # against the settle that sending it as built makes (``solver.Carried``, whether
        # or not the request as it stands fits as sent), and a fit that keeps the batch is
        # measured with what it carries. A request kept as it stands takes passages only
        # beside what it carries.
        carried = _carried(turn, measured, used)
        sizes = _turn_tokens(measured, budget)
        settles = budget.effective(used + carried) > budget.limit
        cut = any(e.cut or e.folded for e in turn.library.entries)
        # Nothing cut and the request fits: nothing is forgone, the regret starts over.
        if fits and not settles and not cut and not _recallable(turn, fits=fits):
            report = budget.report(used, before, before, ())
            return attrs.evolve(turn, budget_report=report, measured=measured, regret=0.0)
        passages, recallable, shown = _passage_units(turn, budget, fits=fits)
        if (
            fits and not settles and not cut and not passages
            and not _regrows(turn, sizes, budget, used)
        ):  # fmt: skip
            report = budget.report(used, before, before, ())
            return attrs.evolve(turn, budget_report=report, measured=measured, regret=0.0)
        if passages and not turn.library.entries and not turn.items:
            # The suffix's turns on the passages' scale (``_passage_units``), and nothing
            # else to rank: ``_relevance`` would score history turns only, all replaced.
            relevance = shown
        else:
            relevance = _relevance(turn, self.retriever)
            if passages:  # the suffix's turns on the passages' scale (``_passage_units``)
                relevance = {k: v for k, v in relevance.items() if not k.startswith("history:")}
                relevance.update(shown)
        exact: dict[tuple[str, int], tuple[int, int] | None] = {}
        extra: dict[str, set[int]] = {}
        groups = _open_groups(turn)
        taking: dict[str, int] = {}  # the library's new indexes' lines, as measured

        def cached_at(taking: Mapping[str, int]) -> tuple[list[_Unit], dict[str, _Whole]]:
            """The cached prefix's units, a new index's head split as ``taking`` says."""
            heads = _heads(groups, taking)
            units, growing = _cached_units(turn, measured, budget, relevance, sizes, used, heads)
            return _shed_from_stale(turn, units), growing

        cached, growing = cached_at(taking)
        of = _items_of(turn, measured)
        # This turn's groups' index heads, shared by their members' rungs until a measured
        # round sends the index: then the head is fixed, as it measured (``_sent_heads``).
        item_groups = of.groups
        item_heads = _heads(item_groups, {})

        def items_of(previous: Sequence[_Unit] = (), stale: Collection[str] = ()) -> list[_Unit]:
            """This turn's items' units, those of ``previous`` kept but the ``stale``."""
            return _item_units(
                turn, of, budget, relevance, exact, extra, growing, item_heads, previous, stale
            )

        items = items_of()
        units = cached + items + passages
        now = sum(u.ladder.rungs[u.ladder.previous or 0].tokens for u in units)
        fixed = used - now
        if passages:  # the recalled block's own tokens, if it is sent
            fixed += _recall_overhead(turn)
        # A turn that changes forms leaves the next turn's growth free (``_reserve``), so
        # it extends this request instead of changing it again; a request that fits is
        # sent as it is unless a change is worth more (``_kept``).
        reserve = _reserve(sizes, budget)
        # The passages the suffix shows as it stands (a request kept as it is sends none).
        shows = {key for key, p in recallable.items() if p.last >= turn.history_view.start}
        share = text_free = math.floor(budget.context_window * budget.text_free_share)
        short = fitted = 0
        refining = False  # the best fit leaves the next turn's room: its slack is sought
        tight: int | None = None  # the last ``short`` that measured too much
        # The best fit measured: the request as it stands, if it fits, until a round's fit
        # replaces it (a change whose measure overshoots must not lose a request that fits).
        best: tuple[TurnGraph, Draft, int, list[Decision]] | None = (
            (turn, measured, used, []) if fits else None
        )
        measured_choices: set[tuple[int, ...]] = set()  # what the rounds drafted
        rounds = overlaps = 0
        last = measured
        sized = False
        hulls = Hulls()  # the solves' hull steps and sorted steps, kept for the next round's
        over_share: int | None = None  # what the last share cut left beyond the share
        joining = False  # folds extend an earlier index: a new one's head is over the share
        chosen: tuple[Sequence[_Unit], Sequence[int]] = ((), ())  # the best fit's choice
        while rounds < MAX_ROUNDS:
            ladders = [u.ladder for u in units]
            limit = math.floor((budget.limit - reserve) / (1.0 + budget.safety_margin))
            room = limit - fixed - short
            carry = _carrying(turn, units, sizes, carried - reserve)
            solution = solve(
                ladders, room, cache_price=budget.cache_weight, text_free=text_free,
                regret=turn.regret, carried=carry, hulls=hulls,
            )  # fmt: skip
            if solution is None and reserve:
                reserve = 0  # the smallest forms fit only in the reserve: it gives way
                continue
            if solution is None:
                break
            if _summarized(turn, units, solution.choice):
                cached, growing = cached_at(taking)
                units = cached + items + passages
                continue  # a summary was made: solve again with its tokens
            made = _made(turn, units, solution.choice, exact)
            if made:
                items = items_of(items, made)
                guessed, units = units, cached + items + passages
                solution = _as_made(
                    guessed, units, solution, room, budget.cache_weight, carry, text_free
                )
                if solution is None:
                    continue  # a guessed preview was made: solve again with its tokens
            resized = None if sized else _sized(units, solution, room, extra)
            if resized is not None:
                sized = True
                items = items_of(items, {resized})
                units = cached + items + passages
                continue  # the room the made forms leave is given to one preview, fitted to it
            choice = solution.choice
            kept = None
            if fits:
                whole = math.floor(budget.limit / (1.0 + budget.safety_margin)) - fixed - short
                as_built = _carrying(turn, units, sizes, carried) if settles else None
                free = max(reserve if _grown(turn) else 0, carried)  # beside the passages
                kept = _kept(units, solution, budget.cache_weight, whole, text_free, free, shows,
                             as_built)  # fmt: skip
            if kept is not None:
                choice = kept
            regret = _regret(turn, units, solution, choice, extending=carry is not None)
            if kept is not None and not any(kept[j] for j, u in enumerate(units)
                                            if u.kind == "passage"):  # fmt: skip
                report = budget.report(used, before, before, ())
                return attrs.evolve(turn, budget_report=report, measured=measured, regret=regret)
            held = _held(units, choice, recallable)
            if held and overlaps < 2:
                # Passages the chosen suffix shows: their room goes to the next best.
                overlaps += 1
                passages = [u for u in passages if u.key not in held]
                units = cached + items + passages
                continue
            if refining and choice in measured_choices:
                break  # the room changed, the choice did not: its measure is known
            measured_choices.add(choice)
            rounds += 1
            out, decisions, block = _apply(turn, units, choice, recallable, join=joining)
            # The last round's draft (the request as built at first): ``draft`` makes again
            # only the blocks whose placement changed since. The recalled block as
            # ``_apply`` rendered and counted it: what ``draft`` makes.
            base = last if block is None else attrs.evolve(last, items=(*last.items, block))
            drafted = last = draft(out, base)
            spent = budget.used(drafted, turn.ctx.counter)
            narrowed = _taking(units, choice, groups, taking)
            sent_heads = _sent_heads(units, choice, of, item_groups, drafted)
            repriced: int | None = None  # what the round measured beyond its rungs, repriced
            if narrowed != taking or sent_heads:
                # A new index's head, priced as this round sent it.
                if narrowed != taking:
                    taking = narrowed
                    cached, growing = cached_at(taking)
                if sent_heads:
                    # A member joining an index sent adds its line only, one leaving it
                    # frees nothing (the others keep it): the head is fixed, text-free.
                    item_groups = {g: (0 if g in sent_heads else head, keys)
                                   for g, (head, keys) in item_groups.items()}  # fmt: skip
                    fixed += sum(sent_heads.values())
                    text_free -= sum(sent_heads.values())
                    heads = _heads(item_groups, {})
                    items = [_reheaded(u, item_heads.get(u.key, 0), heads.get(u.key, 0))
                             for u in items]  # fmt: skip
                    item_heads = heads
                units = cached + items + passages
                counted = sum(u.ladder.rungs[c].tokens for u, c in zip(units, choice, strict=True))
                repriced = spent - fixed - counted

            over = budget.effective(spent) - budget.limit
            if carry is not None and choice == solution.choice and not solution.sent_as_built:
                # Extending the batch, the request as sent holds what it carries too.
                over = max(over, budget.effective(spent + carried) - budget.limit)
            bare = _text_free_tokens(drafted) - share
            taken = budget.effective(spent) - (budget.limit - reserve)  # of the reserve
            within = taken <= 0
            out = attrs.evolve(out, regret=regret)
            if refining:  # a fit leaves the next turn's room, in the text-free share
                if over <= 0 and within and bare <= (over_share or 0):
                    best, fitted = (out, drafted, spent, decisions), short
                    chosen = (units, choice)
                else:
                    tight = short
            elif over <= 0:
                best, fitted = (out, drafted, spent, decisions), short
                chosen = (units, choice)
                lower = over_share is None or bare < over_share
                if bare > 0 and lower and text_free > 0 and rounds < MAX_ROUNDS:
                    # An index's head the lines' shares did not cover: the share is cut
                    # from what the choice's forms counted, so the next solve binds; once
                    # a cut no longer lowers it, a fit over it by no more counts.
                    counted = sum(
                        u.ladder.rungs[c].tokens
                        for u, c in zip(units, choice, strict=True)
                        if u.ladder.rungs[c].text_free
                    )
                    text_free = min(text_free, counted) - bare
                    over_share = bare
                    continue
                if bare > 0 and not joining and rounds < MAX_ROUNDS:
                    # A cut of the share no longer lowers it: the new blocks' heads are
                    # what is over, so folds extend their groups' earlier indexes (the
                    # prefix breaks there: the share bounds what is sent, the cache not).
                    joining = True
                    continue
                refining = within
                if not within and kept is None and rounds < MAX_ROUNDS:
                    # A fit that changes forms and takes the next turn's room would make
                    # that turn change them again: the room shrinks by what it takes (a
                    # kept request changes none; its passages leave). It fits the limit,
                    # so the step is not widened as an overshoot's is.
                    if repriced is not None:
                        # A head the rungs did not price took it: the next room leaves
                        # what the choice measured beyond its rungs priced as sent (no
                        # room has measured too much at those prices yet).
                        tight, short = None, repriced
                    else:
                        tight = short
                        short += taken + 8
                    continue
            else:
                tight = short
                short += over + max(8, short // 2)
                continue
            # The room the rungs' counts estimate is off by what they leave out
            # (separators, framing): between a room that measured too much and one that
            # fit, the fit's room grows by what its measure left (``_next_short``) while
            # rounds last, so the room a fit leaves is used.
            if not refining or rounds >= MAX_ROUNDS or tight is None or best is None:
                break
            step = _next_short(fitted, tight, limit - best[2], _least_growth(*chosen))
            if step is None:
                break
            short = step
        if best is None:
            report = budget.report(used, before, measured.layer_tokens(), ())
            raise BudgetExceeded(
                f"turn {turn.ctx.turn}: {budget.effective(used)} tokens do not fit the limit of "
                f"{budget.limit} (window {budget.context_window} - reserve "
                f"{budget.reserve_output}) even in the smallest forms",
                report,
            )
        out, drafted, spent, decisions = best
        report = budget.report(spent, before, drafted.layer_tokens(), decisions)
        decided = attrs.evolve(out, budget_report=report, measured=drafted)
        return decided.decide(*report.decisions)


@attrs.frozen
class TurnFitting:
    """A turn as the budget fitted it: its graph, draft and the request's exact tokens (an
    agent loop keeps it to give the turn's room to its steps)."""

    turn: TurnGraph
    draft: Draft
    used: int

    def layer_tokens(self) -> tuple[tuple[str, int], ...]:
        return self.draft.layer_tokens()


def turn_fitting(turn: TurnGraph, measured: Draft, budget: Budget) -> TurnFitting:
    """The fitting of a turn already measured (``measured``)."""
    return TurnFitting(turn, measured, budget.used(measured, turn.ctx.counter))


def shrink(
    fitting: TurnFitting, over: int, retriever: Callable[[], Retriever] | None = None
) -> tuple[TurnFitting, list[Decision]] | None:
    """``fitting`` solved again within ``over`` tokens less (the same objective under a
    smaller limit: an agent loop's steps need the room), or None when it cannot shrink."""
    budget = fitting.turn.ctx.budget
    if budget is None or over <= 0:
        return None
    # The limit the turn must fit: ``over`` tokens less, no headroom (the loop's steps
    # take that room now).
    target = fitting.used - over
    reserve = budget.context_window - math.ceil(target * (1.0 + budget.safety_margin))
    if reserve >= budget.context_window or target <= 0:
        return None
    smaller = attrs.evolve(budget, reserve_output=max(budget.reserve_output, reserve), headroom=0.0)
    turn = attrs.evolve(fitting.turn, ctx=attrs.evolve(fitting.turn.ctx, budget=smaller))
    try:
        out = Solve(retriever=retriever)(turn)
    except BudgetExceeded:
        return None
    report, measured = out.budget_report, out.measured
    if measured is None or report is None or report.used >= fitting.used:
        return None
    out = attrs.evolve(out, ctx=fitting.turn.ctx)
    return TurnFitting(out, measured, report.used), list(report.decisions)


def _framed(tokens: int, with_sep: int | None) -> int:
    """A block's tokens with the blank line after it in the request: ``with_sep`` where
    it was counted, else ``_SEP`` more than the block alone."""
    return tokens + _SEP if with_sep is None else with_sep


def _with_sep(block: ItemBlock) -> int:
    return _framed(block.segment.tokens, block.with_sep)


def recalled_block(passages: Sequence[Passage], turn: TurnGraph) -> ItemBlock:
    """The one turn-scoped block of ``passages`` (in conversation order), rendered and
    counted with the blank line after it."""
    texts = [p.item.text for p in sorted(passages, key=lambda p: p.order)]
    if texts:
        artifact = recalled_artifact(
            RecallItem(HISTORY_BLOCK, 0, "\n".join(texts), _RECALLED_TITLE)
        )
    else:
        artifact = _no_passages()
    view = full_view(artifact)
    counter = turn.ctx.counter
    rendered = turn.ctx.renderer.render(view)
    tokens = _lines_tokens(rendered, texts, counter)
    with_sep = count_with_sep_from(rendered, tokens, BLOCK_SEP, counter.count)
    return ItemBlock(
        Placement(artifact.key), artifact, Segment.of_view(view, rendered, tokens), with_sep
    )


def _lines_tokens(rendered: str, texts: Sequence[str], counter: TokenCounter) -> int:
    """``rendered``'s tokens; when it holds ``texts`` (the passages, counted when they
    were offered) joined by line breaks between a head and a tail, from their counts
    (``TokenCounter.count_joined``: exact) instead of encoding the block again."""
    body = "\n".join(texts)
    at = rendered.find(body) if texts else -1
    end = at + len(body)
    if at > 0 and rendered[at - 1] == "\n" and rendered[end : end + 1] == "\n":
        parts = [rendered[: at - 1], *texts, rendered[end + 1 :]]
        if all(parts):
            return counter.count_joined(parts, "\n")
    return counter.count(rendered)


_RECALLED_TITLE = "earlier messages"
"""The recalled block's title."""


@functools.cache
def _no_passages() -> Artifact:
    """The recalled block's artifact holding no passage (its framing: the same for every
    turn, so hashed once)."""
    return recalled_artifact(RecallItem(HISTORY_BLOCK, 0, "", _RECALLED_TITLE))


def _recall_overhead(turn: TurnGraph) -> int:
    """The tokens of an empty recalled block and the blank line after it (remembered by
    the conversation's recall memo, per tokenizer)."""
    memo = turn.ctx.recall
    if memo is None:
        return 0
    return memo.overhead(turn.ctx.counter.name, lambda: _with_sep(recalled_block((), turn)))
