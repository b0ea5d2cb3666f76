"""Replay recorded conversations under configs: one result per conversation and config.

A worker gets one ``Recording`` and every config, rebuilds the conversation's script
(parsing a script file, importing a transcript into a scratch store), replays it turn by
turn under each config, checks every envelope, and costs the requests with the cache
simulator. Nothing in a result depends on the engine, the worker or the clock.
"""

from __future__ import annotations

import collections
import functools
import json
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from lamina._config import ReplayConfig, load_config
from lamina._corpus import Corpus, Recording, find_corpus, store_recordings
from lamina._engines import Engine, make_engine
from lamina._files import write_atomic
from lamina._host import Conversation, import_transcript
from lamina._script import Script, parse_script, run_script
from lamina.pipeline import Envelope, LaminaError, check_envelope
from lamina.pipeline.errors import ConfigError, InvariantViolation, ScriptError
from lamina.pipeline.inputs import LoadError, load_json, load_yaml
from lamina.pipeline.store import SqliteStore
from lamina.processors import ProcessContext, Registry, Sources, Vault
from lamina.renderers import simulate

__all__ = [
    "InvariantFailure",
    "ProviderResult",
    "ReplayError",
    "ReplayResult",
    "ReplayRun",
    "replay",
    "replay_recording",
    "replay_script",
]

RESULT_VERSION = 1


@attrs.frozen
class ProviderResult:
    """One provider's bill for a conversation: tokens, cache reads/writes and cost.

    ``cost`` is in input-token equivalents (cached reads and writes at the model's shares
    of the input price); ``usd`` is that times the config's price, when it has one."""

    provider: str
    model: str
    input_tokens: int
    cached_tokens: int
    written_tokens: int
    cost: float
    usd: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "input_tokens": self.input_tokens,
            "cached_tokens": self.cached_tokens,
            "written_tokens": self.written_tokens,
            "cost": self.cost,
            "usd": self.usd,
        }


@attrs.frozen
class InvariantFailure:
    """The first envelope of a conversation that broke an invariant."""

    turn: int
    invariant: int
    message: str


@attrs.frozen
class ReplayError:
    """Why a conversation stopped (turn 0: it could not be read or rebuilt at all)."""

    turn: int
    type: str
    message: str


@attrs.frozen
class ReplayResult:
    """One conversation under one config."""

    conversation: str
    config: str
    source: str
    turns: int
    recorded_turns: int
    tokens_sent: int = 0
    peak_tokens: int = 0
    providers: tuple[ProviderResult, ...] = ()
    decisions: tuple[tuple[str, int], ...] = ()
    invariant: InvariantFailure | None = None
    errors: tuple[ReplayError, ...] = ()
    unrebuilt: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Every recorded turn replayed and every envelope passed the invariant checks."""
        return not self.errors and self.invariant is None

    def provider(self, name: str) -> ProviderResult | None:
        return next((p for p in self.providers if p.provider == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "conversation": self.conversation,
            "config": self.config,
            "source": self.source,
            "status": "ok" if not self.errors else "error",
            "turns": self.turns,
            "recorded_turns": self.recorded_turns,
            "tokens_sent": self.tokens_sent,
            "peak_tokens": self.peak_tokens,
            "providers": {p.provider: p.to_json() for p in self.providers},
            "decisions": dict(self.decisions),
            "invariants": "ok"
            if self.invariant is None
            else attrs.asdict(self.invariant),
            "errors": [attrs.asdict(e) for e in self.errors],
            "unrebuilt": list(self.unrebuilt),
        }

    def line(self) -> str:
        """The result as one JSON line: sorted keys, so the bytes depend on the values only."""
        return json.dumps(self.to_json(), sort_keys=True, ensure_ascii=False)


def _message(exc: BaseException) -> str:
    return " ".join(str(exc).split())


# --- rebuilding a recording -------------------------------------------------------------


def _script(recording: Recording) -> tuple[Script, tuple[str, ...]]:
    """The recording as a script to replay, and what could not be rebuilt."""
    if recording.failure:
        raise ScriptError(recording.path or recording.id, "", recording.failure)
    if recording.script is not None:
        return recording.script, recording.problems
    if recording.source == "transcript":
        return _transcript_script(recording)
    try:
        # The core's bounded loaders: size, depth and alias limits, as `lamina run` reads.
        data = (
            load_json(recording.text)
            if recording.path.endswith(".json")
            else load_yaml(recording.text)
        )
    except LoadError as exc:
        raise ScriptError(recording.path, "", f"not valid YAML/JSON: {_message(exc)}") from None
    script = parse_script(data, recording.path, base=Path(recording.base))
    if script.vault is None and recording.vault:
        script = attrs.evolve(script, vault=Path(recording.vault))
    return script, recording.problems


def _transcript_script(recording: Recording) -> tuple[Script, tuple[str, ...]]:
    """Import the transcript into a scratch store (the importer decides what rebuilds:
    notes by path or basename, selections only from a store, no fetching), then read it
    back like any stored conversation."""
    with tempfile.TemporaryDirectory(prefix="lamina-replay-") as tmp:
        with SqliteStore(Path(tmp) / "import.sqlite") as store:
            report = import_transcript(
                recording.text,
                store,
                vault=recording.vault or None,
                conversation_id="replay",
                path=recording.path,
            )
        (stored,) = store_recordings(Path(tmp) / "import.sqlite", ["replay"], vault=recording.vault)
    if stored.script is None:
        raise ScriptError(recording.path, "", stored.failure or "the transcript has no turns")
    return stored.script, tuple(str(p) for p in report.problems)


# --- replaying one conversation under one config ---------------------------------------


@functools.cache
def _registry() -> Registry:
    """The processors (built-in and installed plugins), looked up once per worker process:
    reading the entry points costs more than a small conversation's whole replay."""
    return Registry.default()


def _conversation(script: Script, config: ReplayConfig) -> Conversation:
    vault = None if script.vault is None else Vault(script.vault)
    sources = Sources(registry=_registry(), context=ProcessContext(vault=vault))
    conv = Conversation(
        script.system,
        sources=sources,
        tokenizer=config.tokenizer,
        policy=config.policy,
        budget=None if config.budget is None else config.budget.budget(),
    )
    conv.summarizer = config.summarizer.make(conv.counter)
    return conv


def _decision_kinds(envelopes: Iterable[Envelope]) -> tuple[tuple[str, int], ...]:
    kinds: collections.Counter[str] = collections.Counter()
    for env in envelopes:
        for d in env.report.decisions:
            kinds[f"{d.stage}:{d.from_form}->{d.to_form}"] += 1
    return tuple(sorted(kinds.items()))


def _costs(
    envelopes: Sequence[Envelope], conv: Conversation, config: ReplayConfig
) -> tuple[tuple[ProviderResult, ...], int, int]:
    """Per provider costs (the simulator's model), total and peak request tokens."""
    ttl = next((p.ttl for p in config.providers if p.provider == "anthropic"), None)
    sim = simulate(
        envelopes,
        counter=conv.counter,
        providers=[p.provider for p in config.providers],
        models={p.provider: p.model for p in config.providers},
        layouts=(config.layout,),  # type: ignore[arg-type]
        ttl=ttl,  # type: ignore[arg-type]
        budget=conv.budget,
    )
    out: list[ProviderResult] = []
    sent: list[int] | None = None
    for pricing in config.providers:
        series = sim.get(config.layout, pricing.provider)
        read, write = pricing.shares()
        cost = sum(
            (t.input_tokens - t.cached_tokens - t.written_tokens)
            + read * t.cached_tokens
            + write * t.written_tokens
            for t in series.turns
        )
        usd = None if pricing.input_per_mtok is None else cost * pricing.input_per_mtok / 1e6
        out.append(
            ProviderResult(
                pricing.provider,
                series.model,
                series.input_tokens,
                series.cached_tokens,
                sum(t.written_tokens for t in series.turns),
                round(cost, 4),
                None if usd is None else round(usd, 8),
            )
        )
        if pricing.provider != "anthropic" and sent is None:
            # OpenAI's and Gemini's input is the layout's request in its own count.
            sent = [t.input_tokens for t in series.turns]
    if sent is None:
        sent = [conv.count_request(e) for e in envelopes]
    return tuple(out), sum(sent), max(sent, default=0)


def _run_turns(
    script: Script, conv: Conversation, errors: list[ReplayError]
) -> Iterator[Envelope]:
    """The script's envelopes, one turn at a time; a failing turn is appended to ``errors``
    and ends the replay (one conversation's failure never stops the run)."""
    for n, turn in enumerate(script.turns, start=1):
        try:
            (env,) = run_script(attrs.evolve(script, turns=(turn,)), conv, check=False)
        except Exception as exc:
            errors.append(ReplayError(n, type(exc).__name__, _message(exc)))
            return
        yield env


def replay_script(
    script: Script,
    config: ReplayConfig,
    *,
    conversation: str = "",
    source: str = "script",
    unrebuilt: Sequence[str] = (),
) -> ReplayResult:
    """Replay ``script`` turn by turn under ``config``; a failing turn ends the replay and
    is reported, the turns before it are still checked and costed."""
    errors: list[ReplayError] = []
    envelopes: list[Envelope] = []
    failure: InvariantFailure | None = None
    try:
        conv = _conversation(script, config)
    except LaminaError as exc:
        return ReplayResult(
            conversation,
            config.name,
            source,
            0,
            len(script.turns),
            errors=(ReplayError(0, type(exc).__name__, _message(exc)),),
            unrebuilt=tuple(unrebuilt),
        )
    previous: Envelope | None = None
    for n, env in enumerate(_run_turns(script, conv, errors), start=1):
        if failure is None:
            try:
                check_envelope(env, previous, conv.policy)
            except InvariantViolation as exc:
                failure = InvariantFailure(n, exc.invariant, _message(exc))
        envelopes.append(env)
        previous = env
    providers: tuple[ProviderResult, ...] = ()
    sent = peak = 0
    if envelopes:
        try:
            providers, sent, peak = _costs(envelopes, conv, config)
        except Exception as exc:
            errors.append(ReplayError(len(envelopes), type(exc).__name__, _message(exc)))
    return ReplayResult(
        conversation,
        config.name,
        source,
        len(envelopes),
        len(script.turns),
        sent,
        peak,
        providers,
        _decision_kinds(envelopes),
        failure,
        tuple(errors),
        tuple(unrebuilt),
    )


def replay_recording(
    recording: Recording, configs: Sequence[ReplayConfig]
) -> tuple[ReplayResult, ...]:
    """One task: a recording under every config (each from a fresh conversation)."""
    try:
        script, problems = _script(recording)
    except Exception as exc:
        error = (ReplayError(0, type(exc).__name__, _message(exc)),)
        return tuple(
            ReplayResult(recording.id, c.name, recording.source, 0, 0, errors=error)
            for c in configs
        )
    return tuple(
        replay_script(
            script, c, conversation=recording.id, source=recording.source, unrebuilt=problems
        )
        for c in configs
    )


# --- a whole run ------------------------------------------------------------------------


@attrs.frozen
class ReplayRun:
    """Every result, sorted by conversation and then by the configs' order."""

    configs: tuple[ReplayConfig, ...]
    results: tuple[ReplayResult, ...]
    conversations: int

    def lines(self) -> list[str]:
        return [r.line() for r in self.results]

    def write(self, path: str | Path) -> None:
        """The results file: one JSON line per conversation and config."""
        write_atomic(path, "".join(line + "\n" for line in self.lines()))


def sort_results(
    results: Iterable[ReplayResult], configs: Sequence[ReplayConfig]
) -> tuple[ReplayResult, ...]:
    order = {c.name: i for i, c in enumerate(configs)}
    return tuple(sorted(results, key=lambda r: (r.conversation, order.get(r.config, 0))))


def _configs(configs: Sequence[ReplayConfig | str | Path]) -> tuple[ReplayConfig, ...]:
    out = tuple(c if isinstance(c, ReplayConfig) else load_config(c) for c in configs)
    if not out:
        raise ConfigError("configs", "give at least one config")
    names = [c.name for c in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError("configs", f"two configs are named {twice[0]!r}")
    return out


def replay(
    corpus: Corpus | str | Path | Sequence[str | Path],
    configs: Sequence[ReplayConfig | str | Path],
    *,
    engine: Engine | str = "local",
    workers: int | None = None,
    address: str | None = None,
    vault: str | Path | None = None,
    store: str | Path | None = None,
    on_result: Callable[[tuple[ReplayResult, ...]], None] | None = None,
) -> ReplayRun:
    """Replay every conversation of ``corpus`` under every config.

    ``engine`` is "serial", "local" (a process pool, the default) or "dask" (a new
    LocalCluster, or the scheduler at ``address``), or an ``Engine``. ``on_result`` sees
    each conversation's results as they finish; the returned run is sorted, so it is the
    same whatever the engine and worker count.
    """
    arms = _configs(configs)
    found = corpus if isinstance(corpus, Corpus) else find_corpus(corpus, store=store, vault=vault)
    runner = make_engine(engine, workers, address) if isinstance(engine, str) else engine
    task = functools.partial(replay_recording, configs=arms)
    results: list[ReplayResult] = []
    for batch in runner.run(task, found.recordings):
        results.extend(batch)
        if on_result is not None:
            on_result(batch)
    return ReplayRun(arms, sort_results(results, arms), len(found))

