"""Usage read-back: the provider's reported tokens against the request Lamina rendered.

The prediction assumes the previous request is still cached (the simulator's rules for
the provider: OpenAI's 1,024-token minimum and 128-token steps, Anthropic's breakpoints
and look-back, Gemini's minimum), so a shortfall names something the host can fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipeline import (
    Envelope,
    TokenCounter,
    TurnUsage,
    TurnWarning,
    Usage,
    get_profile,
    read_usage,
    request_tokens,
)
from renderers._cache import classify_break
from renderers._layouts import Layout
from renderers._requests import render_request
from renderers._simulate import simulate

__all__ = ["CACHE_MISS", "trace_usage", "usage_record"]

CACHE_MISS = "cache-miss"


def _sent_texts(body: Mapping[str, Any]) -> list[str]:
    """The texts of a request body in order (system first), whatever the provider."""
    out: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, Mapping):
            for key in ("text", "content", "parts", "instructions"):
                if key in value:
                    walk(value[key])
        elif isinstance(value, Sequence):
            for item in value:
                walk(item)

    for key in ("instructions", "system", "systemInstruction", "messages", "input", "contents"):
        if key in body:
            walk(body[key])
    return out


def _has_cache_control(body: Any) -> bool:
    if isinstance(body, Mapping):
        return "cache_control" in body or any(_has_cache_control(v) for v in body.values())
    if isinstance(body, list):
        return any(_has_cache_control(v) for v in body)
    return False


def _reason(
    previous: Envelope | None,
    current: Envelope,
    observed: Usage,
    predicted_input: int,
    exact: bool,
    expected: Mapping[str, Any],
    sent: Mapping[str, Any] | None,
) -> str:
    """The likeliest reason a predicted cache hit did not happen."""
    if sent is not None:
        mine, theirs = "\n\n".join(_sent_texts(expected)), "\n\n".join(_sent_texts(sent))
        if mine != theirs:
            at = next(
                (i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b),
                min(len(mine), len(theirs)),
            )
            return (
                f"the prefix changed: the request sent differs from Lamina's rendering at "
                f"character {at} (the host or framework changed it), so the cached prefix "
                f"no longer matches"
            )
        if "system" in expected and not _has_cache_control(sent):
            return "the request sent carries no cache_control breakpoint"
    breaks = classify_break(previous, current)
    if breaks:
        return f"the prefix changed since the last request ({', '.join(breaks)})"
    if exact and observed.input_tokens != predicted_input:
        return (
            f"the prefix may have changed: the provider counted {observed.input_tokens} "
            f"input tokens where Lamina's rendering has {predicted_input}, so the request "
            f"sent is not Lamina's alone (the host or framework changed or added to it)"
        )
    return (
        "the provider did not keep the previous request's prefix: it expired (Anthropic: "
        "5 minutes, OpenAI: 5-10 idle minutes) or the request reached another machine "
        "(OpenAI: send a prompt_cache_key)"
    )


def usage_record(
    envelopes: Sequence[Envelope],
    response: Any,
    renderer: str = "openai",
    model: str | None = None,
    *,
    counter: TokenCounter | None = None,
    counted: int | None = None,
    layout: Layout = "default",
    sent: Mapping[str, Any] | None = None,
) -> TurnUsage:
    """The usage read-back of the last envelope's request.

    ``envelopes`` are the conversation's envelopes so far (the previous one gives the
    cache prediction); ``response`` is the provider's response or usage object, or its
    dict form; ``sent`` the body actually sent, when the host has it (a framework may
    rewrite Lamina's request); ``counted`` Lamina's count of the request as the budget
    sees it (default: the envelope's request tokens), the figure calibration uses.
    """
    current = envelopes[-1]
    previous = envelopes[-2] if len(envelopes) > 1 else None
    expected = render_request(list(envelopes), renderer, model, layout=layout, counter=counter)
    provider = expected.provider
    name = str(expected.body.get("model") or model or "")
    if not name and provider == "gemini":
        name = expected.path.split("/models/")[1].split(":")[0]
    profile = get_profile(name)
    count = counter or TokenCounter(profile.tokenizer)
    sim = simulate(
        list(envelopes[-2:]),
        counter=count,
        providers=(provider,),
        models={provider: name},
        layouts=(layout,),
    )
    cost = sim.series[0].turns[-1]
    predicted_input = profile.effective_tokens(cost.input_tokens)
    observed = read_usage(response, provider)
    local = counted if counted is not None else request_tokens(current, count)
    warning = None
    # Local counts of a non-local tokenizer run low, so only a shortfall of half is a miss.
    if cost.cached_tokens > 0 and observed.cached_tokens < cost.cached_tokens // 2:
        reason = _reason(
            previous, current, observed, cost.input_tokens, profile.exact_tokens,
            expected.body, sent,
        )
        warning = TurnWarning(
            CACHE_MISS,
            f"turn:{current.turn}",
            f"predicted {cost.cached_tokens} cached input tokens, the provider reported "
            f"{observed.cached_tokens}: {reason}",
        )
    return TurnUsage(
        current.turn,
        provider,
        name,
        predicted_input,
        profile.effective_tokens(cost.cached_tokens),
        observed,
        local,
        profile.exact_tokens,
        warning,
    )


def trace_usage(usage: TurnUsage) -> dict[str, Any]:
    """The trace's ``"usage"`` block: observed figures at the top, the prediction beside."""
    observed = usage.observed
    return {
        "provider": usage.provider,
        "model": usage.model,
        "input_tokens": observed.input_tokens,
        "cached_tokens": observed.cached_tokens,
        "cache_write_tokens": observed.cache_write_tokens,
        "output_tokens": observed.output_tokens,
        "predicted": {
            "input_tokens": usage.predicted_input,
            "cached_tokens": usage.predicted_cached,
        },
        "counted": usage.counted,
        "warning": None
        if usage.warning is None
        else {"code": usage.warning.code, "message": usage.warning.message},
    }
