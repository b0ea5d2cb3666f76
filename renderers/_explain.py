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

__all__ = ["LOW_CACHE_SHARE", "explain_cache"]

# Below this share of the request repeated, a turn without a break is explained too.
LOW_CACHE_SHARE = 0.5

_UNCACHED_AFTER = "so the request is sent uncached from there on"


def _decisions(turn: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    """The budget's steps on ``key`` that form one chain (each from the form the last one
    left): a library entry's cuts, not a later cut of this turn's item of the same key."""
    budget = turn.get("budget") or {}
    chain: list[Mapping[str, Any]] = []
    for d in budget.get("decisions", ()):
        if d.get("target") != key:
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


def _sentence(code: str, turn: Mapping[str, Any]) -> str:
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
            "The budget dropped or shortened older history messages, so the history is sent "
            "again from its new start, uncached."
        )
    if kind == "library-settled":
        return (
            "The library's deferred growth entered the system message (the extended request "
            "would not have fit the window), so the history is sent again after it, uncached."
        )
    if kind == "unknown":
        return (
            "The system message changed in a way no Lamina decision explains (was the request "
            f"edited by the host?), {_UNCACHED_AFTER}."
        )
    return f"The cached prefix broke ({code}), {_UNCACHED_AFTER}."


def _keys(turn: Mapping[str, Any], layer: str) -> dict[str, str]:
    segments = ((turn.get("layers") or {}).get(layer) or {}).get("segments", ())
    return {str(s["key"]): str(s.get("form", "")) for s in segments}


def _names(keys: Sequence[str], most: int = 3) -> str:
    shown = ", ".join(keys[:most])
    return shown if len(keys) <= most else f"{shown} and {len(keys) - most} more"


def _low_cache(turn: Mapping[str, Any], previous: Mapping[str, Any]) -> str:
    """Why a turn that broke nothing repeats little of the request before it."""
    new = [k for k in _keys(turn, "L2") if k not in _keys(previous, "L2")]
    if new:
        return (
            f"The library grew by {len(new)} entr{'y' if len(new) == 1 else 'ies'} ({_names(new)}) "
            f"that turn {previous.get('turn')} attached; "
            f"{'it is' if len(new) == 1 else 'they are'} added at the end of the system "
            "message, so the history after it is sent again uncached. A turn that adds nothing "
            "to the library keeps the whole earlier prefix."
        )
    layers = turn.get("layers") or {}
    l3 = int((layers.get("L3") or {}).get("tokens", 0))
    total = int(turn.get("tokens_total", 0))
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
        return (_sentence(str(reason), turn),)
    if previous is None:
        return ()
    total = int(turn.get("tokens_total", 0))
    cached = min(int(cache.get("common_prefix_tokens", 0)), total)
    if total and cached / total < LOW_CACHE_SHARE:
        return (_low_cache(turn, previous),)
    return ()
