"""The HTML report of a replay run, and the reports of its worst conversations beside it.

``write_replay_report`` renders the run (``lamina.renderers.render_replay_report``) and, per
config, replays its worst conversations again under that config to write each one's own
conversation report (``lamina.renderers.render_report``) into ``<stem>_files/`` next to the
page, which links to them by relative paths: the folder opens offline, from any place.
"""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path
from typing import Any

import attrs

from lamina._config import ReplayConfig
from lamina._corpus import Corpus, Recording
from lamina._files import write_atomic
from lamina._replay import ReplayError, ReplayResult, ReplayRun, _conversation, _run_turns, _script
from lamina._summary import summarize
from lamina.pipeline import Envelope
from lamina.pipeline.errors import ConfigError
from lamina.renderers import (
    annotate_trace,
    render_replay_report,
    render_report,
    report_blocks,
    trace_document,
)

__all__ = ["ReplayReport", "conversation_page", "worst_results", "write_replay_report"]

WORST = 5


def _rank(result: ReplayResult) -> tuple[int, float, int, str]:
    """Failed first (errors, then invariants), then the costliest for the config's first
    provider, then the most tokens sent; the id breaks ties, so the order is stable."""
    failed = 0 if result.errors else 1 if result.invariant is not None else 2
    cost = result.providers[0].cost if result.providers else 0.0
    return (failed, -cost, -result.tokens_sent, result.conversation)


def worst_results(run: ReplayRun, n: int = WORST) -> dict[str, list[ReplayResult]]:
    """Per config (in the run's order), its ``n`` worst results."""
    out: dict[str, list[ReplayResult]] = {c.name: [] for c in run.configs}
    for r in run.results:
        out[r.config].append(r)
    return {name: sorted(rows, key=_rank)[:n] for name, rows in out.items()}


def _why(result: ReplayResult) -> str:
    if result.errors:
        e = result.errors[0]
        return f"error at turn {e.turn}: {e.type}: {e.message}"
    if result.invariant is not None:
        inv = result.invariant
        return f"invariant {inv.invariant} broke at turn {inv.turn}: {inv.message}"
    facts = [f"{result.tokens_sent:,} tokens sent"]
    if result.providers:
        p = result.providers[0]
        money = f"${p.usd:,.4f}" if p.usd is not None else f"{p.cost:,.0f} input-token equivalents"
        share = p.cached_tokens / p.input_tokens if p.input_tokens else 0.0
        facts.append(f"{p.provider} cost {money}, {share:.0%} cached (simulated by its rules)")
    return "; ".join(facts)


def _slug(text: str, limit: int = 40) -> str:
    """A file-name-safe piece of ``text`` (ids are paths or store ids: anything goes)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[:limit] or "conversation"


def _write(path: Path, text: str) -> None:
    """Write atomically (a reader never sees half a page)."""
    write_atomic(path, text, option="--report")


def conversation_page(recording: Recording, config: ReplayConfig) -> tuple[str, int] | None:
    """The conversation report of ``recording`` replayed under ``config`` (the turns
    before a failing one), with its turn count; None when no turn replays."""
    try:
        script, _ = _script(recording)
        conv = _conversation(script, config)
    except Exception:
        return None
    errors: list[ReplayError] = []
    envelopes: list[Envelope] = list(_run_turns(script, conv, errors))
    if not envelopes:
        return None
    # Under the config's layout and framing, so the page's figures are its row's.
    trace = annotate_trace(
        trace_document(envelopes, conv.counter),
        envelopes,
        conv.counter,
        conversation_id=recording.id,
        layout=config.layout,  # type: ignore[arg-type]
        budget=conv.budget,
    )
    trace = {"conversation_id": recording.id, **trace}
    title = f"Lamina report: {recording.id} under config {config.name}"
    return render_report(trace, report_blocks(envelopes), title=title), len(envelopes)


@attrs.frozen
class ReplayReport:
    """What ``write_replay_report`` wrote: the page, and the conversation reports."""

    path: Path
    pages: tuple[Path, ...]


def write_replay_report(
    run: ReplayRun, corpus: Corpus, path: str | Path, *, worst: int = WORST
) -> ReplayReport:
    """Write the run's HTML report at ``path`` and, per config, the reports of its
    ``worst`` worst conversations into ``<stem>_files/`` beside it."""
    if worst < 0:
        raise ConfigError("--worst", f"must be 0 or more, got {worst}")
    out = Path(path).resolve()
    folder = out.with_name(f"{out.stem}_files")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("--report", f"cannot write {out}: {exc}") from None
    recordings = {r.id: r for r in corpus.recordings}
    configs = {c.name: (i, c) for i, c in enumerate(run.configs, start=1)}
    links: dict[str, list[dict[str, Any]]] = {}
    pages: list[Path] = []
    for name, results in worst_results(run, worst).items():
        index, config = configs[name]
        items: list[dict[str, Any]] = []
        for rank, result in enumerate(results, start=1):
            href = None
            recording = recordings.get(result.conversation)
            page = None if recording is None else conversation_page(recording, config)
            if page is not None:
                if not pages:
                    folder.mkdir(exist_ok=True)
                file = folder / f"{index}-{rank}-{_slug(result.conversation)}.html"
                _write(file, page[0])
                pages.append(file)
                href = urllib.parse.quote(f"{folder.name}/{file.name}")
            items.append({"conversation": result.conversation, "why": _why(result), "href": href})
        links[name] = items
    html = render_replay_report(
        [r.to_json() for r in run.results],
        summarize(run).to_json(),
        links,
        title=f"Lamina replay: {run.conversations} conversations x {len(run.configs)} configs",
    )
    _write(out, html)
    return ReplayReport(out, tuple(pages))
