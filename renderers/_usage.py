"""Usage read-back: the provider's reported tokens against the request Lamina rendered.

The prediction assumes the previous request is still cached (the simulator's rules for
the provider: OpenAI's 1,024-token minimum and 128-token steps, Anthropic's breakpoints
and look-back, Gemini's minimum), so a shortfall names something the host can fix. An
agent loop's calls are requests of their own (``Loop``): each is predicted as it was
sent, the turn's envelope with the loop's steps so far.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from lamina.pipeline import DecisionAction, Envelope
from lamina.pipeline.agent import Loop, LoopStep, loop_tokens
from lamina.pipeline.errors import ConfigError
from lamina.pipeline.sources import TurnWarning
from lamina.pipeline.tokens import (
    ModelProfile,
    TokenCounter,
    TurnUsage,
    Usage,
    generic_profile,
    get_profile,
    provider_of,
    read_usage,
    request_tokens,
)
from lamina.renderers._agent import (
    agent_request,
    anthropic_tool_prompt,
    instructions_tokens,
    tool_tokens,
)
from lamina.renderers._cache import classify_break, prefix_report
from lamina.renderers._layouts import Layout, build_prompt
from lamina.renderers._providers import DEFAULT_MODELS, Ttl, request_options
from lamina.renderers._requests import RequestRegistry, render_request
from lamina.renderers._simulate import simulate

__all__ = ["CACHE_MISS", "trace_usage", "usage_record"]

CACHE_MISS = "cache-miss"

Request = Envelope | Loop
"""A request as sent: a turn's own (its envelope) or one call of its agent loop."""


def _envelope(request: Request) -> Envelope:
    return request.envelope if isinstance(request, Loop) else request


def _steps(request: Request) -> tuple[LoopStep, ...]:
    return request.steps if isinstance(request, Loop) else ()


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


def _sent_tools(body: Mapping[str, Any]) -> tuple[list[dict[str, Any]], Any]:
    """The function tools of a body as sent, as (name, description, parameters), and its
    ``tool_choice``: OpenAI chat (``function``), Responses and Anthropic (``input_schema``)
    tools, Gemini ``functionDeclarations``. Server tools (no schema) are not counted."""
    found: list[dict[str, Any]] = []

    def add(tool: Mapping[str, Any], schema: str) -> None:
        if isinstance(tool.get("name"), str):
            found.append(
                {
                    "name": tool["name"],
                    "description": tool.get("description") or "",
                    "parameters": tool.get(schema) or {},
                }
            )

    for tool in body.get("tools") or ():
        if not isinstance(tool, Mapping):
            continue
        if isinstance(tool.get("function"), Mapping):
            add(tool["function"], "parameters")
        elif "functionDeclarations" in tool or "function_declarations" in tool:
            declared = tool.get("functionDeclarations") or tool.get("function_declarations")
            for item in declared or ():
                if isinstance(item, Mapping):
                    add(item, "parameters")
        elif "input_schema" in tool:
            add(tool, "input_schema")
        elif "parameters" in tool:
            add(tool, "parameters")
    return found, body.get("tool_choice")


def _has_cache_control(body: Any) -> bool:
    if isinstance(body, Mapping):
        return "cache_control" in body or any(_has_cache_control(v) for v in body.values())
    if isinstance(body, list):
        return any(_has_cache_control(v) for v in body)
    return False


# What each cause of a miss is called in ``TurnUsage.cause``.
HOST_ALTERED = "host-altered"
PREFIX_CHANGED = "prefix-changed"
EXPIRED = "expired"
NOT_EXPIRED = "not-expired"
UNKNOWN = "unknown"

_LAYERS = {
    "system-changed": "L1",
    "memory-changed": "L1",
    "handoff": "L1",
    "instructions-changed": "the framework's instructions after L2",
    "history-cut-moved": "L4",
}


def _lifetime(provider: str, ttl: Ttl | None) -> tuple[int | None, str]:
    """The shortest time the provider keeps a cached prefix (None: not published), and
    how its documentation puts it."""
    if provider == "anthropic":
        if ttl == "1h":
            return 3600, "Anthropic's 1-hour cache TTL"
        return 300, "Anthropic's 5-minute cache TTL"
    if provider == "openai":
        return 300, "OpenAI's 5-10 idle minutes"
    return None, "Gemini's implicit cache lifetime (not published)"


def _where(reason: str, previous: Envelope, current: Envelope) -> str:
    """A ``classify_break`` reason with the layer (and, in the history, the message) it
    changed at."""
    if reason == "history-cut-moved":
        old, new = previous.history(), current.history()
        at = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), None)
        at = min(len(old), len(new)) if at is None else at
        return f"L4 from history message {at + 1} ({reason})"
    return f"{_LAYERS.get(reason, 'L2')} ({reason})"


def _cause(
    previous: Envelope | None,
    current: Envelope,
    observed: Usage,
    predicted_input: int,
    exact: bool,
    expected: Mapping[str, Any],
    sent: Mapping[str, Any] | None,
    elapsed: float | None,
    ttl: Ttl | None,
    provider: str,
    with_tools: bool = False,
    instructions: Sequence[str] = (),
) -> tuple[str, str]:
    """The likeliest cause of a predicted cache hit that did not happen, from evidence:
    the request sent (less the framework's own ``instructions``, which Lamina did not
    render), the prefix Lamina changed, the input count, the time since the last request.
    (cause, sentence)."""
    if sent is not None:
        added = set(instructions)
        mine = "\n\n".join(_sent_texts(expected))
        theirs = "\n\n".join(t for t in _sent_texts(sent) if t not in added)
        if mine != theirs:
            at = next(
                (i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b),
                min(len(mine), len(theirs)),
            )
            return HOST_ALTERED, (
                f"the request was altered by the host: the request sent differs from "
                f"Lamina's rendering at character {at} (the host or framework changed it), "
                f"so the cached prefix no longer matches"
            )
        if "system" in expected and not _has_cache_control(sent):
            return HOST_ALTERED, "the request sent carries no cache_control breakpoint"
    breaks = [] if previous is None else classify_break(previous, current)
    if previous is not None and breaks:
        where = ", ".join(_where(r, previous, current) for r in breaks)
        return PREFIX_CHANGED, f"the prefix changed at {where} since the last request"
    if sent is None and exact and observed.input_tokens != predicted_input:
        more = observed.input_tokens - predicted_input
        hint = "" if with_tools or more < 0 else (
            "; tool definitions sent count too: pass tools= (a framework's own "
            "instructions: instructions=)"
        )
        return HOST_ALTERED, (
            f"the request was altered by the host: the provider counted "
            f"{observed.input_tokens} input tokens where Lamina's request has exactly "
            f"{predicted_input} ({more:+d}), so the request sent is not Lamina's alone "
            f"(the host or framework changed or added to it{hint})"
        )
    seconds, lifetime = _lifetime(provider, ttl)
    if sent is not None:
        lead = "the request sent is Lamina's, so the provider dropped the cached prefix"
    elif exact:
        lead = "the provider counted exactly Lamina's request, so it dropped the cached prefix"
    else:
        lead = "the provider dropped the cached prefix"
    if elapsed is None or seconds is None:
        since = (
            "the time since the previous request is unknown (pass elapsed=)"
            if elapsed is None
            else f"{elapsed:.0f} s passed since the previous request"
        )
        return UNKNOWN, (
            f"{lead}: {since}, so it may have expired ({lifetime}) or the request reached "
            f"another machine (OpenAI: send a prompt_cache_key)"
        )
    if elapsed >= seconds:
        return EXPIRED, (
            f"the cached prefix expired: {elapsed:.0f} s passed since the previous request, "
            f"past {lifetime}"
        )
    return NOT_EXPIRED, (
        f"{lead} early: {elapsed:.0f} s passed since the previous request, within "
        f"{lifetime}, so it did not expire; the request likely reached another machine "
        f"(OpenAI: send a prompt_cache_key)"
    )


def _resolve(
    renderer: str | None, model: str | None, shape: str
) -> tuple[str, ModelProfile, str]:
    """The renderer, the model's profile and, for a model without one, the generic rules
    used: the provider comes from the renderer, else the model's name, else the usage
    object's shape."""
    registry = RequestRegistry.builtin()
    if renderer is not None:
        provider = registry.provider(renderer)
        how = f"the {renderer} renderer"
    elif model is not None and provider_of(model) is not None:
        provider = provider_of(model) or ""
        how = "the model's name"
    else:
        provider = shape
        how = "the usage's shape"
    name = model or DEFAULT_MODELS[provider]
    if _known(name):
        return renderer or provider, get_profile(name), ""
    rules = f"generic {provider} rules: no profile for {name!r} (provider from {how})"
    return renderer or provider, generic_profile(name, provider), rules


def _known(name: str) -> bool:
    try:
        get_profile(name)
    except ConfigError:
        return False
    return True


def _counted(
    requests: Sequence[Request], layout: Layout, counter: TokenCounter, profile: ModelProfile
) -> int:
    """Exact local tokens of the request in ``layout`` with the model's framing: the
    envelope's request (what ``Conversation.count_request`` gives) for the default layout,
    plus an agent loop's steps (``loop_tokens``), else the layout's messages, each framed."""
    framing = profile.framing
    if layout == "default":
        last = requests[-1]
        return request_tokens(_envelope(last), counter, framing) + loop_tokens(
            _steps(last), counter, framing
        )
    chat = build_prompt([_envelope(r) for r in requests], layout, counter).chat()
    contents = sum(counter.count(text.strip() if framing.trim else text) for _, text in chat)
    return contents + framing.per_message * len(chat) + framing.priming


def _loop_hit(
    previous: Request,
    current: Request,
    hit: int,
    tools: int,
    provider: str,
    profile: ModelProfile,
    counter: TokenCounter,
    ttl: Ttl | None,
) -> int:
    """The cached prefix of a loop's call after the request before it, built from the same
    envelope (the same turn, no handoff or cut in between): a prefix-caching provider
    (OpenAI, Gemini) reads that request's tool definitions and a framework's instructions
    (``tools``: what the framework adds), messages and the loop steps the two share whole,
    within its rules; Anthropic reads the whole of that request (its last block carries a
    breakpoint, ``agent_request``) when this one repeats all its steps, else up to the
    envelope's breakpoints, as the simulator has it (``hit``). Else ``hit``."""
    before, after = _envelope(previous), _envelope(current)
    if not (
        before.turn == after.turn and before.layers == after.layers and before.batch == after.batch
    ):
        return hit
    old, new = _steps(previous), _steps(current)
    shared = 0
    while shared < min(len(old), len(new)) and old[shared] == new[shared]:
        shared += 1
    if provider == "anthropic" and shared < len(old):
        return hit
    framing = profile.framing
    best = (
        request_tokens(before, counter, framing)
        - framing.priming
        + loop_tokens(old[:shared], counter, framing)
    )
    best += tools
    return _served(best, provider, profile, counter, ttl)


def _served(tokens: int, provider: str, profile: ModelProfile, counter: TokenCounter,
            ttl: Ttl | None) -> int:  # fmt: skip
    """What a prefix-caching provider serves of a shared prefix of ``tokens``: within its
    minimum, in its steps."""
    rules = request_options(provider, profile.name, profile=profile, counter=counter, ttl=ttl)
    step, least = rules.rules.step, rules.rules.min_tokens
    return tokens - tokens % step if tokens >= least else 0


def _mutable(request: Request) -> str:
    segment = _envelope(request).l1.get("system:mutable")
    return "" if segment is None else segment.text


def _same_agent(requests: Sequence[Request]) -> Request | None:
    """The last request before the previous one that sent the current one's L1 mutable
    part when the previous one sent another (a handoff between them: triage, then the
    researcher again), whose prefix may still be cached: None when there is none."""
    if len(requests) < 3:
        return None
    mine, before = _mutable(requests[-1]), _mutable(requests[-2])
    if mine == before:
        return None
    return next((r for r in reversed(requests[:-2]) if _mutable(r) == mine), None)


def _instructions_changed(envelope: Envelope) -> bool:
    return any(d.action is DecisionAction.INSTRUCTIONS_CHANGED for d in envelope.report.decisions)


def _system_tokens(current: Envelope, profile: ModelProfile, counter: TokenCounter) -> int:
    """The system message's tokens as sent: what stays cached, after the tool definitions,
    when a framework's own instructions that follow it changed."""
    framing = profile.framing
    system = current.as_sent().system_text
    return framing.per_message + counter.count(system.strip() if framing.trim else system)


def usage_record(
    envelopes: Sequence[Request],
    response: Any,
    renderer: str | None = None,
    model: str | None = None,
    *,
    counter: TokenCounter | None = None,
    counted: int | None = None,
    layout: Layout = "default",
    sent: Mapping[str, Any] | None = None,
    elapsed: float | None = None,
    ttl: Ttl | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_choice: Any = None,
    instructions: Sequence[str] = (),
) -> TurnUsage:
    """The usage read-back of the last request.

    ``envelopes`` are the conversation's requests so far (the previous one gives the
    cache prediction): a turn's envelope, or for a turn run as an agent loop each call's
    ``Loop`` (an adapter's ``loops``, ``AgentTurn.fit()``), whose read-back is that call's
    (``TurnUsage.call``: its steps + 1), predicted as sent: the envelope, the steps so far
    and the tools, the calls before it of the same envelope cached (default layout only);
    ``response`` is the provider's response or usage object, or its
    dict form; ``renderer`` the request renderer (default: the model's provider, else the
    usage's shape); a ``model`` without a profile is read with its provider's generic
    rules (``TurnUsage.rules`` says so). ``sent`` is the body actually sent, when the host
    has it (a framework may rewrite Lamina's request); ``elapsed`` the seconds since the
    previous request (tells expiry from routing); ``ttl`` Anthropic's cache TTL sent;
    ``counted`` Lamina's count of the request as the budget sees it (default: the
    predicted input before any margin), the figure calibration uses. ``tools`` are the
    tool definitions sent with the request (``name``, ``description``, ``parameters``,
    as ``tool_tokens`` takes them; an adapter's ``state.tools``) and ``tool_choice`` the
    one sent; without them, those of ``sent``. ``instructions`` are the texts a framework
    sent as system messages of their own beside Lamina's (pydantic-ai's
    ``Agent(instructions=...)`` and ``@agent.instructions``: its adapter's
    ``instructions[n]`` for the n-th request), counted as ``instructions_tokens`` does.

    The predicted input is the exact local count of the request (for the default layout
    ``Conversation.count_request``'s figure, with the model's framing) plus the tool
    definitions (``tool_tokens``), scaled by the profile's margin where the provider's
    tokenizer is not local (Anthropic's tool-use system prompt is its own count, added
    as published), plus the framework's ``instructions``. ``counted`` gets the tools and
    instructions too; a predicted cache hit covers them (the tools precede the messages
    in every provider's prefix, the instructions follow Lamina's system message).
    """
    requests = list(envelopes)
    last = requests[-1]
    current = _envelope(last)
    before = requests[-2] if len(requests) > 1 else None
    previous = None if before is None else _envelope(before)
    looped = any(isinstance(r, Loop) for r in requests[-2:])
    if looped and layout != "default":
        raise ConfigError(
            "layout", f"an agent loop's requests are in the default layout, not {layout!r}"
        )
    observed = read_usage(response)
    renderer, profile, rules = _resolve(renderer, model, observed.provider)
    if isinstance(last, Loop):
        expected = agent_request(
            last, renderer, profile.name, counter=counter, profile=profile, ttl=ttl
        )
    else:
        expected = render_request(
            [_envelope(r) for r in requests], renderer, profile.name, layout=layout,
            counter=counter, profile=profile, ttl=ttl,
        )
    provider = expected.provider
    observed = attrs.evolve(observed, provider=provider)
    count = counter or TokenCounter(profile.tokenizer)
    if tools is None and sent is not None:
        tools, sent_choice = _sent_tools(sent)
        tool_choice = sent_choice if tool_choice is None else tool_choice
    defs = list(tools or ())
    # The tool-use prompt is the provider's own count; the definitions are counted here.
    prompt = anthropic_tool_prompt(profile.name, tool_choice) if defs and (
        provider == "anthropic"
    ) else 0
    tools_local = (
        tool_tokens(defs, renderer, count, tool_choice=tool_choice, model=profile.name) - prompt
    )
    # What the framework adds beside Lamina's request: tool definitions, instructions.
    added = tools_local + instructions_tokens(instructions, count, profile.framing.per_message)
    exact_input = _counted(requests, layout, count, profile) + added
    predicted_input = profile.effective_tokens(exact_input) + prompt
    local = (counted + added if counted is not None else exact_input) + prompt

    def cached_after(earlier: Request) -> int:
        """What ``earlier`` left cached that this request reads (the simulator's rules,
        the loop's own calls)."""
        if isinstance(earlier, Loop) and isinstance(last, Loop) and earlier.tools != last.tools:
            return 0  # other tool definitions: they lead the prefix
        if provider != "anthropic" and layout == "default":
            # The tools, then the token prefix the two requests share, in the provider's
            # steps (the simulator rounds the messages' prefix alone).
            shared = prefix_report(_envelope(earlier), current, count).common_prefix_tokens
            hit = _served(added + shared, provider, profile, count, ttl) if shared else 0
        else:
            sim = simulate(
                [_envelope(earlier), current], counter=count, providers=(provider,),
                models={provider: profile.name}, layouts=(layout,), ttl=ttl,
                profiles={provider: profile},
            )  # fmt: skip
            cached = sim.series[0].turns[-1].cached_tokens
            hit = cached + added if cached > 0 else 0
        if isinstance(earlier, Loop) or isinstance(last, Loop):
            hit = _loop_hit(earlier, last, hit, added, provider, profile, count, ttl)
        return hit

    hit = 0 if before is None else cached_after(before)
    handed = None if layout != "default" else _same_agent(requests)
    if handed is not None:
        hit = max(hit, cached_after(handed))
    if hit and provider != "anthropic" and _instructions_changed(current):
        kept = tools_local + _system_tokens(current, profile, count)
        hit = min(hit, _served(kept, provider, profile, count, ttl))
    predicted_cached = profile.effective_tokens(hit) + prompt if hit else 0
    warning, cause = None, ""
    # Local counts of a non-local tokenizer run low, so only a shortfall of half is a miss.
    if hit > 0 and observed.cached_tokens < hit // 2:
        cause, reason = _cause(
            previous, current, observed, predicted_input, profile.exact_tokens,
            expected.body, sent, elapsed, ttl, provider, bool(defs or instructions),
            instructions,
        )
        warning = TurnWarning(
            CACHE_MISS,
            f"turn:{current.turn}",
            f"predicted {hit} cached input tokens, the provider reported "
            f"{observed.cached_tokens}: {reason}",
        )
    return TurnUsage(
        current.turn,
        provider,
        profile.name,
        predicted_input,
        min(predicted_cached, predicted_input),
        observed,
        local,
        profile.exact_tokens,
        warning,
        rules,
        cause,
        len(last.steps) + 1 if isinstance(last, Loop) else 0,
    )


def trace_usage(usage: TurnUsage) -> dict[str, Any]:
    """The trace's ``"usage"`` block: observed figures at the top, the prediction beside."""
    observed = usage.observed
    return {
        "provider": usage.provider,
        "model": usage.model,
        "call": usage.call,
        "input_tokens": observed.input_tokens,
        "cached_tokens": observed.cached_tokens,
        "cache_write_tokens": observed.cache_write_tokens,
        "output_tokens": observed.output_tokens,
        "predicted": {
            "input_tokens": usage.predicted_input,
            "cached_tokens": usage.predicted_cached,
        },
        "counted": usage.counted,
        "rules": usage.rules,
        "cause": usage.cause,
        "warning": None
        if usage.warning is None
        else {"code": usage.warning.code, "message": usage.warning.message},
    }
