"""The invariants (1-8; 7 when a budget was set; docs/ARCHITECTURE.md), checked by code
that hosts and tests both call. Tool output is also checked to stay turn-scoped."""

from __future__ import annotations

from lamina.pipeline._errors import InvariantViolation
from lamina.pipeline._hashing import text_hash
from lamina.pipeline._model.envelope import (
    DecisionLayer,
    Envelope,
    Form,
    Layer,
    join_blocks,
    system_parts,
    user_parts,
)
from lamina.pipeline._model.history import has_context_markup
from lamina.pipeline._model.recall import RECALL_SOURCE
from lamina.pipeline._model.tools import TOOL_SOURCE, chunk_source
from lamina.pipeline._text.markup import escape_attribute, xml_safe
from lamina.pipeline._views.views import Policy

__all__ = ["check_envelope"]

_COMPACTED = (Form.PREVIEW, Form.SUMMARY, Form.EXCERPT, Form.REFERENCE)


def check_envelope(
    envelope: Envelope, previous: Envelope | None = None, policy: Policy | None = None
) -> None:
    """Raise InvariantViolation on the first broken invariant; ``previous`` enables 5."""
    policy = policy or Policy()
    _hashes_match(envelope)
    for layer in envelope.layers:
        _unique_keys(layer)
    _references_and_resends(envelope, policy)
    _history_is_bare(envelope)
    _tool_output_turn_scoped(envelope)
    if previous is not None:
        _library_is_append_only(envelope, previous)
    _non_recoverable_kept(envelope)
    _fits_budget(envelope)
    _compacted_keep_identity(envelope)


def _fits_budget(env: Envelope) -> None:
    budget = env.report.budget
    if budget is not None and budget.effective > budget.limit:
        raise InvariantViolation(
            7, f"{budget.effective} tokens are over the budget's limit of {budget.limit}"
        )
    # The request that is sent: a batched one is counted as sent (``Envelope.as_sent``).
    if budget is not None and env.batch is not None and env.batch.tokens > budget.limit:
        raise InvariantViolation(
            7, f"the request sent has {env.batch.tokens} tokens, over the limit {budget.limit}"
        )


def _hashes_match(env: Envelope) -> None:
    for layer in env.layers:
        if layer.hash != text_hash(layer.text):
            raise InvariantViolation(1, f"{layer.name} hash does not match its text")
    if env.prefix_hash != text_hash(env.system_text):
        raise InvariantViolation(1, "prefix hash does not match the system text")
    # The message texts are kept apart from the layers (extended, not re-joined): they
    # must still be exactly what the layers say.
    if env.system_text != join_blocks(system_parts(env.l1, env.l2)):
        raise InvariantViolation(1, "system text is not L1 and L2 joined")
    if env.user_text != join_blocks(user_parts(env.l3, env.l5)):
        raise InvariantViolation(1, "user text is not L3 and L5 joined")
    batch = env.batch
    if batch is not None:
        if any(s.content_hash != text_hash(s.text) for s in (*batch.turns, batch.user)):
            raise InvariantViolation(1, "a batched user message's hash does not match its text")
        keys = {s.key for s in env.l4.segments if s.role == "user"}
        if batch.settled > len(env.l2.segments) or any(s.key not in keys for s in batch.turns):
            raise InvariantViolation(1, "the batch names library entries or turns not built")


def _unique_keys(layer: Layer) -> None:
    seen: set[str] = set()
    for key in (s.key for s in layer.segments):
        if key in seen:
            raise InvariantViolation(2, f"{key} appears twice in {layer.name}", key)
        seen.add(key)


def _references_and_resends(env: Envelope, policy: Policy) -> None:
    library = {s.key: s for s in env.l2.segments}
    # No dangling references: a reference points at an L2 entry, or says (marked
    # ``not-sent``, listed apart from the library's references) that the item was not sent.
    for seg in env.l3.segments:
        entry = library.get(seg.key)
        if seg.form is Form.REFERENCE:
            source = chunk_source(seg.key)
            if source is not None and source in library:
                continue
            if entry is None and not seg.unsent:
                raise InvariantViolation(3, f"{seg.key} is a reference but not in L2", seg.key)
            if entry is not None and entry.form is Form.REFERENCE and not seg.unsent:
                raise InvariantViolation(
                    3, f"{seg.key} is a reference to a library stub (nothing to find)", seg.key
                )
            continue
        if entry is None or entry.content_hash != seg.content_hash:
            continue
        shortened = entry.form in _COMPACTED
        if not (shortened and (policy.reattach == "full" or entry.form is Form.REFERENCE)):
            raise InvariantViolation(
                3, f"{seg.key} is in L2 and sent again unchanged in L3", seg.key
            )


def _history_is_bare(env: Envelope) -> None:
    """Replies are stripped of Lamina's blocks; a query is the user's own text, kept as
    written (pasting a Lamina block into one is the user's choice, not a leak)."""
    for seg in env.l4.segments:
        if seg.form is not Form.TEXT or (seg.role != "user" and has_context_markup(seg.text)):
            raise InvariantViolation(4, f"{seg.key} holds context markup", seg.key)


def _tool_output_turn_scoped(env: Envelope) -> None:
    """Tool results and retrieval chunks live in L3 only: never in L1, L2 or L4."""
    tool_texts = [s.text for s in env.l3.segments if s.source_type == TOOL_SOURCE and s.text]
    for layer in (env.l1, env.l2):
        for seg in layer.segments:
            if seg.source_type in (TOOL_SOURCE, RECALL_SOURCE) or chunk_source(seg.key):
                raise InvariantViolation(4, f"tool output {seg.key} is in {layer.name}", seg.key)
    for text in tool_texts:
        if text in env.system_text or any(text in s.text for s in env.l4.segments):
            raise InvariantViolation(4, "a tool result is in the system message or history")


def _library_is_append_only(env: Envelope, prev: Envelope) -> None:
    explained = {
        d.target
        for d in env.report.decisions
        if d.layer in (DecisionLayer.L1, DecisionLayer.L2)
    }
    before, now = prev.l2.keys(), env.l2.keys()
    missing = [k for k in before if k not in now and k not in explained]
    if missing:
        raise InvariantViolation(5, f"L2 lost {missing[0]} with no reported decision", missing[0])
    if [k for k in before if k in now] != [k for k in now if k in before]:
        raise InvariantViolation(5, "L2 entries were reordered")
    if not env.system_text.startswith(prev.system_text) and not explained:
        raise InvariantViolation(
            5, "the system message changed at its start and no decision says why"
        )


def _non_recoverable_kept(env: Envelope) -> None:
    present = {s.key: s for layer in (env.l2, env.l3) for s in layer.segments}
    for key in env.report.attached:
        if key not in present:
            raise InvariantViolation(6, f"{key} was attached but is in neither L2 nor L3", key)
    for layer in (env.l2, env.l3):
        for seg in layer.segments:
            if not seg.recoverable and seg.form is Form.SUMMARY:
                raise InvariantViolation(6, f"non-recoverable {seg.key} was summarized", seg.key)


def _names(text: str, key: str) -> bool:
    """``text`` holds ``key`` as written or as a block's attribute writes it (``"``, ``<``,
    ``>``, tab and line breaks escaped, what XML cannot hold replaced)."""
    return key in text or escape_attribute(xml_safe(key)) in text


def _compacted_keep_identity(env: Envelope) -> None:
    for layer in (env.l2, env.l3):
        for seg in layer.segments:
            if seg.form in _COMPACTED and not (seg.key and seg.title and _names(seg.text, seg.key)):
                raise InvariantViolation(
                    8, f"{seg.key} lost its key or title when compacted", seg.key
                )
