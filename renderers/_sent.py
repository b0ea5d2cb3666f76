"""What a request sends, by band: the five layers as sent, the deferred context and the framing.

Every view of a turn (the CLI's tables and sentences, ``lamina inspect``, the JSON trace,
the HTML report) shows the request as sent (``Envelope.as_sent``), never the envelope as
built. When the library's growth is deferred (``Envelope.batch``) the two differ: the
system message holds only the settled library, the context attached since rides in the
earlier user messages that sent it, and this turn's user message sends its context as
append-only does. So a request is told as seven bands that add up to its count:

- ``L1``: the system prompt; ``L2``: the library in the system message (settled entries);
- ``deferred``: the earlier user messages that carry context (whole: query and context),
  which stand in the history for those turns' bare queries;
- ``L3``: this turn's context as its user message sends it (reference lists included
  when batched); ``L4``: the rest of the history; ``L5``: the query;
- ``framing``: what no block holds: per-message framing and reply priming, the library
  heading, reference intros and the query label (the request's count minus the others).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import attrs

from lamina.pipeline import Envelope, Form, Layer, Segment
from lamina.renderers._explain import explain_cache

__all__ = [
    "SENT_BANDS",
    "SentRow",
    "deferred_segments",
    "listed_segments",
    "sent_bands",
    "sent_rows",
    "settle_turns",
]

SENT_BANDS = ("L1", "L2", "deferred", "L3", "L4", "L5", "framing")


def deferred_segments(envelope: Envelope) -> tuple[Segment, ...]:
    """The earlier user messages this request sends with their context (its batch's
    deferred turns that sent any), as sent; empty when the request is the envelope as built."""
    b = envelope.batch
    if b is None or b.as_built(len(envelope.l2.segments)):
        return ()
    bare = {s.key: s.text for s in envelope.l4.segments}
    return tuple(s for s in b.turns if s.text != bare.get(s.key))


def listed_segments(layer: Layer, first: int | None = None) -> tuple[Segment, ...]:
    """The layer's segments that hold text, among its ``first`` (all by default): a library
    entry set aside for room (``docs/BUDGET.md``) keeps its place in the layer but sends no
    byte, so no view lists or counts it."""
    return tuple(s for s in layer.segments[:first] if s.text)


def sent_bands(envelope: Envelope, total: int) -> dict[str, int]:
    """The request's tokens by band (``SENT_BANDS``), adding up to ``total``, its count."""
    sent = envelope.as_sent()
    deferred = sum(s.tokens for s in deferred_segments(envelope))
    query = envelope.l5.tokens
    context = envelope.l3.tokens if sent is envelope else sent.l5.tokens - query
    bands = {
        "L1": sent.l1.tokens,
        "L2": sent.l2.tokens,
        "deferred": deferred,
        "L3": context,
        "L4": sent.l4.tokens - deferred,
        "L5": query,
    }
    bands["framing"] = total - sum(bands.values())
    return bands


@attrs.frozen
class SentRow:
    """One block of a request as sent: its band, key, form and tokens (None for a
    reference the batch wrote itself, counted only in its band)."""

    band: str
    key: str
    form: str
    tokens: int | None


def sent_rows(envelope: Envelope) -> list[SentRow]:
    """The request's blocks band by band, as sent: L1, the library the system message
    holds, each earlier user message that carries context (form ``message``), this
    turn's context as its user message sends it (a block sent before or held by the
    settled library goes as a reference; an entry the library holds cut may go whole
    again, ``restored``), the rest of the history, the query."""
    sent = envelope.as_sent()
    deferred = deferred_segments(envelope)
    rows = [SentRow("L1", s.key, str(s.form), s.tokens) for s in envelope.l1.segments]
    # An index of entries set aside is kept in the library, not sent (no text): no row.
    rows += [SentRow("L2", s.key, str(s.form), s.tokens) for s in listed_segments(sent.l2)]
    rows += [SentRow("deferred", s.key, "message", s.tokens) for s in deferred]
    if sent is envelope:
        rows += [SentRow("L3", s.key, str(s.form), s.tokens) for s in envelope.l3.segments]
    else:
        rows += _batched_context(envelope, sent.l5.segments[0].text)
    keys = {s.key for s in deferred}
    rows += [SentRow("L4", s.key, str(s.form), s.tokens) for s in sent.l4.segments
             if s.key not in keys]
    rows += [SentRow("L5", s.key, str(s.form), s.tokens) for s in envelope.l5.segments]
    return rows


def _batched_context(envelope: Envelope, user: str) -> list[SentRow]:
    """This turn's context blocks as a batched user message (``user``) sends them."""
    rows = []
    for s in envelope.l3.segments:
        whole = envelope.l2.get(s.key) if s.form is Form.REFERENCE else s
        if whole is not None and whole.text and whole.text in user:
            rows.append(SentRow("L3", s.key, str(whole.form), whole.tokens))
        elif s.form is Form.REFERENCE:
            rows.append(SentRow("L3", s.key, str(s.form), s.tokens))
        else:
            rows.append(SentRow("L3", s.key, str(Form.REFERENCE), None))
    b = envelope.batch
    assert b is not None
    rows += [SentRow("L3", s.key, "restored", s.tokens) for s in b.restored]
    return rows


def settle_turns(turns: Sequence[MutableMapping[str, Any]]) -> None:
    """After a turn's ``tokens_total`` or ``cache`` changed (another framing, layout or
    break reason): its framing band made up again so the bands add up, and its cache
    sentence said again from the figures as they now stand."""
    previous: Mapping[str, Any] | None = None
    for turn in turns:
        bands = turn.get("sent")
        if bands is not None:
            rest = sum(int(v) for k, v in bands.items() if k != "framing")
            bands["framing"] = int(turn["tokens_total"]) - rest
        cache = turn.get("cache")
        if cache is not None:
            cache["sentence"] = " ".join(explain_cache(turn, previous))
        previous = turn
