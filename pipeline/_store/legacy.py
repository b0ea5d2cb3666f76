"""Records older Lamina versions wrote, read as this version's values.

Decisions were saved without an ``action`` before they were typed: such a record holds
only its stage, target, forms, layer, reason and saving. ``legacy_action`` tells the
action from those, by the rules the typed-decisions change gave each maker (stage first,
then layer and forms); only where two makers wrote the very same stage, layer and forms
does it read the start of the reason (the reference stage's pinned versus re-sent entry,
the system stage's changed versus restored prompt). Anything else (a host's own stage, a
pairing no version wrote) takes the closest action by the form it ended in. The reason
text is kept as it was stored either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lamina.pipeline._model.envelope import DecisionAction as A

__all__ = ["legacy_action"]

# The action a decision that ended in a form took, where its stage does not tell more.
_BY_FORM: dict[str, A] = {
    "dropped": A.DROPPED,
    "cut": A.PAGES_CUT,
    "reference": A.REFERENCED,
    "evicted": A.EVICTED,
    "stub": A.STUBBED,
    "index": A.INDEXED,
    "excerpt": A.EXCERPTED,
    "preview": A.COMPACTED,
    "summary": A.COMPACTED,
    "full": A.RESENT,
    "items": A.INDEXED,
    "text": A.SYSTEM_CHANGED,
}


def _reference(layer: str, before: str, after: str, reason: str) -> A:
    """The reference stage's decisions (L2 entries refreshed, L3 items placed)."""
    if layer == "L2":
        return A.REFRESHED
    if before == "reference" and after == "full":
        return A.PINNED if reason.startswith("content changed") else A.RESENT
    if before == "full" and after == "full":
        return A.OVERLAPPING
    return _BY_FORM.get(after, A.REFERENCED)


def _budget(layer: str, before: str, after: str) -> A:
    """The budget stage's cuts."""
    if layer == "L4":
        return A.HISTORY_CUT if after == "dropped" else A.SHORTENED
    if layer == "L1":
        return A.COMPACTED
    if layer == "L3" and after == "reference":
        return A.NOT_SENT
    return _BY_FORM.get(after, A.COMPACTED)


def legacy_action(record: Mapping[str, Any]) -> A:
    """The ``DecisionAction`` of a decision stored before decisions had one.

    ``record`` is the stored mapping (``stage``, ``from_form``, ``to_form``, ``layer``,
    ``reason``); a missing or odd value reads as empty, so the record's own structuring
    still reports what is wrong with it."""

    def text(name: str, default: str = "") -> str:
        value = record.get(name, default)
        return value if isinstance(value, str) else ""

    stage, layer, reason = text("stage"), text("layer", "L3"), text("reason")
    before, after = text("from_form"), text("to_form")
    if stage == "reference":
        return _reference(layer, before, after, reason)
    if stage == "budget":
        return _budget(layer, before, after)
    if stage == "system":
        return A.RESTORED if "whole again" in reason else A.SYSTEM_CHANGED
    if stage == "agent":
        return A.STUBBED if after == "stub" else A.EXCERPTED
    if stage == "pages":
        return A.PAGES_CUT if after == "cut" else A.DROPPED
    return _BY_FORM.get(after, A.COMPACTED)
