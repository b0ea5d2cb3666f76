"""The JSON trace: a public, stable record of each turn's layers, segments and messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lamina.pipeline import Budget, CachedPrefix, Envelope
from lamina.pipeline.tokens import Calibration, TokenCounter, TurnUsage, request_tokens
from lamina.renderers._cache import PREVIOUS_NOT_REBUILT, prefix_reports, sent_messages
from lamina.renderers._sent import listed_segments, sent_bands, settle_turns
from lamina.renderers._usage import trace_usage

__all__ = ["TRACE_VERSION", "cached_prefix", "trace_document", "trace_turn"]

TRACE_VERSION = 1


def _stats(envelope: Envelope) -> dict[str, Any]:
    report = envelope.report
    attached = report.stat("attached")
    context = report.stat("context_segments")
    return {
        "segments": {str(layer.name): len(listed_segments(layer)) for layer in envelope.layers},
        "attached": attached,
        "duplicates_removed": report.stat("duplicates_removed"),
        "dedup_ratio": round(report.stat("duplicates_removed") / attached, 4) if attached else 0.0,
        "references": report.stat("references"),
        "compacted_proportion": (
            round(report.stat("compacted_segments") / context, 4) if context else 0.0
        ),
    }


def _timings(envelope: Envelope) -> dict[str, Any]:
    return {
        "ms": {name: round(seconds * 1000, 3) for name, seconds in envelope.report.timings},
        **dict(envelope.report.meters),
    }


def trace_turn(
    envelope: Envelope,
    counter: TokenCounter,
    *,
    tokens_total: int | None = None,
    timings: bool = False,
    usage: TurnUsage | None = None,
    budget: Budget | None = None,
) -> dict[str, Any]:
    """One turn of the trace (`docs/TRACE.md`), without its ``"cache"`` (which compares
    it with the turn before: ``trace_document``); ``usage`` adds the ``"usage"`` block
    (the provider's figures beside Lamina's prediction). ``tokens_total`` is the request
    as sent, counted with ``budget``'s framing when given."""
    if tokens_total is None:
        tokens_total = (
            request_tokens(envelope, counter) if budget is None else budget.used(envelope, counter)
        )
    out: dict[str, Any] = {
        "turn": envelope.turn,
        "prefix_hash": envelope.prefix_hash,
        "tokens_total": tokens_total,
        "sent": sent_bands(envelope, tokens_total),
        "layers": {
            str(layer.name): {
                "hash": layer.hash,
                "tokens": layer.tokens,
                "segments": [
                    {
                        "key": s.key,
                        "source_type": s.source_type,
                        "form": str(s.form),
                        "content_hash": s.content_hash,
                        "tokens": s.tokens,
                    }
                    for s in listed_segments(layer)
                ],
            }
            for layer in envelope.layers
        },
        "messages": sent_messages(envelope),
        "stats": _stats(envelope),
        "warnings": [
            {"code": w.code, "key": w.key, "message": w.message} for w in envelope.report.warnings
        ],
    }
    if envelope.batch is not None:
        b = envelope.batch
        out["batch"] = {
            "settled_entries": len(listed_segments(envelope.l2, b.settled)),
            "deferred_turns": [int(s.key.split(":")[1]) for s in b.turns],
            "tokens": b.tokens,
            "settled": b.reason or None,
        }
        if b.restored:
            out["batch"]["restored"] = [s.key for s in b.restored]
    if timings:
        out["timings"] = _timings(envelope)
    if usage is not None:
        out["usage"] = trace_usage(usage)
    report = envelope.report.budget
    if report is not None:
        out["budget"] = {
            "window": report.window,
            "reserve_output": report.reserve_output,
            "used": report.used,
            "sent": report.sent,
            "plan": dict(report.plan),
            "decisions": [
                {
                    "target": d.target,
                    "from": d.from_form,
                    "to": d.to_form,
                    "tokens_saved": d.tokens_saved,
                    "reason": d.reason,
                    "action": str(d.action),
                }
                for d in report.decisions
            ],
        }
    return out


def trace_document(
    envelopes: Sequence[Envelope],
    counter: TokenCounter | None = None,
    *,
    budget: Budget | None = None,
    timings: bool = False,
    usage: Sequence[TurnUsage] = (),
    calibration: Sequence[Calibration] = (),
) -> dict[str, Any]:
    """The trace of a run, each turn with its ``"cache"`` (the prefix it repeats of the turn
    before, as sent). ``counter`` and ``budget`` count as the conversation did (its
    ``counter``, ``budget``); without a counter, the budget's tokenizer, else o200k_base.
    ``timings`` adds per-phase times and cache meters (not stable);
    ``usage`` (e.g. ``Conversation.usage``) adds each recorded turn's ``"usage"`` block (the
    n-th envelope of a turn gets its n-th read-back by call: an agent loop's envelopes,
    one per call, get their call's) and ``calibration`` (``Conversation.state.calibration``)
    each model's learned margin."""
    by_turn: dict[int, list[TurnUsage]] = {}
    for u in sorted(usage, key=lambda u: (u.turn, u.call)):
        by_turn.setdefault(u.turn, []).append(u)
    if counter is None:
        counter = TokenCounter((budget.tokenizer if budget is not None else None) or "o200k_base")
    seen: dict[int, int] = {}
    turns: list[dict[str, Any]] = []
    reports = prefix_reports(envelopes, counter, budget=budget)
    for e, report in zip(envelopes, reports, strict=True):
        n = seen[e.turn] = seen.get(e.turn, -1) + 1
        recorded = by_turn.get(e.turn, ())
        found = recorded[n] if n < len(recorded) else None
        turn = trace_turn(e, counter, timings=timings, usage=found, budget=budget)
        turn["cache"] = report.trace()
        if not turns and e.turn > 1:  # the request before it is not in the list
            known = e.cache
            turn["cache"] = (
                {"common_prefix_tokens": 0, "break_reason": PREVIOUS_NOT_REBUILT}
                if known is None
                else {"common_prefix_tokens": known.tokens, "break_reason": known.reason}
            )
        turns.append(turn)
    settle_turns(turns)
    out: dict[str, Any] = {
        "lamina_trace": TRACE_VERSION,
        "tokenizer": counter.name,
        "turns": turns,
    }
    if calibration:
        out["calibration"] = [
            {"model": c.model, "margin": c.margin, "prior": c.prior, "samples": c.samples}
            for c in calibration
        ]
    return out


def cached_prefix(
    previous: Envelope | None,
    current: Envelope,
    counter: TokenCounter,
    *,
    budget: Budget | None = None,
) -> CachedPrefix:
    """``current``'s cached prefix against the request before it (``previous``; None on
    the first turn, or where it is not known), as sent and as its trace turn tells it:
    the tokens, the break's code and its sentence (``Envelope.cache``)."""
    shown = [current] if previous is None else [previous, current]
    turn = trace_document(shown, counter, budget=budget)["turns"][-1]
    cache = turn["cache"]
    return CachedPrefix(
        tokens=int(cache["common_prefix_tokens"]),
        total=int(turn["tokens_total"]),
        reason=cache["break_reason"],
        sentence=cache["sentence"],
    )
