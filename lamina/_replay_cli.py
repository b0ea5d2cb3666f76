"""``lamina replay``: the policy lab's command (registered on the ``lamina`` CLI group)."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import IO

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from lamina._config import load_config
from lamina._corpus import find_corpus
from lamina._engines import ENGINES, make_engine
from lamina._replay import ReplayResult, replay
from lamina._replay_report import write_replay_report
from lamina._summary import summarize
from lamina.pipeline.errors import ConfigError

__all__ = ["replay_command"]


@click.command("replay")
@click.argument("corpus", nargs=-1)
@click.option(
    "--config",
    "config_paths",
    multiple=True,
    required=True,
    type=click.Path(dir_okay=False),
    help="A config file (YAML/JSON); repeat to compare configs.",
)
@click.option("--engine", type=click.Choice(ENGINES), default="local", show_default=True)
@click.option("--workers", type=int, help="Processes (local) or workers (dask); default: cores.")
@click.option("--address", help="An existing Dask scheduler, e.g. tcp://10.0.0.5:8786.")
@click.option(
    "--out", type=click.Path(dir_okay=False), help="Results file: one JSON line per result."
)
@click.option("--store", "store_path", help="Also replay every conversation of this store.")
@click.option(
    "--vault", type=click.Path(file_okay=False), help="Vault of conversations that name none."
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON, not a table.")
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False),
    help="Also write the run's HTML report here (and its worst conversations' reports "
    "into <name>_files/ beside it).",
)
@click.option(
    "--worst",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="Worst conversations per config to report on (with --report).",
)
def replay_command(
    corpus: tuple[str, ...],
    config_paths: tuple[str, ...],
    engine: str,
    workers: int | None,
    address: str | None,
    out: str | None,
    store_path: str | None,
    vault: str | None,
    as_json: bool,
    report_path: str | None,
    worst: int,
) -> None:
    """Replay recorded conversations (a folder or list file of scripts and transcripts,
    and/or a --store) under each --config; per conversation and config: tokens, cache and
    cost per provider, decisions, invariant checks, errors; then a summary per config.

    Results stream to OUT.partial as conversations finish; when the run ends they are
    sorted into --out (replaced whole: a failed run leaves an earlier file as it was), so
    the file is byte-identical for every engine and worker count. --report writes one
    self-contained HTML page: per config a chart over the corpus (tokens sent, cached
    share, cost per conversation) and links to its worst conversations' own reports.

    Exit status 0 when at least one conversation replayed without an error, 1 when none
    did (results and summary are written either way), 2 for a usage or config error.
    """
    if not corpus and store_path is None:
        raise ConfigError("corpus", "give a corpus folder or list file, or --store")
    configs = [load_config(p) for p in config_paths]
    found = find_corpus(corpus, store=store_path, vault=vault)
    runner = make_engine(engine, workers, address)
    err = Console(stderr=True)
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        stream: IO[str] | None = None
        if out is not None:
            # Results stream to OUT.partial; OUT itself is replaced whole when the run ends,
            # so a failed or interrupted run never clobbers an earlier results file.
            try:
                stream = stack.enter_context(
                    Path(f"{out}.partial").open(
                        "w", encoding="utf-8", errors="backslashreplace"
                    )
                )
            except OSError as exc:
                raise ConfigError("--out", f"cannot write {out}: {exc.strerror or exc}") from None
        with Progress(
            TextColumn(f"replay ({runner.name})"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            transient=True,
        ) as progress:
            bar = progress.add_task("replay", total=len(found))

            def finished(batch: tuple[ReplayResult, ...]) -> None:
                if stream is not None:
                    stream.write("".join(r.line() + "\n" for r in batch))
                    stream.flush()
                progress.advance(bar)

            run = replay(found, configs, engine=runner, on_result=finished)
    seconds = time.perf_counter() - started
    if out is not None:
        run.write(out)
        Path(f"{out}.partial").unlink(missing_ok=True)
    summary = summarize(run)
    if as_json:
        click.echo(json.dumps(summary.to_json(), indent=2, sort_keys=True))
    else:
        console = Console()
        Console(width=max(console.width, 160) if not console.is_terminal else None).print(
            summary.table()
        )
    if report_path is not None:
        written = write_replay_report(run, found, report_path, worst=worst)
        where = f"; {len(written.pages)} conversation reports" if written.pages else ""
        click.echo(
            f"report: {written.path} ({len(found)} conversations x {len(configs)} configs"
            f"{where})",
            err=as_json,
        )
    rate = len(found) / seconds if seconds else 0.0
    err.print(
        f"{len(found)} conversations x {len(configs)} configs in {seconds:.1f} s "
        f"({rate:.1f} conversations/s, engine {runner.name})",
        highlight=False,
    )
    if not any(not r.errors for r in run.results):
        # Every result is written and summarized; a script still learns the run failed.
        err.print("lamina replay: no conversation replayed without an error", highlight=False)
        raise click.exceptions.Exit(1)
