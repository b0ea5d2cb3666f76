"""The render step: a finished TurnGraph becomes an Envelope of five typed layers."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from pipeline._hashing import text_hash
from pipeline._model.envelope import (
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
from pipeline._model.history import HistoryEntry
from pipeline._tokens.counter import TokenCounter
from pipeline._turn.graph import Placement, TurnGraph
from pipeline._views.preview import cut_to_tokens, fit_preview, focus_words
from pipeline._views.views import (
    excerpt_view,
    full_view,
    preview_view,
    reference_view,
    summary_view,
)

__all__ = [
    "DEFAULT_REPLY_TOKENS",
    "assemble",
    "complete",
    "fitted_preview",
    "item_view",
    "shorten_reply",
    "summary_target",
    "visible_history",
]

DEFAULT_REPLY_TOKENS = 400


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
    limit = turn.ctx.budget.reply_tokens if turn.ctx.budget else DEFAULT_REPLY_TOKENS
    shown: list[tuple[HistoryEntry, str | None]] = []
    for entry in turn.history:
        if entry.turn < view.start:
            continue
        reply = entry.assistant
        if reply is not None and entry.turn in view.shortened:
            reply = shorten_reply(reply, turn.ctx.counter, limit)
        shown.append((entry, reply))
    return shown


def summary_target(turn: TurnGraph, body: str) -> int:
    """Summary size: a third of the body, at least 64 tokens, at most the budget's cap."""
    cap = turn.ctx.budget.summary_tokens if turn.ctx.budget else turn.ctx.policy.section_tokens * 2
    return min(cap, max(64, turn.ctx.counter.count(body) // 3))


def fitted_preview(turn: TurnGraph, item: Placement) -> View:
    """``item`` as a preview whose rendered block has at most ``item.limit`` tokens, keeping
    first what changed since the library's copy and what the query names (``fit_preview``)."""
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

    def make() -> str:
        return fit_preview(body, ctx.counter, limit, words=words, old=old)

    key = ("fit", artifact.content_hash, ctx.counter.name, limit, words, old)
    return attrs.evolve(empty, body=ctx.views.get(key, make))


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


def assemble(turn: TurnGraph, *, measure_only: bool = False) -> Envelope:
    """Render every layer of ``turn`` (segment text and exact token counts) into an envelope.

    ``measure_only`` skips what only the final request needs (joined layer texts, message
    texts, hashes: left empty) for the budget stage, which re-measures after every cut.
    """
    if turn.measured is not None and not measure_only:
        measured, inputs = turn.measured
        if all(a is b for a, b in zip(inputs, turn.render_inputs(), strict=True)):
            # Nothing the layers depend on changed since the budget stage rendered them.
            return attrs.evolve(measured, report=_report(turn))
    counter = turn.ctx.counter

    def text_segment(key: str, source_type: str, text: str, role: str = "") -> Segment:
        return Segment(
            key=key,
            form=Form.TEXT,
            source_type=source_type,
            content_hash=text_hash(text),
            text=text,
            tokens=counter.count(text),
            role=role,
        )

    def layer(name: LayerName, segments: Sequence[Segment]) -> Layer:
        tokens = counter.count_joined([s.text for s in segments])
        if measure_only:
            return Layer(name, tuple(segments), tokens, "", "")
        return Layer(name, tuple(segments), tokens)

    system = turn.system
    l1 = [
        text_segment(f"system:{part}", "system", text)
        for part, text in (("stable", system.stable), ("mutable", system.mutable))
        if text
    ]
    refs: list[Segment] = []
    full: list[Segment] = []
    views = [item_view(turn, item) for item in turn.items]
    texts = [turn.ctx.renderer.render(view) for view in views]
    for view, text, tokens in zip(views, texts, counter.count_many(texts), strict=True):
        (refs if view.form is Form.REFERENCE else full).append(Segment.of_view(view, text, tokens))
    l4: list[Segment] = []
    for entry, reply in visible_history(turn):
        l4.append(text_segment(f"history:{entry.turn}:user", "history", entry.user, "user"))
        if reply is not None:
            l4.append(
                text_segment(f"history:{entry.turn}:assistant", "history", reply, "assistant")
            )
    l5 = [text_segment("query", "query", turn.query, "user")]
    if measure_only:
        l2 = Layer(LayerName.L2, *turn.library.measure(counter), "", "")
    else:
        l2 = turn.library.layer(counter)
    layers = (
        layer(LayerName.L1, l1),
        l2,
        layer(LayerName.L3, [*refs, *full]),
        layer(LayerName.L4, l4),
        layer(LayerName.L5, l5),
    )
    if measure_only:
        return Envelope(turn.ctx.turn, layers, _report(turn), "", "", "")
    return _messages(turn, layers)


def complete(measured: Envelope, turn: TurnGraph) -> Envelope:
    """The full envelope of ``turn`` from its measure-only one (same segments and counts):
    layer hashes and message texts added, nothing rendered or counted again."""
    l1, _, l3, l4, l5 = measured.layers
    layers = (
        Layer(l1.name, l1.segments, l1.tokens),
        turn.library.layer(turn.ctx.counter),  # made once here, hash included
        Layer(l3.name, l3.segments, l3.tokens),
        Layer(l4.name, l4.segments, l4.tokens),
        Layer(l5.name, l5.segments, l5.tokens),
    )
    return _messages(turn, layers)


def _messages(turn: TurnGraph, layers: tuple[Layer, Layer, Layer, Layer, Layer]) -> Envelope:
    head = tuple(s.text for s in layers[0].segments)
    system_text, prefix_hash = turn.library.system_text(turn.ctx.counter, head)
    user_text = join_blocks(user_parts(layers[2], layers[4]))
    return Envelope(turn.ctx.turn, layers, _report(turn), system_text, user_text, prefix_hash)
