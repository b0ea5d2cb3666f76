"""The ``lamina`` command: demo, run, resume, export, import.

Any LaminaError is one line on stderr, exit 2.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.resources
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

import lamina.pipeline as pipeline
from lamina._budgets import NeedsWindow, budget_of
from lamina._files import write_atomic
from lamina._host import (
    Conversation,
    import_transcript,
    load_conversation,
    rebuild_envelope,
    rebuild_envelopes,
)
from lamina._replay_cli import replay_command
from lamina._script import Script, load_script, parse_script, run_saved, run_script
from lamina.pipeline import Budget, Envelope, LaminaError, SourceResolver
from lamina.pipeline.errors import ConfigError, ScriptError
from lamina.pipeline.store import PostgresStore, SqliteStore
from lamina.pipeline.tokens import TOKENIZERS
from lamina.renderers import (
    PREVIOUS_NOT_REBUILT,
    SENT_BANDS,
    listed_segments,
    sent_rows,
    settle_turns,
)

__all__ = ["main"]

DEMO_SCRIPT: dict[str, Any] = {
    "system": {
        "stable": (
            "You are Lamina's demo assistant. Answer from the attached context; cite note paths."
        ),
        "mutable": "User memory: prefers short answers with bullet points.",
    },
    "turns": [
        {
            "user": "Summarize this",
            "attach": [{"note": "project-spec.md"}],
            "reply": "The spec describes the product, its goals and milestones.",
        },
        {
            "user": "What endpoints does the API support?",
            "attach": [{"note": "project-spec.md"}, {"note": "docs/api-docs.md"}],
            "reply": "The API lists its endpoints in docs/api-docs.md.",
        },
        {
            "user": "Explain the auth flow from the spec",
            "attach": [{"note": "project-spec.md"}],
            "reply": "Devices sign in with short-lived tokens; see docs/auth.md.",
        },
        {
            "user": "What did the design review and the talk decide about offline sync?",
            "attach": [
                {"folder": "meetings"},
                {"tag": "#project/lamina"},
                {"pdf": "media/sync-design-review.pdf"},
                {
                    "youtube": "https://youtu.be/Fb5yncT4lk1",
                    "transcript": "media/offline-sync-talk.vtt",
                },
                {
                    "selection": "Conflicts are kept as two versions until a person resolves them.",
                    "source": "project-spec.md",
                },
            ],
            "reply": "Offline edits sync when a device reconnects; conflicts keep two versions.",
        },
        {
            # Nothing new attached: turn 4's context moves into the library (the prefix
            # grows once) ...
            "user": "Which of these should I read first?",
            "reply": "Start with the spec, then the design review.",
        },
        {
            # ... and from then on the steady state: the request repeats the last one's
            # prefix and a provider's prompt cache serves most of it.
            "user": "And who owns the open questions?",
            "reply": "Priya Raman owns the spec's open questions.",
        },
    ],
}
DEMO_SITE_PORT = 47231
DEMO_REPORT = "lamina-demo-report.html"


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access log on the demo's screen."""


@contextlib.contextmanager
def _demo_site(root: Path) -> Iterator[str | None]:
    """Serve the demo site folder on 127.0.0.1 (a fixed port, so the trace is stable) for the demo.

    Another demo may hold the port for a moment: wait for it (up to ~5 s) before trying the
    next ports. Yields the base URL, or None when no port could be had (the page is skipped).
    """
    handler = functools.partial(_QuietHandler, directory=str(root))
    ports = [DEMO_SITE_PORT] * 50 + list(range(DEMO_SITE_PORT + 1, DEMO_SITE_PORT + 5))
    for attempt, port in enumerate(ports):
        try:
            server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        except OSError:
            if attempt < 50:
                time.sleep(0.1)
            continue
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.shutdown()
            server.server_close()
        return
    yield None


# The demo's budget is small on purpose, so that turn 4 shows the budget at work.
DEMO_BUDGET = Budget(context_window=4800, reserve_output=1000)


@contextlib.contextmanager
def demo_data() -> Iterator[Path]:
    """The demo's material (``vault/`` and ``site/``), shipped inside the package as
    ``lamina/_demo`` and found through importlib.resources, so ``lamina demo`` works from
    any folder after a plain install (the repository's ``examples/vault`` links to it)."""
    with importlib.resources.as_file(importlib.resources.files("lamina") / "_demo") as path:
        yield path


def _conversation(
    script: Script,
    vault: str | None,
    tokenizer: str | None,
    budget: Budget | None = None,
    *,
    allow_private_network: bool = False,
    defer_library: bool | None = None,
) -> Conversation:
    """The script's conversation; ``defer_library`` (the flag) overrides the script's."""
    root = Path(vault) if vault else script.vault
    _check_vault(root, vault, script.path)
    sources = _sources(root, allow_private_network)
    conv = Conversation(
        script.system,
        sources=sources,
        tokenizer=tokenizer or "",
        budget=budget,
        defer_library=script.defer_library if defer_library is None else defer_library,
    )
    # A broken plugin is skipped by the registry; say so, one line each, and carry on.
    for error in getattr(getattr(conv.sources, "registry", None), "plugin_errors", ()):
        click.echo(f"lamina: warning: {' '.join(str(error).split())}", err=True)
    return conv


def _check_vault(root: Path | None, flag: str | None, origin: str) -> None:
    """A vault folder that does not exist is named where it came from: the --vault flag,
    or the script's (or saved chat's) ``vault:``."""
    if root is None or root.is_dir():
        return
    if flag:
        raise ConfigError("--vault", f"folder {root} does not exist")
    raise ScriptError(origin, "vault", f"vault folder {root} does not exist")


def _sources(root: Path | None, allow_private_network: bool) -> SourceResolver:
    """The CLI's processors: the vault (if any) and the network permission."""
    from lamina.processors import ProcessContext, Sources, Vault

    vault = None if root is None else Vault(root)
    return Sources(context=ProcessContext(vault=vault, allow_private_network=allow_private_network))


def _budget(
    window: int | None, reserve: int | None, model: str | None, recall: bool | None = None
) -> Budget | None:
    """A budget from --model (its profile) and/or --window/--reserve (and --recall or
    --no-recall); None if none given (``budget_of``, the rule the server and replay share)."""
    try:
        return budget_of(window, reserve, model, recall)
    except NeedsWindow as exc:
        raise ConfigError(f"--{exc.setting}", "needs --window or --model") from None


F = TypeVar("F", bound=Callable[..., Any])


def network_option(fn: F) -> F:
    """--allow-private-network: let URLs reach loopback and private addresses."""
    return click.option(
        "--allow-private-network",
        is_flag=True,
        help="Allow URLs on loopback, private and link-local addresses (refused by default).",
    )(fn)


def tokenizer_option(fn: F) -> F:
    """--tokenizer: the token encoding, when not the --model's."""
    return click.option(
        "--tokenizer",
        type=click.Choice(TOKENIZERS),
        help="Token encoding [default: the --model's, else o200k_base].",
    )(fn)


def messages_option(fn: F) -> F:
    """--messages: whose request messages the human output prints."""
    return click.option(
        "--messages",
        type=click.Choice(["last", "all", "none"]),
        default="last",
        show_default=True,
        help="Print the request's messages for the last turn, every turn, or none.",
    )(fn)


def verbose_option(fn: F) -> F:
    """--verbose: add the budget's settings (the objective's, the headroom) to each turn."""
    return click.option(
        "--verbose", "-v", is_flag=True, help="Also print each turn's budget settings."
    )(fn)


def layout_option(fn: F) -> F:
    """--defer-library/--no-defer-library: the layout the requests are sent in."""
    return click.option(
        "--defer-library/--no-defer-library",
        default=None,
        help="Defer the library's growth to the next prefix break (the default), or grow it "
        "every turn (the seed's layout); overrides the script's defer_library.",
    )(fn)


def budget_options(fn: F) -> F:
    """--window, --reserve and --model: the whole-payload token budget."""
    fn = click.option("--model", help="Model profile for the budget (window, reserve, framing).")(
        fn
    )
    fn = click.option(
        "--reserve", type=int, help="Tokens kept free for the reply (default min(4096, window/4))."
    )(fn)
    fn = click.option("--window", type=int, help="Context window in tokens: enforce a budget.")(fn)
    fn = click.option(
        "--recall/--no-recall",
        default=None,
        help="Earlier messages the suffix of history does not show are findable: the budget "
        "may send those the query matches (on by default with a budget; docs/BUDGET.md).",
    )(fn)
    return fn


def _trace(
    envelopes: Sequence[Envelope],
    conv: pipeline.Conversation,
    *,
    provider: str | None = None,
    model: str | None = None,
    conversation_id: str | None = None,
    timings: bool = False,
) -> dict[str, Any]:
    """The JSON trace, with per-turn "cache" reports and, given a provider, "request"."""
    from lamina.renderers import annotate_trace, trace_document

    trace = trace_document(envelopes, conv.counter, budget=conv.budget, timings=timings)
    return annotate_trace(
        trace,
        envelopes,
        conv.counter,
        provider=provider,
        model=model,
        conversation_id=conversation_id,
        budget=conv.budget,  # counted as the budget counts the request, framing included
    )


def _write_report(
    path: Path, trace: dict[str, Any], envelopes: Sequence[Envelope], title: str
) -> Path:
    """Write the HTML report (renderers.render_report) atomically; returns its absolute path."""
    from lamina.renderers import render_report, report_blocks

    html = render_report(trace, report_blocks(envelopes), title=title)
    path = path.resolve()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("--out", f"cannot write {path}: {exc.strerror or exc}") from None
    return write_atomic(path, html)


def _warn(env: Envelope) -> None:
    """A turn's warnings on stderr, one line each: the human output never drops them."""
    for w in env.report.warnings:
        click.echo(f"lamina: warning: turn {env.turn}: {w}", err=True)


def _intro(console: Console, budget: Budget) -> None:
    """What the demo is about to show, before its first turn."""
    console.print(
        "[bold]Lamina demo[/bold]: six turns of a chat over a small notes vault. Each turn "
        "shows the request Lamina sends, band by band (L1 system, L2 the library of context "
        "attached earlier, deferred: context still in the earlier user message that attached "
        "it until the library next grows, L3 this turn's context, L4 history, L5 the "
        "question, framing), their tokens, what the budget decided and how much of the "
        "request repeats the previous one (what a provider's prompt cache serves at a "
        "discount). "
        f"The window is {budget.context_window:,} tokens with {budget.reserve_output:,} kept "
        "for the reply, small on purpose, so turn 4 shows the budget at work.\n",
        soft_wrap=True,
    )


def _next_steps(console: Console) -> None:
    """What to try after the demo."""
    console.rule("[bold]Next[/bold]")
    console.print(
        "  lamina demo --full                   every message in full\n"
        "  lamina inspect examples/chat30.yaml  per turn: each artifact's layer, form, tokens\n"
        "  lamina run examples/chat30.yaml --window 6000   a 30-turn chat under a budget\n"
        "  lamina simulate examples/chat30.yaml cache cost per provider and layout\n"
        "  In Python: see the README's quickstart (lamina.Conversation).",
        markup=False,
        soft_wrap=True,
    )


def _heading(env: Envelope) -> str:
    """'Turn N: query', without saying 'Turn N:' twice when the query starts with it."""
    query = " ".join(env.query.split())
    if query.lower().startswith(f"turn {env.turn}:"):
        return f"[bold]Turn {env.turn}[/bold]:{query[len(f'turn {env.turn}:'):]}"
    return f"[bold]Turn {env.turn}[/bold]: {query}"


def _plural(n: int, word: str) -> str:
    """'1 decision', '2 decisions'."""
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def _request_line(turn: Mapping[str, Any], budget: pipeline.BudgetReport | None) -> str:
    """The request as sent in one line: its bands adding up to its one total, and the
    room the budget's limit leaves beside it."""
    total = int(turn["tokens_total"])
    bands = turn.get("sent") or {}
    parts = "  ".join(f"{name}={int(bands[name])}" for name in SENT_BANDS if name in bands)
    line = f"request: {parts}  = {total} tokens sent"
    if budget is not None:
        line += (
            f"; limit {budget.limit} (window {budget.window} - reserve "
            f"{budget.reserve_output}), headroom {budget.limit - total}"
        )
    return line


def _plan(console: Console, budget: pipeline.BudgetReport | None) -> None:
    """The budget's settings (the objective's, the headroom in tokens), for --verbose."""
    if budget is not None and budget.plan:
        plan = ", ".join(f"{name} {value}" for name, value in budget.plan)
        console.print(f"budget settings: {plan}", markup=False, soft_wrap=True)


def _sent_table(env: Envelope, *, decisions: Mapping[str, Sequence[str]] | None = None) -> Table:
    """The request's blocks as sent, band by band (``renderers.sent_rows``); a long history
    is one row (`lamina inspect` lists every message)."""
    columns = ["band", "key", "form", "tokens", *(["decisions"] if decisions is not None else [])]
    table = Table(show_lines=False)
    for col in columns:
        table.add_column(col, justify="right" if col == "tokens" else "left")
    rows = sent_rows(env)
    history = [r for r in rows if r.band == "L4"]
    for band in SENT_BANDS[:-1]:
        mine = [r for r in rows if r.band == band]
        if band == "L4" and len(history) > 4 and decisions is None:
            tokens = sum(r.tokens or 0 for r in history)
            table.add_row("L4", f"({len(history)} history messages)", "text", str(tokens))
            continue
        for r in mine:
            notes = [] if decisions is None else ["; ".join(decisions.get(r.key, []))]
            table.add_row(band, r.key, r.form, "-" if r.tokens is None else str(r.tokens), *notes)
        if not mine and band != "deferred":
            table.add_row(band, "(empty)", "", "0", *([""] if decisions is not None else []))
    return table


def _show(
    console: Console,
    envelopes: Sequence[Envelope],
    conv: pipeline.Conversation,
    full: bool,
    trace: Mapping[str, Any],
    messages_shown: str = "all",
    verbose: bool = False,
) -> None:
    """Each turn's request as sent (its bands and blocks), the budget's room, decisions,
    messages and the cached prefix with the reason it is not more; then a summary of the
    chat. ``messages_shown``: the request's messages for "all" turns, the "last" one only,
    or "none"; ``verbose`` adds the budget's settings."""
    turns: Sequence[Mapping[str, Any]] = trace["turns"]
    for index, (env, turn) in enumerate(zip(envelopes, turns, strict=True)):
        total = int(turn["tokens_total"])
        console.rule(_heading(env))
        console.print(_sent_table(env))
        budget = env.report.budget
        console.print(_request_line(turn, budget), markup=False, soft_wrap=True)
        if verbose:
            _plan(console, budget)
        for d in env.report.decisions:
            console.print(
                f"  decision {d.stage}: {d.target} {d.from_form} -> {d.to_form} ({d.reason})",
                markup=False,
                soft_wrap=True,
            )
        _warn(env)
        last = index == len(envelopes) - 1
        if messages_shown == "all" or (messages_shown == "last" and last):
            from lamina.renderers import openai_messages

            console.print("[bold]request[/bold]")
            for m in openai_messages(env):
                content = m["content"]
                lines = content.splitlines()
                if not full and len(lines) > 24:
                    content = (
                        "\n".join(lines[:24])
                        + f"\n… ({len(lines) - 24} more lines; --full shows all)"
                    )
                console.print(f"[cyan]{m['role']}[/cyan]:")
                console.print(content, markup=False, highlight=False, soft_wrap=True)
        cache = turn.get("cache") or {}
        cached = min(int(cache.get("common_prefix_tokens", 0)), total)
        share = f"{cached / total:.0%}" if total else "0%"
        console.print(
            f"[bold green]cached prefix[/bold green]: {cached} of {total} tokens repeat the "
            f"previous turn's request ({share}, predicted)",
            soft_wrap=True,
        )
        if cache.get("sentence"):
            console.print(f"  why: {cache['sentence']}", markup=False, soft_wrap=True)
    _summary(console, envelopes, turns)


def _summary(
    console: Console, envelopes: Sequence[Envelope], turns: Sequence[Mapping[str, Any]]
) -> None:
    """One paragraph over the whole chat: tokens sent, the cached share, breaks and cuts."""
    if len(envelopes) < 2:
        return
    sent = sum(int(t["tokens_total"]) for t in turns)
    cached = sum(
        min(int((t.get("cache") or {}).get("common_prefix_tokens", 0)), int(t["tokens_total"]))
        for t in turns
    )
    breaks = [
        int(t["turn"])
        for t in turns
        if (t.get("cache") or {}).get("break_reason")
        not in (None, "first-turn", PREVIOUS_NOT_REBUILT)
    ]
    cut = [env.turn for env in envelopes if env.report.budget and env.report.budget.decisions]
    decisions = sum(len(env.report.decisions) for env in envelopes)
    console.rule("[bold]Summary[/bold]")
    share = f"{cached / sent:.0%}" if sent else "0%"
    console.print(
        f"{_plural(len(envelopes), 'turn')}: {sent:,} input tokens sent, {cached:,} of them a "
        f"prefix repeated from the turn before ({share}: what a provider's prompt cache can "
        f"serve); {_plural(len(breaks), 'prefix break')}"
        + (f" ({'turn' if len(breaks) == 1 else 'turns'} {', '.join(map(str, breaks))})"
           if breaks else "")
        + f"; {_plural(decisions, 'decision')}; the budget cut in "
        + (_plural(len(cut), "turn") if cut else "no turn")
        + ".",
        soft_wrap=True,
    )


def _baseline(
    console: Console, envelopes: Sequence[Envelope], conv: pipeline.Conversation
) -> None:
    """The same turns in each layout (OpenAI's cache rules, ``lamina simulate``): the
    claim beside its baseline."""
    from lamina.renderers import NAIVE_NOTE, format_baseline, simulate

    sim = simulate(envelopes, counter=conv.counter, budget=conv.budget, providers=("openai",))
    console.rule("[bold]Against other layouts[/bold]")
    console.print(
        "The same turns sent in each layout, with OpenAI's cache rules (`lamina simulate` "
        "shows every provider); cost is the input cost with cache prices over the naive "
        "layout's input sent uncached:",
        soft_wrap=True,
    )
    console.print(format_baseline(sim), markup=False, highlight=False, soft_wrap=True)
    console.print(
        "default is what Lamina sends; append-only keeps each attachment in the user message "
        "that brought it, so it caches the most but cannot shrink under a budget. "
        + NAIVE_NOTE,
        markup=False,
        soft_wrap=True,
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lamina", message="%(prog)s %(version)s")
def cli() -> None:
    """Lamina: build each LLM chat turn's prompt from typed context artifacts."""


@cli.command()
@click.option(
    "--vault",
    type=click.Path(file_okay=False),
    help="Vault folder (default: the example vault shipped with Lamina).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the JSON trace instead of tables.")
@click.option("--full", is_flag=True, help="Show whole messages, not the first lines.")
@tokenizer_option
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False),
    help="Where to write the HTML report (default: lamina-demo-report.html in the temp folder).",
)
@budget_options
@verbose_option
def demo(
    vault: str | None,
    as_json: bool,
    full: bool,
    tokenizer: str | None,
    report_path: str | None,
    window: int | None,
    reserve: int | None,
    model: str | None,
    recall: bool | None,
    verbose: bool,
) -> None:
    """Six turns over the example vault: the layer walkthrough, a turn over budget, then
    the steady state.

    Turn 1 attaches project-spec.md; turn 2 keeps it and adds docs/api-docs.md; turn 3
    keeps only the spec; turn 4 attaches a folder, a tag (its notes overlap the folder
    and the library: dedup and references), a PDF, a video transcript, a selection and a
    web page (served from the shipped demo site on 127.0.0.1), more than the demo's 4,800-token
    window holds, so the budget cuts; turns 5 and 6 attach nothing: turn 4's context joins
    the library once, then most of the request is the cached prefix. Ends by writing the
    conversation's HTML report (`lamina report`), printing its path and what to try next.
    """
    with demo_data() as shipped:
        _demo(
            shipped, vault, as_json, full, tokenizer, report_path, window, reserve, model, recall,
            verbose,
        )


def _demo(
    shipped: Path,
    vault: str | None,
    as_json: bool,
    full: bool,
    tokenizer: str | None,
    report_path: str | None,
    window: int | None,
    reserve: int | None,
    model: str | None,
    recall: bool | None,
    verbose: bool = False,
) -> None:
    root = Path(vault) if vault else shipped / "vault"
    budget = _budget(window, reserve, model, recall) or DEMO_BUDGET
    with _demo_site(root.parent / "site") as site:
        data = copy.deepcopy(DEMO_SCRIPT)
        if site is not None:
            data["turns"][3]["attach"].append({"url": f"{site}/offline-sync-faq.html"})
        script = parse_script(data, "demo")
        conv = _conversation(script, str(root), tokenizer, budget, allow_private_network=True)
        envelopes = run_script(script, conv)
    trace = _trace(envelopes, conv)
    if as_json:
        click.echo(_json(trace))
    else:
        _intro(Console(), budget)
        _show(Console(), envelopes, conv, full, trace, verbose=verbose)
        _baseline(Console(), envelopes, conv)
    out = Path(report_path) if report_path else Path(tempfile.gettempdir()) / DEMO_REPORT
    written = _write_report(out, trace, envelopes, "Lamina demo")
    if not as_json:
        _next_steps(Console())
    # With --json, stdout holds only the trace.
    click.echo(f"report: {written} (the whole conversation on one HTML page)", err=as_json)


@cli.command()
@click.argument("script_path", metavar="SCRIPT")
@click.option(
    "--vault", type=click.Path(file_okay=False), help="Vault folder (overrides the script's)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the JSON trace (the public format).")
@click.option("--full", is_flag=True, help="Show whole messages, not the first lines.")
@messages_option
@tokenizer_option
@click.option(
    "--store", "store_path", help="Save every turn here: a SQLite file, or a postgresql:// URL."
)
@click.option("--conversation", "conversation_id", help="Id for the saved conversation.")
@click.option(
    "--provider",
    type=click.Choice(["openai", "openai-responses", "anthropic", "gemini"]),
    help="Add each turn's request body for this provider to the JSON trace.",
)
@click.option(
    "--timings", is_flag=True, help="Add per-phase timings and cache meters (not stable)."
)
@budget_options
@layout_option
@verbose_option
@network_option
def run(
    script_path: str,
    vault: str | None,
    as_json: bool,
    full: bool,
    messages: str,
    tokenizer: str | None,
    store_path: str | None,
    conversation_id: str | None,
    provider: str | None,
    timings: bool,
    window: int | None,
    reserve: int | None,
    model: str | None,
    recall: bool | None,
    defer_library: bool | None,
    verbose: bool,
    allow_private_network: bool,
) -> None:
    """Run a scripted conversation (JSON or YAML); with --store, persist as it goes.

    --window/--reserve (or --model's profile) enforce a whole-payload budget; --provider
    adds the exact request body per turn (model from --model, else a default per provider).

    \b
    SCRIPT (YAML shown; JSON has the same keys):
      system: You are terse.           # or {stable: ..., mutable: ...}
      vault: vault                     # notes folder, relative to the script
      defer_library: true              # false: grow the library every turn (the seed's layout)
      turns:
        - user: Summarize this         # the turn's query (L5)
          attach:                      # this turn's context (L3), any of:
            - note: project-spec.md
            - folder: docs             # its notes, sorted
            - tag: "#project"          # the notes carrying the tag
            - url: https://example.com/a
            - pdf: papers/x.pdf        # pages: "1-3,7"
            - youtube: https://youtu.be/ID   # transcript: talk.vtt
            - selection: x = 1         # source: a.py, lines: [3, 9]
          reply: It is a sync spec.    # the assistant's answer, kept in history (L4)
          vault_changes: {docs/a.md: new text}     # notes edited before the turn
          tools: [{name: grep, args: {q: x}, result: "..."}]   # tool results
    Example: examples/chat30.yaml (30 turns over examples/vault).
    """
    script = load_script(script_path)
    conv = _conversation(
        script,
        vault,
        tokenizer,
        _budget(window, reserve, model, recall),
        allow_private_network=allow_private_network,
        defer_library=defer_library,
    )
    if store_path is None:
        if conversation_id is not None:
            raise ScriptError(script.path, "", "--conversation needs --store")
        envelopes = run_script(script, conv)
        trace = _trace(envelopes, conv, provider=provider, model=model, timings=timings)
    else:
        from lamina._hub import now_stamp
        from lamina.pipeline.store import ConversationInfo, new_conversation_id, open_store

        cid = conversation_id or new_conversation_id()
        root = Path(vault) if vault else script.vault
        with open_store(store_path) as store:
            store.create(
                ConversationInfo(
                    cid, now_stamp(), vault="" if root is None else str(root.resolve())
                )
            )
            envelopes = run_saved(script, conv, store, cid)
        trace = {
            "conversation_id": cid,
            **_trace(
                envelopes,
                conv,
                provider=provider,
                model=model,
                conversation_id=cid,
                timings=timings,
            ),
        }
    if as_json:
        click.echo(_json(trace))
    else:
        _show(Console(), envelopes, conv, full, trace, messages, verbose)


@cli.command()
@click.argument("store_path", metavar="STORE")
@click.option("--conversation", "conversation_id", required=True, help="The saved chat's id.")
@click.option("--script", "script_path", required=True, help="Script of the turns to add.")
@click.option(
    "--vault", type=click.Path(file_okay=False), help="Vault folder (default: script's, saved)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the JSON trace of the new turns.")
@click.option("--full", is_flag=True, help="Show whole messages, not the first lines.")
@messages_option
@click.option(
    "--provider",
    type=click.Choice(["openai", "openai-responses", "anthropic", "gemini"]),
    help="Add each turn's request body for this provider to the JSON trace.",
)
@budget_options
@verbose_option
@network_option
def resume(
    store_path: str,
    conversation_id: str,
    script_path: str,
    vault: str | None,
    as_json: bool,
    full: bool,
    messages: str,
    provider: str | None,
    window: int | None,
    reserve: int | None,
    model: str | None,
    recall: bool | None,
    verbose: bool,
    allow_private_network: bool,
) -> None:
    """Continue a saved chat with more scripted turns (turn numbers continue).

    The chat's saved budget applies; --window/--reserve/--model replace it for the new turns.
    """

    script = load_script(script_path)
    with _existing_store(store_path) as store:
        saved = store.conversation(conversation_id).vault
        root = Path(vault) if vault else script.vault or (Path(saved) if saved else None)
        _check_vault(root, vault, script.path if script.vault else store_path)
        budget = _budget(window, reserve, model, recall)
        saved_budget = store.load(conversation_id).budget
        sources = _sources(root, allow_private_network)
        conv = load_conversation(store, conversation_id, sources=sources, budget=budget)
        # The last saved turn as it was sent: replayed (with the budget it was built with, or
        # the flags' for stores that did not save one), or, for a turn an older Lamina saved,
        # told from its stored manifest; so the cache report compares with the real request.
        replay = budget if saved_budget is None else None
        previous = rebuild_envelope(
            store, conversation_id, sources=sources, budget=replay, as_sent=True
        )
        saved_turns = store.head(conversation_id).turn
        if script.system.stable or script.system.mutable:
            conv.set_system(script.system.stable, script.system.mutable)
        envelopes = run_saved(script, conv, store, conversation_id, previous=previous)
    shown = [previous, *envelopes] if previous is not None else envelopes
    document = _trace(shown, conv, provider=provider, model=model, conversation_id=conversation_id)
    if previous is not None:
        document["turns"] = document["turns"][1:]
    elif saved_turns and document["turns"]:
        # Not the chat's first request: say the one before it is not known.
        document["turns"][0]["cache"]["break_reason"] = PREVIOUS_NOT_REBUILT
        settle_turns(document["turns"])
    trace = {"conversation_id": conversation_id, **document}
    if as_json:
        click.echo(_json(trace))
    else:
        _show(Console(), envelopes, conv, full, trace, messages, verbose)


@cli.command("export")
@click.argument("store_path", metavar="STORE")
@click.option("--conversation", "conversation_id", required=True, help="The saved chat's id.")
@click.option("--out", type=click.Path(dir_okay=False), help="Write here instead of stdout.")
def export_cmd(store_path: str, conversation_id: str, out: str | None) -> None:
    """Export a saved chat as a markdown transcript."""
    from lamina._host import export_transcript

    with _existing_store(store_path, read_only=True) as store:
        text = export_transcript(store, conversation_id)
    if out is None:
        click.echo(text, nl=False)
        return
    write_atomic(out, text)


@cli.command("import")
@click.argument("transcript_path", metavar="TRANSCRIPT")
@click.option(
    "--store", "store_path", required=True, help="Store to import into (file or postgresql:// URL)."
)
@click.option("--vault", type=click.Path(file_okay=False), required=True, help="Vault folder.")
@click.option("--allow-fetch", is_flag=True, help="Fetch URLs and videos again.")
@click.option("--conversation", "conversation_id", help="Id for the imported chat.")
def import_cmd(
    transcript_path: str,
    store_path: str,
    vault: str,
    allow_fetch: bool,
    conversation_id: str | None,
) -> None:
    """Import a markdown transcript (Lamina's, or the Obsidian plugin's Lamina began as) into
    a store."""
    from lamina.pipeline.errors import ChatTranscriptError
    from lamina.pipeline.inputs import FileProblem, read_regular
    from lamina.pipeline.store import open_store

    try:
        text = read_regular(transcript_path, 64_000_000).decode("utf-8")
    except FileProblem as exc:
        raise ChatTranscriptError(transcript_path, 0, f"cannot read: {exc.detail}") from None
    except UnicodeDecodeError as exc:
        raise ChatTranscriptError(transcript_path, 0, f"cannot read: {exc}") from None
    if not Path(vault).is_dir():
        raise ScriptError(transcript_path, "vault", f"vault folder {vault} does not exist")
    with open_store(store_path) as store:
        report = import_transcript(
            text,
            store,
            vault=vault,
            allow_fetch=allow_fetch,
            conversation_id=conversation_id,
            path=transcript_path,
        )
    click.echo(f"imported conversation {report.conversation_id}: {report.turns} turns")
    for problem in report.problems:
        click.echo(f"not rebuilt: {problem}")


@cli.command()
@click.argument("script_path", metavar="SCRIPT")
@click.option(
    "--vault", type=click.Path(file_okay=False), help="Vault folder (overrides the script's)."
)
@click.option("--json", "as_json", is_flag=True, help="Per layout and provider, per turn, as JSON.")
@tokenizer_option
@budget_options
@network_option
def simulate(
    script_path: str,
    vault: str | None,
    as_json: bool,
    tokenizer: str | None,
    window: int | None,
    reserve: int | None,
    model: str | None,
    recall: bool | None,
    allow_private_network: bool,
) -> None:
    """Cache cost of a script per provider: default vs batched vs append-only vs naive.

    \b
    Columns, summed over the script's turns (the cache assumed warm all along):
      layout         default (Lamina's five layers, the library's growth deferred to
                     the next break, as the conversation sends it), batched (the same
                     deferral computed from the envelopes: equal to the default unless
                     the conversation grows the library every turn), append-only
                     (context stays in the user message that attached it; ignores a
                     budget) or naive (every attachment so far re-sent in full, each
                     turn)
      input          input tokens sent
      cached         of them, tokens the provider's prompt cache would serve
      cached%        cached / input
      cost/uncached  input cost with the provider's cache prices, relative to sending
                     the same tokens uncached (1.000 = no saving; cache writes can cost more)
      cost/naive     this layout's input cost relative to the naive layout's input
                     sent uncached
      largest        the largest request's input tokens
      over           (with --window or --model) requests over the limit (window - reserve)
    """
    from lamina.renderers import format_simulation
    from lamina.renderers import simulate as run_simulation

    script = load_script(script_path)
    conv = _conversation(
        script,
        vault,
        tokenizer,
        _budget(window, reserve, model, recall),
        allow_private_network=allow_private_network,
    )
    sim = run_simulation(run_script(script, conv), counter=conv.counter, budget=conv.budget)
    if as_json:
        click.echo(json.dumps(sim.to_json(), indent=2))
    else:
        click.echo(format_simulation(sim))
        click.echo(
            "\ninput and cached are tokens over all turns; cached% = cached / input; "
            "cost/uncached = input cost with cache prices / the same tokens uncached; "
            "cost/naive = cost / the naive layout's input uncached; largest = the largest "
            "request's input tokens"
            + ("; over = requests over the limit (window - reserve)" if sim.limit else "")
            + ". `lamina simulate --help` says more."
        )


@cli.command()
@click.option(
    "--scale", type=click.Choice(["small", "medium", "large"]), default="small", show_default=True
)
@click.option("--out", type=click.Path(dir_okay=False), help="Write the JSON results here.")
@click.option(
    "--budget",
    "budget_only",
    is_flag=True,
    help="Run the budget benchmarks instead: folder fitting time, attachment share by policy.",
)
@click.option(
    "--suite",
    type=click.Choice(["build", "replay", "server", "stores"]),
    default="build",
    show_default=True,
    help="build: turn latency vs peers; replay: `lamina replay` conversations/s per engine; "
    "server: 16 conversations x 20 turns over HTTP; stores: SQLite vs PostgreSQL latency "
    "and 8 writer processes.",
)
@click.option("--conversations", type=int, default=200, show_default=True, help="replay suite.")
@click.option(
    "--postgres",
    "postgres_url",
    help="stores suite: this server (default: a throwaway local cluster, if installed).",
)
def bench(
    scale: str,
    out: str | None,
    budget_only: bool,
    suite: str,
    conversations: int,
    postgres_url: str | None,
) -> None:
    """Build-latency benchmarks vs floor, naive rebuild and peers, the budget benchmarks
    (--budget), the replay engines' throughput (--suite replay) or turns over HTTP (--suite
    server); needs a source checkout."""
    import importlib

    root = Path(__file__).resolve().parents[1]
    if not (root / "benchmarks" / "run.py").is_file():
        raise ConfigError(
            "bench",
            f"needs a source checkout of Lamina ({root / 'benchmarks'} not found: the "
            "benchmarks are not installed with the package); run it from the repository",
        )
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    if budget_only:
        importlib.import_module("benchmarks.budget_fit").main(scale, out)
        return
    if suite == "stores":
        importlib.import_module("benchmarks.stores").main(scale, out, postgres_url)
        return
    if suite == "server":
        status = importlib.import_module("benchmarks.server").main(out)
    elif suite == "replay":
        status = importlib.import_module("benchmarks.replay").main(conversations, None, out)
    else:
        status = importlib.import_module("benchmarks.run").main(scale, out)
    if status:
        raise click.exceptions.Exit(status)


@cli.command()
@click.argument("script_path", metavar="SCRIPT", required=False)
@click.option(
    "--store", "store_path", help="Report a saved chat from this store (file or postgresql:// URL)."
)
@click.option("--conversation", "conversation_id", help="The saved chat's id (with --store).")
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default="report.html",
    show_default=True,
    help="The HTML file to write.",
)
@click.option(
    "--provider",
    type=click.Choice(["openai", "openai-responses", "anthropic", "gemini"]),
    help="Add each turn's request body for this provider (collapsed under the turn).",
)
@click.option(
    "--vault", type=click.Path(file_okay=False), help="Vault folder (default: script's, saved)."
)
@tokenizer_option
@budget_options
@layout_option
@network_option
def report(
    script_path: str | None,
    store_path: str | None,
    conversation_id: str | None,
    out: str,
    provider: str | None,
    vault: str | None,
    tokenizer: str | None,
    window: int | None,
    reserve: int | None,
    model: str | None,
    recall: bool | None,
    defer_library: bool | None,
    allow_private_network: bool,
) -> None:
    """Write one self-contained HTML page of a conversation: how the window filled per
    layer, the cached prefix and its breaks, the budget decisions and every artifact.

    Give a SCRIPT (run as `lamina run` would), or --store FILE --conversation ID for a
    saved chat (each turn is rebuilt from the store; the budget saved with it applies).
    The page loads nothing and runs no script: open it from disk, offline.
    """
    if (script_path is None) == (store_path is None):
        raise ConfigError("report", "give a SCRIPT or --store FILE --conversation ID")
    if script_path is not None:
        if conversation_id is not None:
            raise ConfigError("--conversation", "needs --store")
        script = load_script(script_path)
        conv: pipeline.Conversation = _conversation(
            script,
            vault,
            tokenizer,
            _budget(window, reserve, model, recall),
            allow_private_network=allow_private_network,
            defer_library=defer_library,
        )
        envelopes = run_script(script, conv)
        trace = _trace(envelopes, conv, provider=provider, model=model)
        title = f"Lamina report: {Path(script_path).name}"
    else:
        assert store_path is not None
        if conversation_id is None:
            raise ConfigError("--store", "needs --conversation ID")
        envelopes, conv = _saved_envelopes(
            store_path, conversation_id, vault, allow_private_network
        )
        trace = {
            "conversation_id": conversation_id,
            **_trace(
                envelopes, conv, provider=provider, model=model, conversation_id=conversation_id
            ),
        }
        title = f"Lamina report: conversation {conversation_id}"
    written = _write_report(Path(out), trace, envelopes, title)
    click.echo(f"report: {written} ({len(envelopes)} turns)")


def _saved_envelopes(
    store_path: str, conversation_id: str, vault: str | None, allow_private_network: bool
) -> tuple[list[Envelope], pipeline.Conversation]:
    """Every turn of a saved chat, rebuilt from the store and checked against its manifest."""

    with _existing_store(store_path, read_only=True) as store:
        saved = store.conversation(conversation_id).vault
        root = Path(vault) if vault else (Path(saved) if saved else None)
        _check_vault(root, vault, store_path)
        sources = _sources(root, allow_private_network)
        conv = load_conversation(store, conversation_id, sources=sources)
        envelopes: list[Envelope] = []
        # A turn an older Lamina saved comes from its manifest if its layers can be told.
        for k, envelope in enumerate(rebuild_envelopes(store, conversation_id, sources=sources), 1):
            if envelope is None:
                raise ScriptError(
                    store_path,
                    f"turn {k}",
                    "cannot be rebuilt as it was sent (a note changed on disk since, or an "
                    "attachment was not kept); the report needs every turn",
                )
            envelopes.append(envelope)
    if not envelopes:
        raise ScriptError(store_path, conversation_id, "the conversation has no turns")
    return envelopes, conv


def _clip(text: str, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters, cut at a word end with " …"."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    head = flat[: limit - 2]
    cut = head.rsplit(" ", 1)[0] if " " in head else head[: limit - 1]
    return f"{cut} …" if " " in head else f"{cut}…"


def _inspect_turn(
    console: Console, env: Envelope, turn: Mapping[str, Any], width: int = 48, verbose: bool = False
) -> None:
    """One turn as sent: every block with its band, form, tokens and decisions; a bar of
    the bands against the limit (or the request, without a budget)."""
    decisions: dict[str, list[str]] = {}
    for d in env.report.decisions:
        decisions.setdefault(d.target, []).append(f"{d.stage}: {d.from_form}->{d.to_form}")
    table = _sent_table(env, decisions=decisions)
    table.title = f"turn {env.turn}: {_clip(env.query, 60)}"
    listed = {r.key for r in sent_rows(env)}
    for target, notes in decisions.items():
        if target not in listed:
            table.add_row("-", target, "(not sent)", "0", "; ".join(notes))
    console.print(table)
    total = int(turn["tokens_total"])
    budget = env.report.budget
    scale = budget.limit if budget is not None else total
    bands = turn.get("sent") or {}
    bar = ""
    for mark, name in zip("12D345f", SENT_BANDS, strict=True):
        bar += mark * round(width * max(int(bands.get(name, 0)), 0) / scale) if scale else ""
    bar = bar[:width].ljust(width, ".")
    label = f"limit {scale}" if budget is not None else f"request {total}"
    console.print(
        f"[{bar}] {total} of {label} tokens sent  (digits = layer, D = context in earlier "
        "user messages, f = framing)",
        markup=False,
    )
    console.print(_request_line(turn, budget), markup=False, soft_wrap=True)
    if verbose:
        _plan(console, budget)
    if env.batch is not None:
        console.print(_batch_line(env), markup=False, soft_wrap=True)
    for warning in env.report.warnings:
        console.print(f"warning: {warning}", markup=False, soft_wrap=True)
    _warn(env)


def _batch_line(env: Envelope) -> str:
    """How the request is sent when the library's growth is deferred (``defer_library``)."""
    b = env.batch
    assert b is not None
    settled, entries = len(listed_segments(env.l2, b.settled)), len(listed_segments(env.l2))
    held = f"the system message holds {settled} of {entries} library entries"
    again = ""
    if b.restored:
        again = "; sent whole again: " + ", ".join(s.key for s in b.restored)
    if b.reason:
        return f"request: settled ({b.reason}): {held}{again}"
    turns = ", ".join(s.key.split(":")[1] for s in b.turns)
    return f"request: extends the last one; {held}; turns {turns} keep their context{again}"


@cli.command()
@click.argument("script_path", metavar="SCRIPT")
@click.option(
    "--vault", type=click.Path(file_okay=False), help="Vault folder (overrides the script's)."
)
@tokenizer_option
@budget_options
@layout_option
@verbose_option
@network_option
def inspect(
    script_path: str,
    vault: str | None,
    tokenizer: str | None,
    window: int | None,
    reserve: int | None,
    model: str | None,
    recall: bool | None,
    defer_library: bool | None,
    verbose: bool,
    allow_private_network: bool,
) -> None:
    """Per turn, as sent: every block's band, form, tokens and decisions, and how the window
    is spent."""
    script = load_script(script_path)
    budget = _budget(window, reserve, model, recall)
    conv = _conversation(
        script,
        vault,
        tokenizer,
        budget,
        allow_private_network=allow_private_network,
        defer_library=defer_library,
    )
    console = Console()
    envelopes = run_script(script, conv)
    turns = _trace(envelopes, conv)["turns"]
    for env, turn in zip(envelopes, turns, strict=True):
        _inspect_turn(console, env, turn, verbose=verbose)
        sentence = (turn.get("cache") or {}).get("sentence")
        if sentence:
            console.print(f"cache: {sentence}", markup=False, soft_wrap=True)


# The replay engine lives in its own modules; only its command is here.
cli.add_command(replay_command)


def _existing_store(value: str, *, read_only: bool = False) -> SqliteStore | PostgresStore:
    """The store a command uses: a PostgreSQL URL, or a SQLite file that must exist.

    ``read_only`` for commands that only look (export, report): the store is never
    written nor migrated (a store too old to read as it is raises StoreNeedsMigration)."""
    from lamina.pipeline.store import is_postgres_url, open_store

    if not is_postgres_url(value) and not Path(value).is_file():
        raise ScriptError(value, "", "no such store file")
    return open_store(value, read_only=read_only)


@cli.command()
@click.argument("store_path", metavar="STORE")
def migrate(store_path: str) -> None:
    """Bring an existing store (file or postgresql:// URL) to this Lamina's schema version.

    Commands that write (run, resume, import, serve) migrate on open; export and report
    only read, and ask for this when a store is too old to read as it is."""
    from lamina.pipeline.errors import StoreNeedsMigration

    try:
        with _existing_store(store_path, read_only=True) as store:
            was = store.schema_version
    except StoreNeedsMigration as exc:
        was = exc.found
    with _existing_store(store_path) as store:  # an open for writing migrates
        now = store.schema_version
    said = "already current" if was == now else f"was {was}"
    click.echo(f"store {store.path}: schema version {now} ({said})")


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status (a command's own, else 0).

    Any LaminaError, OSError and usage error (a bad option value, a missing argument) is
    one line ``lamina: error: ...`` on stderr and exit status 2.
    """
    _tolerant_streams()
    try:
        status = cli.main(
            args=list(argv) if argv is not None else None, prog_name="lamina", standalone_mode=False
        )
    except LaminaError as exc:
        _error("; ".join([str(exc), *getattr(exc, "__notes__", ())]))
        return 2
    except OSError as exc:
        # What the system refused (a full disk, a permission, a folder that is not one) on
        # a path no command checked first: still one line, never a traceback.
        where = f"{exc.filename}: " if exc.filename else ""
        _error(f"{where}{exc.strerror or exc}")
        return 2
    except click.exceptions.Abort:
        click.echo("lamina: aborted", err=True)
        return 130
    except click.exceptions.NoArgsIsHelpError as exc:
        exc.show()  # bare ``lamina``: the command list is the useful answer
        return 2
    except click.ClickException as exc:
        _error(exc.format_message())
        return 2
    return status if isinstance(status, int) else 0


def _error(message: str) -> None:
    click.echo(f"lamina: error: {' '.join(message.split())}", err=True)


def _tolerant_streams() -> None:
    """File names that are not UTF-8 (surrogate escapes) print as ``\\udcXX``, never raise."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if callable(reconfigure):
            reconfigure(errors="backslashreplace")


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True)
@click.option("--store", "store_path", default="lamina.sqlite", show_default=True)
@click.option("--vault", type=click.Path(file_okay=False, exists=True), help="Server vault.")
@click.option("--token-file", type=click.Path(dir_okay=False), help="Bearer token file.")
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True)
@click.option("--max-body", type=click.IntRange(1), default=8 << 20, help="Request bytes.")
@click.option("--max-text", type=click.IntRange(1), default=1 << 20, help="Bytes per note.")
@click.option(
    "--allow-host",
    "allow_hosts",
    multiple=True,
    help="Without a token, a Host/Origin name to answer besides localhost (repeatable).",
)
@click.option(
    "--header-timeout",
    type=click.FloatRange(0.1),
    default=10.0,
    show_default=True,
    help="Seconds a request head may take to arrive.",
)
@click.option(
    "--body-timeout",
    type=click.FloatRange(0.1),
    default=60.0,
    show_default=True,
    help="Seconds a request body may take to arrive.",
)
@click.option(
    "--write-timeout",
    type=click.FloatRange(0.1),
    default=30.0,
    show_default=True,
    help="Seconds an answer may wait for the client to read any of it.",
)
@click.option(
    "--max-connections",
    type=click.IntRange(0),
    default=0,
    help="Open connections at most (default: half the descriptor limit).",
)
@click.option(
    "--http",
    "http_parser",
    type=click.Choice(["auto", "httptools", "h11"]),
    default="auto",
    show_default=True,
    help="HTTP/1.1 parser (auto: httptools when installed).",
)
@network_option
def serve(
    host: str,
    port: int,
    store_path: str,
    vault: str | None,
    token_file: str | None,
    workers: int,
    max_body: int,
    max_text: int,
    allow_hosts: tuple[str, ...],
    header_timeout: float,
    body_timeout: float,
    write_timeout: float,
    max_connections: int,
    http_parser: str,
    allow_private_network: bool,
) -> None:
    """The HTTP API for hosts in any language (OpenAPI at /openapi.json; docs/SERVER.md).

    Needs the server extra: pip install 'lamina[server]'."""
    try:
        from lamina._hub import ServerConfig
        from lamina._server import read_token
        from lamina._server import serve as run_server
    except ImportError as exc:
        missing = f" ({exc.name} is missing)" if exc.name else ""
        raise ConfigError(
            "serve", f"needs the server extra{missing}: pip install 'lamina[server]'"
        ) from None

    token = None if token_file is None else read_token(token_file)
    root = None if vault is None else Path(vault).resolve()
    config = ServerConfig(
        store_path,
        root,
        token,
        allow_private_network=allow_private_network,
        max_body_bytes=max_body,
        max_text_bytes=max_text,
        allowed_hosts=allow_hosts,
        header_timeout=header_timeout,
        body_timeout=body_timeout,
        write_timeout=write_timeout,
        max_connections=max_connections,
        http=http_parser,
    )
    run_server(config, host, port, workers)


def _json(document: Any) -> str:
    """The JSON text of ``document``; a lone surrogate (a non-UTF-8 file name) becomes its
    ``\\udcXX`` escape, so the output is valid UTF-8 JSON that loads back to the same str."""
    text = json.dumps(document, indent=2, ensure_ascii=False)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


if __name__ == "__main__":
    sys.exit(main())


def console() -> None:
    """The ``lamina`` console script."""
    sys.exit(main())
