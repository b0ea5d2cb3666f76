"""Scripted conversations (JSON or YAML) for the CLI, demos and replay tests."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from lamina.pipeline import (
    AttachmentSpec,
    Conversation,
    Envelope,
    LaminaError,
    SourceResolver,
    SystemPrompt,
    check_envelope,
)
from lamina.pipeline.errors import ScriptError
from lamina.pipeline.inputs import FileProblem, LoadError, load_json, load_yaml, read_regular
from lamina.pipeline.store import Store, save_turn

__all__ = [
    "MAX_SCRIPT_BYTES",
    "AfterTurn",
    "Script",
    "ScriptTurn",
    "load_script",
    "parse_script",
    "run_saved",
    "run_script",
]

MAX_SCRIPT_BYTES = 4_000_000
"""A larger script file is refused before it is parsed."""


@attrs.frozen
class ScriptTurn:
    user: str
    attach: tuple[Mapping[str, Any], ...] = ()
    reply: str | None = None
    vault_changes: tuple[tuple[str, str], ...] = ()
    tools: tuple[Mapping[str, Any], ...] = ()
    agent: tuple[tuple[Mapping[str, Any], ...], ...] = ()


@attrs.frozen
class Script:
    """A parsed script; ``vault`` is already resolved against the script's folder."""

    path: str
    system: SystemPrompt
    turns: tuple[ScriptTurn, ...]
    vault: Path | None = None
    # ``defer_library: false``: grow the library every turn (the seed's layout).
    defer_library: bool = True


# Files a user may hand `lamina run` by mistake: attachments, not scripts.
NOT_SCRIPTS = frozenset({".md", ".markdown", ".pdf", ".vtt", ".html", ".htm", ".txt"})


def load_script(path: str | Path) -> Script:
    """Read and validate a JSON or YAML script file."""
    p = Path(path)
    if p.suffix.lower() in NOT_SCRIPTS:
        raise ScriptError(
            str(p),
            "",
            f"a {p.suffix} file is not a script: a script is a YAML or JSON file with a "
            "'turns' list that attaches notes and files (`lamina run --help` shows the format)",
        )
    try:
        raw = read_regular(p, MAX_SCRIPT_BYTES).decode("utf-8")
    except FileProblem as exc:
        problem = "no such file" if exc.reason == "missing" else f"cannot read: {exc.detail}"
        raise ScriptError(str(p), "", problem) from None
    except UnicodeDecodeError as exc:
        raise ScriptError(str(p), "", f"cannot read: {exc}") from None
    try:
        data = load_json(raw) if p.suffix == ".json" else load_yaml(raw)
    except LoadError as exc:
        where = f"line {exc.line}" if exc.line else ""
        raise ScriptError(
            str(p), where, f"{exc.problem} (a script is YAML or JSON with a 'turns' list)"
        ) from None
    return parse_script(data, str(p), base=p.parent)


def _text(value: Any, path: str, where: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ScriptError(path, where, f"must be a string, got {type(value).__name__}")
    return value


def parse_script(data: Any, path: str = "<script>", base: Path | None = None) -> Script:
    """Validate the script structure (attachments are checked by ``run_script``)."""
    if not isinstance(data, Mapping):
        raise ScriptError(path, "", "a script must be a mapping with a 'turns' list")
    unknown = sorted(set(data) - {"system", "vault", "turns", "defer_library"})
    if unknown:
        raise ScriptError(path, unknown[0], "unknown top-level field")
    system_raw = data.get("system", "")
    if isinstance(system_raw, Mapping):
        extra = sorted(set(system_raw) - {"stable", "mutable"})
        if extra:
            raise ScriptError(path, f"system.{extra[0]}", "unknown field (use stable/mutable)")
        system = SystemPrompt(
            _text(system_raw.get("stable", ""), path, "system.stable") or "",
            _text(system_raw.get("mutable", ""), path, "system.mutable") or "",
        )
    else:
        system = SystemPrompt(_text(system_raw, path, "system") or "")
    vault_raw = _text(data.get("vault"), path, "vault", optional=True)
    vault = None if vault_raw is None else (base or Path(".")) / vault_raw
    turns_raw = data.get("turns")
    if not isinstance(turns_raw, list) or not turns_raw:
        raise ScriptError(path, "turns", "must be a non-empty list")
    turns = tuple(_turn(t, path, f"turns[{i}]") for i, t in enumerate(turns_raw))
    defer = data.get("defer_library", True)
    if not isinstance(defer, bool):
        raise ScriptError(path, "defer_library", "must be true or false")
    return Script(path, system, turns, vault, defer)


def _turn(raw: Any, path: str, where: str) -> ScriptTurn:
    if not isinstance(raw, Mapping):
        raise ScriptError(path, where, "a turn must be a mapping with a 'user' field")
    unknown = sorted(set(raw) - {"user", "attach", "reply", "vault_changes", "tools", "agent"})
    if unknown:
        raise ScriptError(path, f"{where}.{unknown[0]}", "unknown turn field")
    user = _text(raw.get("user"), path, f"{where}.user") or ""
    attach = raw.get("attach", [])
    if not isinstance(attach, list) or not all(isinstance(a, Mapping) for a in attach):
        raise ScriptError(
            path, f"{where}.attach", 'must be a list of mappings like {"note": "a.md"}'
        )
    reply = _text(raw.get("reply"), path, f"{where}.reply", optional=True)
    changes = raw.get("vault_changes", {})
    if not isinstance(changes, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in changes.items()
    ):
        raise ScriptError(path, f"{where}.vault_changes", "must map note paths to new text")
    tools = _calls(raw.get("tools", []), path, f"{where}.tools")
    agent_raw = raw.get("agent", [])
    if not isinstance(agent_raw, list) or not all(
        isinstance(s, Mapping) and set(s) == {"calls"} for s in agent_raw
    ):
        raise ScriptError(path, f"{where}.agent", 'must be a list of {"calls": [...]} steps')
    agent = tuple(
        _calls(s["calls"], path, f"{where}.agent[{i}].calls", empty=False)
        for i, s in enumerate(agent_raw)
    )
    return ScriptTurn(user, tuple(attach), reply, tuple(sorted(changes.items())), tools, agent)


def _calls(raw: Any, path: str, where: str, *, empty: bool = True) -> tuple[Mapping[str, Any], ...]:
    """Tool calls: ``[{"name": str, "args": {...}, "result": str}, ...]``."""
    if not isinstance(raw, list) or (not empty and not raw):
        raise ScriptError(path, where, "must be a list of tool calls")
    for i, call in enumerate(raw):
        ok = (
            isinstance(call, Mapping)
            and set(call) <= {"name", "args", "result"}
            and isinstance(call.get("name"), str)
            and isinstance(call.get("args", {}), Mapping)
            and isinstance(call.get("result", ""), str)
        )
        if not ok:
            raise ScriptError(
                path, f"{where}[{i}]", 'a call is {"name": str, "args": {...}, "result": str}'
            )
    return tuple(raw)


AfterTurn = Callable[[Envelope, ScriptTurn], None]
"""Called after each turn (and its reply): the envelope and the script turn it ran."""


def run_script(
    script: Script,
    conversation: Conversation,
    *,
    check: bool = True,
    previous: Envelope | None = None,
    after_turn: AfterTurn | None = None,
) -> list[Envelope]:
    """Run every turn; attachments are parsed up front so a typo fails before turn 1.

    ``previous`` is the envelope before the first turn (when resuming), for the checks;
    ``after_turn`` is how a caller persists each turn (``run_saved``).
    """
    specs = _parse_attachments(script, conversation.sources)
    envelopes: list[Envelope] = []
    first = previous.turn + 1 if previous is not None else 1
    for number, (turn, turn_specs) in enumerate(zip(script.turns, specs, strict=True), first):
        try:
            envelope = _run_turn(conversation, turn, turn_specs)
        except LaminaError as exc:
            # Which turn of which script: the CLI prints an error's notes after it.
            exc.add_note(f"in turn {number} of {script.path}")
            raise
        if check:
            check_envelope(envelope, previous, conversation.policy)
        if turn.reply is not None:
            conversation.reply(turn.reply)
        if after_turn is not None:
            after_turn(envelope, turn)
        envelopes.append(envelope)
        previous = envelope
    return envelopes


def run_saved(
    script: Script,
    conversation: Conversation,
    store: Store,
    conversation_id: str,
    *,
    check: bool = True,
    previous: Envelope | None = None,
) -> list[Envelope]:
    """``run_script`` that saves each turn (with its reply and script forms) to ``store``."""
    if conversation.summaries.backing is None:  # summaries made this turn go to the store
        conversation.summaries.backing = store

    def save(envelope: Envelope, turn: ScriptTurn) -> None:
        save_turn(store, conversation_id, conversation, envelope, turn.attach)

    return run_script(script, conversation, check=check, previous=previous, after_turn=save)


def _run_turn(
    conversation: Conversation, turn: ScriptTurn, specs: Sequence[AttachmentSpec]
) -> Envelope:
    """A turn, with single-shot tool results and a recorded agent loop when it has them."""
    changes = dict(turn.vault_changes)
    if not turn.tools and not turn.agent:
        return conversation.turn(turn.user, specs, vault_changes=changes)
    from lamina.pipeline.agent import AgentTurn, agent_call
    from lamina.pipeline.tools import tool, tool_turn

    tools = [tool(c["name"], c.get("args", {}), c.get("result", "")) for c in turn.tools]
    if not turn.agent:
        return tool_turn(conversation, turn.user, specs, tools=tools, vault_changes=changes)
    agent = AgentTurn.start(conversation, turn.user, specs, tools=tools, vault_changes=changes)
    for step in turn.agent:
        calls = [agent_call(c["name"], c.get("args", {}), c.get("result", "")) for c in step]
        agent = agent.step(*calls)
    agent.fit()  # the recorded loop must fit the budget, or the script fails loudly
    return agent.envelope


def _parse_attachments(script: Script, sources: SourceResolver) -> list[Sequence[AttachmentSpec]]:
    out: list[Sequence[AttachmentSpec]] = []
    for i, turn in enumerate(script.turns):
        specs: list[AttachmentSpec] = []
        for j, raw in enumerate(turn.attach):
            try:
                specs.append(sources.parse(raw))
            except LaminaError as exc:
                raise ScriptError(script.path, f"turns[{i}].attach[{j}]", str(exc)) from None
        out.append(specs)
    return out
