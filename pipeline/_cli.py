"""The ``lamina`` command: demo, run. Any LaminaError is one line on stderr, exit 2."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from pipeline._conversation import Conversation, request_tokens
from pipeline._envelope import Envelope
from pipeline._errors import LaminaError, ScriptError
from pipeline._script import Script, load_script, parse_script, run_script
from pipeline._tokens import TOKENIZERS

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
        {"user": "Explain the auth flow from the spec", "attach": [{"note": "project-spec.md"}]},
    ],
}


def _demo_vault() -> Path:
    for base in (Path(__file__).resolve().parents[1], Path.cwd()):
        candidate = base / "examples" / "vault"
        if candidate.is_dir():
            return candidate
    raise ScriptError(
        "demo", "vault", "examples/vault not found; run from the repository or pass --vault"
    )


def _conversation(script: Script, vault: str | None, tokenizer: str) -> Conversation:
    root = Path(vault) if vault else script.vault
    if root is not None and not root.is_dir():
        raise ScriptError(script.path, "vault", f"vault folder {root} does not exist")
    return Conversation(script.system, vault=root, tokenizer=tokenizer)


def _trace(envelopes: Sequence[Envelope], conv: Conversation) -> dict[str, Any]:
    from renderers import trace_document

    return trace_document(envelopes, conv.counter)


def _show(console: Console, envelopes: Sequence[Envelope], conv: Conversation, full: bool) -> None:
    from renderers import common_prefix_tokens, openai_messages

    previous = None
    for env in envelopes:
        messages = openai_messages(env)
        total = request_tokens(env, conv.counter)
        cached = common_prefix_tokens(previous, messages, conv.counter)
        console.rule(f"[bold]Turn {env.turn}[/bold]: {env.query}")
        table = Table(show_lines=False)
        for col in ("layer", "key", "form", "tokens"):
            table.add_column(col, justify="right" if col == "tokens" else "left")
        for layer in env.layers:
            for seg in layer.segments:
                table.add_row(str(layer.name), seg.key, str(seg.form), str(seg.tokens))
            if not layer.segments:
                table.add_row(str(layer.name), "(empty)", "", "0")
        console.print(table)
        layers = "  ".join(f"{layer.name}={layer.tokens}" for layer in env.layers)
        console.print(f"layers: {layers}  request={total} tokens")
        for d in env.report.decisions:
            console.print(
                f"  decision {d.stage}: {d.target} {d.from_form} -> {d.to_form} ({d.reason})",
                markup=False,
                soft_wrap=True,
            )
        for w in env.report.warnings:
            console.print(f"  [yellow]warning[/yellow] {w}")
        console.print("[bold]request[/bold]")
        for m in messages:
            content = m["content"]
            lines = content.splitlines()
            if not full and len(lines) > 24:
                content = (
                    "\n".join(lines[:24]) + f"\n… ({len(lines) - 24} more lines; --full shows all)"
                )
            console.print(f"[cyan]{m['role']}[/cyan]:")
            console.print(content, markup=False, highlight=False, soft_wrap=True)
        share = f"{cached / total:.0%}" if total else "0%"
        console.print(
            f"[bold green]cacheable prefix[/bold green]: {cached} of {total} tokens identical "
            f"to the previous turn's request ({share})"
        )
        previous = messages


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Lamina: build each LLM chat turn's prompt from typed context artifacts."""


@cli.command()
@click.option(
    "--vault", type=click.Path(file_okay=False), help="Vault folder (default: examples/vault)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the JSON trace instead of tables.")
@click.option("--full", is_flag=True, help="Show whole messages, not the first lines.")
@click.option("--tokenizer", type=click.Choice(TOKENIZERS), default="o200k_base", show_default=True)
def demo(vault: str | None, as_json: bool, full: bool, tokenizer: str) -> None:
    """Three turns over the example vault: attach, add, keep (the layer walkthrough)."""
    script = parse_script(DEMO_SCRIPT, "demo")
    conv = _conversation(script, vault or str(_demo_vault()), tokenizer)
    envelopes = run_script(script, conv)
    if as_json:
        click.echo(json.dumps(_trace(envelopes, conv), indent=2, ensure_ascii=False))
    else:
        _show(Console(), envelopes, conv, full)


@cli.command()
@click.argument("script_path", metavar="SCRIPT")
@click.option(
    "--vault", type=click.Path(file_okay=False), help="Vault folder (overrides the script's)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the JSON trace (the public format).")
@click.option("--full", is_flag=True, help="Show whole messages, not the first lines.")
@click.option("--tokenizer", type=click.Choice(TOKENIZERS), default="o200k_base", show_default=True)
def run(script_path: str, vault: str | None, as_json: bool, full: bool, tokenizer: str) -> None:
    """Run a scripted conversation (JSON or YAML)."""
    script = load_script(script_path)
    conv = _conversation(script, vault, tokenizer)
    envelopes = run_script(script, conv)
    if as_json:
        click.echo(json.dumps(_trace(envelopes, conv), indent=2, ensure_ascii=False))
    else:
        _show(Console(), envelopes, conv, full)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status."""
    try:
        cli.main(
            args=list(argv) if argv is not None else None, prog_name="lamina", standalone_mode=False
        )
    except LaminaError as exc:
        click.echo(f"lamina: error: {exc}", err=True)
        return 2
    except click.exceptions.Abort:
        click.echo("lamina: aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())


def console() -> None:
    """The ``lamina`` console script."""
    sys.exit(main())
