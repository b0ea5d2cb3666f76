"""The render step: a finished TurnGraph becomes an Envelope of five typed layers."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from lamina.pipeline._hashing import text_hash
from lamina.pipeline._model.envelope import (
    BLOCK_SEP,
    BuildReport,
    Envelope,
    Form,
    Layer,
    LayerName,
    Segment,
    View,
    join_blocks,
    user_parts,
)
from lamina.pipeline._model.history import HistoryEntry
from lamina.pipeline._text.specials import defuse_special_tokens
from lamina.pipeline._tokens.counter import TokenCounter, count_with_sep_from
from lamina.pipeline._turn.draft import Draft, DraftLayer, ItemBlock
from lamina.pipeline._turn.graph import Placement, SystemPrompt, TurnGraph
from lamina.pipeline._turn.measure import joined_tokens
from lamina.pipeline._views.preview import (
    Preview,
    count_by_sections,
    cut_to_tokens,
    fitted_preview_of,
    focus_words,
)
from lamina.pipeline._views.views import (
    Policy,
    excerpt_view,
    full_view,
    learn_rendering,
    preview_view,
    reference_view,
    summary_view,
)

__all__ = [
    "SHORTENED_REPLY_TOKENS",
    "assemble",
    "complete",
    "draft",
    "fitted_preview",
    "item_view",
    "shorten_reply",
    "summary_cap",
    "summary_target",
    "system_layer",
    "visible_history",
]

SHORTENED_REPLY_TOKENS = 400
"""The tokens a reply listed in ``HistoryView.shortened`` is shown at. Nothing shortens a
reply now; states saved by the cut cascade the objective replaced list the replies it
shortened (to 400 tokens, its default), and keep showing them as they were sent."""


def shorten_reply(text: str, counter: TokenCounter, max_tokens: int) -> str:
    """A long old reply cut to ``max_tokens`` at a sentence end, with a marker saying so."""
    head = cut_to_tokens(text, counter, max_tokens)
    if head == text:
        return text
    return (
        f"{head}\n[... reply shortened: {len(text) - len(head)} of {len(text)} characters cut ...]"
    )


def visible_history(turn: TurnGraph) -> list[tuple[HistoryEntry, str | None]]:
    """The history entries L4 shows, with each reply as it is sent (maybe shortened)."""
    view = turn.history_view
    shown: list[tuple[HistoryEntry, str | None]] = []
    for entry in turn.history:
        if entry.turn < view.start:
            continue
        reply = entry.assistant
        if reply is not None and entry.turn in view.shortened:
            reply = shorten_reply(reply, turn.ctx.counter, SHORTENED_REPLY_TOKENS)
        shown.append((entry, reply))
    return shown


def summary_cap(policy: Policy) -> int:
    """The most tokens a summary is made to: two of the policy's preview sections (250 by
    default), so a summary stays a form much smaller than the preview it stands in for,
    and an entry is offered one only when it is larger than twice this."""
    return 2 * policy.section_tokens


def summary_target(turn: TurnGraph, body: str) -> int:
    """Summary size: a third of the body, at least 64 tokens, at most ``summary_cap``."""
    return min(summary_cap(turn.ctx.policy), max(64, turn.ctx.counter.count(body) // 3))


def fitted_preview(turn: TurnGraph, item: Placement) -> View:
    """``item`` as a preview whose rendered block has at most ``item.limit`` tokens, keeping
    first what changed since the library's copy and what the query names (``fit_preview``).
    The block's count is made from the preview's sections' counts and handed to the counter.
    """
    artifact = turn.artifact(item.key)
    ctx = turn.ctx
    empty = attrs.evolve(reference_view(artifact, item.marks), form=Form.PREVIEW)
    overhead = ctx.counter.count(ctx.renderer.render(attrs.evolve(empty, body=""))) + 2
    entry = (turn.seen or turn.library).get(item.key)
    old = None
    if entry is not None and entry.content_hash != artifact.content_hash:
        old = entry.view.body
    words = focus_words(turn.query)
    body = artifact.payload.body()
    limit = max(item.limit - overhead, 1)

    def make() -> Preview:
        preview = fitted_preview_of(body, ctx.counter, limit, words=words, old=old)
        learn_rendering(ctx.counter, ctx.renderer.render(view_of(preview)), preview)
        return preview

    def view_of(preview: Preview) -> View:
        return attrs.evolve(empty, body=preview.text)

    key = ("fit", artifact.content_hash, ctx.counter.name, limit, words, old)
    return view_of(ctx.views.get(key, make))


def item_view(turn: TurnGraph, item: Placement) -> View:
    """The view of an L3 item in the form its placement says (a preview with a ``limit``
    is fitted to it: ``fitted_preview``)."""
    artifact = turn.artifact(item.key)
    ctx = turn.ctx
    if item.form is Form.REFERENCE:
        return reference_view(artifact, item.marks)
    if item.form is Form.PREVIEW and item.limit:
        return fitted_preview(turn, item)
    if item.form is Form.PREVIEW:
        return preview_view(artifact, ctx.counter, ctx.policy, item.marks, ctx.views)
    if item.form is Form.SUMMARY:
        target = summary_target(turn, artifact.payload.body())
        return summary_view(artifact, ctx.summaries, ctx.summarizer, target, item.marks)
    if item.form is Form.EXCERPT:
        limit = item.limit or ctx.policy.verbatim_tokens
        return excerpt_view(artifact, ctx.counter, limit, item.marks, ctx.views)
    return full_view(artifact, item.marks)


def _report(turn: TurnGraph) -> BuildReport:
    return BuildReport(
        turn=turn.ctx.turn,
        attached=tuple(i.key for i in turn.items),
        decisions=turn.decisions,
        warnings=turn.warnings,
        stats=turn.stats,
        budget=turn.budget_report,
    )


def assemble(turn: TurnGraph) -> Envelope:
    """Render every layer of ``turn`` (segment text and exact token counts) into an envelope.

    When the budget stage left a draft measured from what the layers are rendered from
    now (no later stage changed an input), the envelope is completed from it."""
    found = turn.measured
    if found is None or not _made_from(found, turn):
        found = draft(turn)
    return complete(found, turn)


def _made_from(found: Draft, turn: TurnGraph) -> bool:
    return found.inputs == turn.render_inputs() and all(
        turn.graph.nodes[b.placement.key].get("artifact") is b.artifact for b in found.items
    )


def _text_segment(counter: TokenCounter, key: str, kind: str, text: str, role: str = "") -> Segment:
    """A plain message segment (system, query, history): special-token spellings defused,
    so what is counted is what any open model's template reads as text."""
    text = defuse_special_tokens(text)
    return Segment(
        key=key,
        form=Form.TEXT,
        source_type=kind,
        content_hash=text_hash(text),
        text=text,
        tokens=counter.count(text),
        role=role,
    )


def _joined_tokens(
    counter: TokenCounter, segments: Sequence[Segment], seps: dict[str, int | None] | None = None
) -> int:
    """Exact count of the segments' texts joined by a blank line, from their counts."""
    known = seps or {}
    return joined_tokens(
        [(s.text, s.tokens, known.get(s.key)) for s in segments if s.text], counter
    )


def system_layer(system: SystemPrompt, counter: TokenCounter) -> DraftLayer:
    """L1 measured: the stable and the mutable part (each when not empty), as sent."""
    segments = [
        _text_segment(counter, f"system:{part}", "system", text)
        for part, text in (("stable", system.stable), ("mutable", system.mutable))
        if text
    ]
    return DraftLayer(LayerName.L1, tuple(segments), _joined_tokens(counter, segments))


def draft(turn: TurnGraph, previous: Draft | None = None) -> Draft:
    """Measure every layer of ``turn``: segments with their exact counts, no joined texts.

    With ``previous`` (a draft of the same turn before a cut: same context) only what
    changed is rendered and counted again: placements whose placement or artifact
    changed, history entries whose shown form changed, L1 if it changed; L2 carries its
    count through ``Library.replace``. Layer counts come from the blocks' counts.
    """
    counter = turn.ctx.counter

    def layer(name: LayerName, segments: Sequence[Segment]) -> DraftLayer:
        return DraftLayer(name, tuple(segments), _joined_tokens(counter, segments))

    system = turn.system
    if previous is not None and previous.system == system:
        l1 = previous.l1
    else:
        l1 = system_layer(system, counter)
    if previous is not None and previous.library is turn.library:
        l2 = previous.l2
    else:
        l2 = DraftLayer(LayerName.L2, *turn.ctx.prefix.measure(turn.library, counter))
    items = _item_blocks(turn, previous)
    refs = [b.segment for b in items if b.segment.form is Form.REFERENCE]
    full = [b.segment for b in items if b.segment.form is not Form.REFERENCE]
    seps = {b.segment.key: b.with_sep for b in items}
    l3 = DraftLayer(LayerName.L3, (*refs, *full), _joined_tokens(counter, [*refs, *full], seps))
    if (
        previous is not None
        and previous.history is turn.history
        and previous.history_view == turn.history_view
    ):
        l4 = previous.l4
    else:
        l4 = _history_layer(turn)
    if previous is not None and previous.query == turn.query:
        l5 = previous.l5
    else:
        l5 = layer(LayerName.L5, [_text_segment(counter, "query", "query", turn.query, "user")])
    return Draft(
        turn.ctx.turn,
        (l1, l2, l3, l4, l5),
        items,
        turn.library,
        system,
        turn.history,
        turn.history_view,
        turn.query,
    )


def _item_blocks(turn: TurnGraph, previous: Draft | None) -> tuple[ItemBlock, ...]:
    """L3's blocks in placement order; a previous block is kept when its placement and
    artifact are unchanged (and, for a preview fitted against the library, the library)."""
    known: dict[str, ItemBlock] = {}
    if previous is not None and (turn.seen is not None or previous.library is turn.library):
        known = {b.placement.key: b for b in previous.items}
    blocks: list[ItemBlock | None] = []
    fresh: list[tuple[int, Placement, View]] = []
    for i, item in enumerate(turn.items):
        artifact = turn.artifact(item.key)
        old = known.get(item.key)
        if old is not None and old.placement == item and old.artifact is artifact:
            blocks.append(old)
        else:
            blocks.append(None)
            fresh.append((i, item, item_view(turn, item)))
    texts = [turn.ctx.renderer.render(view) for _, _, view in fresh]
    _count_by_sections(turn, [view for _, _, view in fresh], texts)
    for (i, item, view), text, tokens in zip(
        fresh, texts, turn.ctx.counter.count_many(texts), strict=True
    ):
        with_sep = count_with_sep_from(text, tokens, BLOCK_SEP, turn.ctx.counter.count)
        segment = Segment.of_view(view, text, tokens)
        blocks[i] = ItemBlock(item, turn.artifact(item.key), segment, with_sep)
    return tuple(b for b in blocks if b is not None)


def _count_by_sections(turn: TurnGraph, views: Sequence[View], texts: Sequence[str]) -> None:
    """When these blocks may not fit (more bytes than the budget's limit; a token is at
    least a byte), count the full recoverable ones not counted yet by their sections
    (``count_by_sections``), so fitting previews of them encodes no section again; a
    roomy budget leaves them to one batched count."""
    budget = turn.ctx.budget
    if budget is None or sum(len(t) * (1 if t.isascii() else 4) for t in texts) <= budget.limit:
        return
    counter = turn.ctx.counter
    for view, text in zip(views, texts, strict=True):
        if view.form is Form.FULL and view.recoverable and counter.known(text) is None:
            counter.learn(text, count_by_sections(text, view.body, counter))


def _history_layer(turn: TurnGraph) -> DraftLayer:
    """L4 measured: its segments and their joined count, made only for the messages the
    conversation's kept L4 (``TurnContext.l4``) does not hold as they are shown now."""
    counter = turn.ctx.counter
    kept = turn.ctx.l4
    view = turn.history_view

    def make(number: int, role: str, text: str, shorten_to: int | None) -> Segment:
        shown = text if shorten_to is None else shorten_reply(text, counter, shorten_to)
        return _text_segment(counter, f"history:{number}:{role}", "history", shown, role)

    segments = kept.segments(
        counter, turn.history, view.start, view.shortened, SHORTENED_REPLY_TOKENS, make
    )
    tokens = kept.tokens(counter, segments)
    return DraftLayer(
        LayerName.L4, segments, _joined_tokens(counter, segments) if tokens is None else tokens
    )


def complete(measured: Draft, turn: TurnGraph) -> Envelope:
    """The envelope of ``turn`` from its draft (same segments and counts): layer texts and
    hashes and the message texts added, nothing rendered or counted again."""
    l1, _, l3, l4, l5 = measured.layers
    layers = (
        Layer(l1.name, l1.segments, l1.tokens),
        turn.ctx.prefix.layer(turn.library, turn.ctx.counter),  # hash included
        Layer(l3.name, l3.segments, l3.tokens),
        Layer(l4.name, l4.segments, l4.tokens, hash=turn.ctx.l4.layer_hash(l4.segments)),
        Layer(l5.name, l5.segments, l5.tokens),
    )
    return _messages(turn, layers)


def _messages(turn: TurnGraph, layers: tuple[Layer, Layer, Layer, Layer, Layer]) -> Envelope:
    head = tuple(s.text for s in layers[0].segments)
    system_text, prefix_hash = turn.ctx.prefix.system_text(turn.library, turn.ctx.counter, head)
    user_text = join_blocks(user_parts(layers[2], layers[4]))
    return Envelope(turn.ctx.turn, layers, _report(turn), system_text, user_text, prefix_hash)
