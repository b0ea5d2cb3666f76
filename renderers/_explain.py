"""Sentences that say why a turn's cached prefix is what it is, for people.

The cache report (``lamina.renderers._cache``) classifies a break as a code
(``l2-compacted:note:a.md``); the CLI, ``lamina inspect`` and the HTML report show the
sentence made here instead, from the trace turn: the break's code and the typed budget
decisions behind it (their ``action``, never their wording), or, for a turn that broke
nothing yet repeats little of the request before it, what made the rest new.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lamina.renderers._cache import PREVIOUS_NOT_REBUILT

__all__ = ["LOW_CACHE_SHARE", "explain_cache", "extends_previous"]

# Below this share of the request repeated, a turn without a break is explained too.
LOW_CACHE_SHARE = 0.5

# The actions of a library entry's own chain (a reference to it from L3 is not one).
_LIBRARY_STEPS = frozenset({"compacted", "evicted", "restored", "indexed", "excerpted"})

_UNCACHED_AFTER = "so the request is sent uncached from there on"


def _decisions(turn: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    """The budget's steps on ``key`` that form one chain (each from the form the last one
    left): a library entry's cuts, not a later cut of this turn's item of the same key."""
    budget = turn.get("budget") or {}
    chain: list[Mapping[str, Any]] = []
    for d in budget.get("decisions", ()):
        if d.get("target") != key or d.get("action") not in _LIBRARY_STEPS:
            continue
        if chain and d.get("from") != chain[-1].get("to"):
            break
        chain.append(d)
    return chain


def _cut(turn: Mapping[str, Any], key: str, verb: str) -> str:
    """'The budget cut library entry K from full to summary (saving N tokens) ...'."""
    steps = _decisions(turn, key)
    if not steps:
        return (
            f"Library entry {key} is shown in a shorter form than before ({verb}) to make room, "
            f"{_UNCACHED_AFTER}."
        )
    first, last = steps[0], steps[-1]
    saved = sum(int(d.get("tokens_saved", 0)) for d in steps)
    actions = {str(d.get("action", "")) for d in steps}
    if "restored" in actions:
        return (
            f"Library entry {key} was restored from {first.get('from')} to {last.get('to')} "
            f"now that the window has room again, {_UNCACHED_AFTER}."
        )
    to = last.get("to")
    form = "a stub (key, title and where to find it)" if to in ("evicted", "reference") else to
    return (
        f"The budget cut library entry {key} from {first.get('from')} to {form} "
        f"(saving {saved:,} tokens) to fit this turn in the window, {_UNCACHED_AFTER}."
    )


def _sentence(code: str, turn: Mapping[str, Any], previous: Mapping[str, Any] | None) -> str:
    kind, _, key = code.partition(":")
    if kind == "first-turn":
        return "First request of the chat: nothing is cached yet."
    if code == PREVIOUS_NOT_REBUILT:
        return (
            f"The previous request (turn {int(turn.get('turn', 1)) - 1}) could not be rebuilt "
            "as it was sent (a source changed since, or it was saved in a form this Lamina "
            "does not rebuild), so what it left cached is not known: this request is counted "
            "as uncached."
        )
    if kind == "system-changed":
        return f"The system prompt's stable part changed, {_UNCACHED_AFTER}."
    if kind == "memory-changed":
        return (
            "The system prompt's mutable part (memory) changed; the library and history after "
            "it are sent uncached."
        )
    if kind == "handoff":
        return (
            "The agent loop handed off to an agent with other instructions, which replace the "
            "system prompt's mutable part; the library and history after it are sent uncached."
        )
    if kind == "instructions-changed":
        return (
            "The instructions the agent framework sends after the system message changed "
            "(a dynamic @agent.instructions function); the history after them is sent uncached."
        )
    if kind == "artifact-changed":
        return (
            f"{key} changed since the library took it (its freshness policy sent the new text), "
            f"{_UNCACHED_AFTER}."
        )
    if kind == "l2-compacted":
        return _cut(turn, key, "compacted")
    if kind == "l2-evicted":
        return _cut(turn, key, "evicted")
    if kind == "l2-changed":
        return f"Library entry {key} is rendered differently than before, {_UNCACHED_AFTER}."
    if kind == "l2-reordered":
        return f"The library's entries changed order, {_UNCACHED_AFTER}."
    if kind == "history-cut-moved":
        return (
            "The budget moved where the history starts (older messages dropped, or earlier "
            "ones sent again), so the history is sent again from its new start, uncached."
        )
    if kind == "library-settled":
        return _settled(turn, previous)
    if kind == "library-shed":
        return (
            "The budget changed an entry of the library's deferred growth, so the earlier user "
            "messages that carry it are sent as before up to that entry's block and as built "
            f"from there; {_up_to_there(turn)}."
        )
    if kind == "unknown":
        return (
            "The system message changed in a way no Lamina decision explains (was the request "
            f"edited by the host?), {_UNCACHED_AFTER}."
        )
    return f"The cached prefix broke ({code}), {_UNCACHED_AFTER}."


def _settled(turn: Mapping[str, Any], previous: Mapping[str, Any] | None) -> str:
    """Why a batched request settled when nothing in the envelope as built broke, and
    what that changed: the library the system message holds, the earlier user messages
    sent as their bare queries again; the cached figure says where the change begins."""
    why = str((turn.get("batch") or {}).get("settled") or "")
    if why == "over-budget":
        cause = " because the extended request would not have fit the window"
    elif why == "given-back":
        cause = (
            " because the budget gave back whole an entry an earlier user message sent cut"
        )
    elif why == "no-batch":
        cause = (
            " because there was no batch to extend (a state saved without one, or an agent loop)"
        )
    else:
        cause = ""
    grown = [k for k in _settled_keys(turn) if k not in _settled_keys(previous or {})]
    changes = ["the earlier user messages that carried context are sent as their bare queries"]
    if grown:
        changes.insert(
            0,
            f"the library in the system message took {len(grown)} "
            f"entr{'y' if len(grown) == 1 else 'ies'} ({_names(grown)})",
        )
    return (
        f"The library's deferred growth settled{cause}: {' and '.join(changes)}, so "
        f"{_up_to_there(turn)}."
    )


def _up_to_there(turn: Mapping[str, Any]) -> str:
    """How much of the request the one before holds, for a sentence that says where."""
    cached = int((turn.get("cache") or {}).get("common_prefix_tokens", 0))
    return (
        f"the request repeats the one before only up to there ({cached:,} of "
        f"{int(turn.get('tokens_total', 0)):,} tokens)"
    )


def _recalled(turn: Mapping[str, Any]) -> bool:
    """Whether the turn's message held recalled passages (turn-scoped blocks)."""
    segments = ((turn.get("layers") or {}).get("L3") or {}).get("segments", ())
    return any(str(s.get("key", "")).startswith("recalled:") for s in segments)


def _settled_keys(turn: Mapping[str, Any]) -> list[str]:
    """The keys of the library entries the turn's system message holds as sent."""
    segments = ((turn.get("layers") or {}).get("L2") or {}).get("segments", ())
    keys = [str(s["key"]) for s in segments]
    batch = turn.get("batch")
    return keys if batch is None else keys[: int(batch.get("settled_entries", len(keys)))]


def _names(keys: Sequence[str], most: int = 3) -> str:
    shown = ", ".join(keys[:most])
    return shown if len(keys) <= most else f"{shown} and {len(keys) - most} more"


def _band(turn: Mapping[str, Any], name: str) -> int:
    """A band of the request as sent (``renderers._sent``), else its layer's tokens."""
    sent = turn.get("sent")
    if sent is not None:
        return int(sent.get(name, 0))
    return int(((turn.get("layers") or {}).get(name) or {}).get("tokens", 0))


def extends_previous(turn: Mapping[str, Any], previous: Mapping[str, Any] | None) -> bool:
    """Whether the turn's cached prefix is the whole request before it but its framing
    (the reply priming): the request grew by appending, however little of it is cached."""
    if previous is None or (turn.get("cache") or {}).get("break_reason"):
        return False
    cached = int((turn.get("cache") or {}).get("common_prefix_tokens", 0))
    before = int(previous.get("tokens_total", 0))
    return before > 0 and cached >= before - max(_band(previous, "framing"), 0)


def _low_cache(turn: Mapping[str, Any], previous: Mapping[str, Any]) -> str:
    """Why a turn that broke nothing repeats little of itself: it appended to a short
    request, or the system message grew, or most of it is new context."""
    total = int(turn.get("tokens_total", 0))
    cached = int((turn.get("cache") or {}).get("common_prefix_tokens", 0))
    if extends_previous(turn, previous):
        return (
            f"The request extends turn {previous.get('turn')}'s byte for byte: it repeats "
            f"{cached:,} of that request's {int(previous.get('tokens_total', 0)):,} tokens; "
            f"the {total - cached:,} new tokens follow it (the reply and this turn's message: "
            f"{_band(turn, 'L3'):,} tokens of context, {_band(turn, 'L5'):,} of query)."
        )
    before = _settled_keys(previous)
    new = [k for k in _settled_keys(turn) if k not in before]
    if new:
        return (
            f"The library in the system message grew by {len(new)} "
            f"entr{'y' if len(new) == 1 else 'ies'} ({_names(new)}); "
            f"{'it is' if len(new) == 1 else 'they are'} added at its end, so the history "
            "after it is sent again uncached. A turn that adds nothing to the system message "
            "keeps the whole earlier prefix."
        )
    if _recalled(previous):
        return (
            f"The earlier messages recalled for turn {previous.get('turn')} belong to that "
            f"turn only: its message is sent again without them, so {_up_to_there(turn)}."
        )
    l3 = _band(turn, "L3")
    if total and l3 >= total / 2:
        return (
            f"Most of this request is new context: {l3:,} of {total:,} tokens are this turn's "
            "attachments (L3), which no earlier request held."
        )
    return (
        "Most of this request differs from the one before it (new history or context after a "
        "short shared prefix)."
    )


def explain_cache(
    turn: Mapping[str, Any], previous: Mapping[str, Any] | None = None
) -> tuple[str, ...]:
    """Sentences for a JSON trace turn (``previous``: the turn before it, or None): one for
    its break, or, when nothing broke yet less than ``LOW_CACHE_SHARE`` of the request
    repeats the previous one, one saying why; empty for a turn that kept its prefix."""
    cache = turn.get("cache") or {}
    reason = cache.get("break_reason")
    if reason:
        return (_sentence(str(reason), turn, previous),)
    if previous is None:
        return ()
    total = int(turn.get("tokens_total", 0))
    cached = min(int(cache.get("common_prefix_tokens", 0)), total)
    if total and cached / total < LOW_CACHE_SHARE:
        return (_low_cache(turn, previous),)
    return ()
