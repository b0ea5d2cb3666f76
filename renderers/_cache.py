"""Prefix-change reports: how much of each request repeats the previous one, and why not more.

A break is any change to bytes the previous request had made cacheable: its system
message (L1 + L2) must be a byte prefix of this one's, and its history a prefix of this
history. Growth (a longer library, more history) is not a break.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from pipeline import DecisionAction, Envelope, TokenCounter
from renderers._openai import (
    chatml,
    chatml_prefix_tokens,
    common_prefix_length,
    openai_messages,
)

__all__ = ["PrefixReport", "classify_break", "prefix_report", "prefix_reports"]

# Readers match a decision's action, never its reason's words (those are for people).
_CHANGED = frozenset({DecisionAction.REFRESHED, DecisionAction.PINNED})
_EVICTED = frozenset({DecisionAction.EVICTED, DecisionAction.DROPPED})


@attrs.frozen
class PrefixReport:
    """One turn's cache view: L1/L2 hashes, the prefix shared with the previous request
    (OpenAI chat serialization), and the classified reasons it broke (empty: no break)."""

    turn: int
    l1_hash: str
    l2_hash: str
    common_prefix_tokens: int
    common_prefix_bytes: int
    reasons: tuple[str, ...]

    @property
    def break_reason(self) -> str | None:
        """The first (earliest in the request) reason, or None when nothing broke."""
        return self.reasons[0] if self.reasons else None

    def trace(self) -> dict[str, Any]:
        """The ``"cache"`` entry of a JSON trace turn."""
        return {
            "common_prefix_tokens": self.common_prefix_tokens,
            "break_reason": self.break_reason,
        }


def _l2_reasons(previous: Envelope, current: Envelope) -> list[str]:
    reasons: list[str] = []
    for d in current.report.decisions:
        if d.layer != "L2":
            continue
        if d.action in _CHANGED:
            reasons.append(f"artifact-changed:{d.target}")
        elif d.action in _EVICTED:
            reasons.append(f"l2-evicted:{d.target}")
        else:
            reasons.append(f"l2-compacted:{d.target}")
    kept: list[str] = []
    for seg in previous.l2.segments:
        now = current.l2.get(seg.key)
        if now is None:
            kept.append(f"l2-evicted:{seg.key}")
        elif now.content_hash != seg.content_hash:
            kept.append(f"artifact-changed:{seg.key}")
        elif now.form != seg.form:
            kept.append(f"l2-compacted:{seg.key}")
        elif now.text != seg.text:
            kept.append(f"l2-changed:{seg.key}")
    before = previous.l2.keys()
    order = [k for k in current.l2.keys() if k in before]  # noqa: SIM118
    if not kept and order != [k for k in before if k in order]:
        kept.append("l2-reordered")
    reasons.extend(r for r in kept if r not in reasons)
    return reasons


def classify_break(previous: Envelope | None, current: Envelope) -> tuple[str, ...]:
    """Why ``current`` does not extend what ``previous`` made cacheable, earliest first:
    ``first-turn``, ``system-changed``, ``memory-changed``, ``artifact-changed:<key>``,
    ``l2-compacted:<key>``, ``l2-evicted:<key>``, ``history-cut-moved`` (or ``unknown``);
    empty when the previous system message and history are kept byte for byte."""
    if previous is None:
        return ("first-turn",)
    reasons: list[str] = []
    system_kept = current.system_text.startswith(previous.system_text)
    if not system_kept:
        for key, name in (
            ("system:stable", "system-changed"),
            ("system:mutable", "memory-changed"),
        ):
            before, after = previous.l1.get(key), current.l1.get(key)
            if (before.text if before else "") != (after.text if after else ""):
                reasons.append(name)
        reasons.extend(_l2_reasons(previous, current))
    old, new = previous.history(), current.history()
    if new[: len(old)] != old:
        reasons.append("history-cut-moved")
    if not system_kept and not reasons:
        reasons.append("unknown")
    return tuple(reasons)


def _common_prefix_bytes(a: str, b: str) -> int:
    """Length of the common prefix of the UTF-8 encodings, without encoding either whole."""
    chars = common_prefix_length(a, b)
    size = len(a[:chars].encode("utf-8", "surrogatepass"))
    if chars < min(len(a), len(b)):  # two characters can share leading bytes
        size += common_prefix_length(
            a[chars].encode("utf-8", "surrogatepass"), b[chars].encode("utf-8", "surrogatepass")
        )
    return size


def prefix_report(
    previous: Envelope | None, current: Envelope, counter: TokenCounter
) -> PrefixReport:
    """The report for ``current`` given the request before it (None on the first turn)."""
    tokens = same = 0
    if previous is not None:
        a, b = chatml(openai_messages(previous)), chatml(openai_messages(current))
        tokens = chatml_prefix_tokens(a, b, counter)
        same = _common_prefix_bytes(a, b)
    return PrefixReport(
        turn=current.turn,
        l1_hash=current.l1.hash,
        l2_hash=current.l2.hash,
        common_prefix_tokens=tokens,
        common_prefix_bytes=same,
        reasons=classify_break(previous, current),
    )


def prefix_reports(envelopes: Sequence[Envelope], counter: TokenCounter) -> list[PrefixReport]:
    """One report per envelope of a conversation, in order."""
    out: list[PrefixReport] = []
    previous: Envelope | None = None
    for env in envelopes:
        out.append(prefix_report(previous, env, counter))
        previous = env
    return out
