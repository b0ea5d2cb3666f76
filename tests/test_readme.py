"""The README and docs/ say what the code does: snippets run, quoted figures match the
code's defaults, cited paths exist, and every CLI form shown is one the CLI accepts."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from lamina import Policy
from lamina._cli import DEMO_BUDGET, DEMO_SCRIPT, cli
from lamina.pipeline import BudgetSettings
from lamina.pipeline._conversation.agent import DEFAULT_TOOL_HEADROOM
from lamina.pipeline._conversation.usage import CALIBRATION_WINDOW, MARGIN_BOUNDS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = {p.name: p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))}
ALL_DOCS = {"README.md": README, **{f"docs/{name}": text for name, text in DOCS.items()}}

NOT_RUN = "<!-- not run:"
PYTHON_BLOCK = re.compile(r"(?:^(<!-- not run:[^\n]*-->)\n)?```python\n(.*?)```", re.S | re.M)


def _blocks() -> list[tuple[str, int, str | None, str]]:
    """Every ```python block: (document, index, its not-run comment or None, code)."""
    return [
        (doc, i, match.group(1), match.group(2))
        for doc, text in ALL_DOCS.items()
        for i, match in enumerate(PYTHON_BLOCK.finditer(text))
    ]


def _mib(text: str) -> int:
    number, unit = text.split()
    return int(number) * {"MiB": 1 << 20, "KiB": 1 << 10}[unit]


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def _section(doc: str, heading: str) -> str:
    return doc.split(heading, 1)[1].split("\n## ", 1)[0]


def test_quickstart_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It runs, and prints the second turn's cache figure: the tokens it repeats of the
    first request as sent, no break, and the sentence that says so."""
    (code,) = re.findall(r"## Quickstart for host apps\n\n```python\n(.*?)```", README, re.S)
    monkeypatch.chdir(ROOT)
    scope: dict[str, object] = {}
    exec(compile(code, "README quickstart", "exec"), scope)
    env = scope["env"]
    assert scope["messages"][0]["role"] == "system"  # type: ignore[index]
    assert "system" in scope["body"]  # type: ignore[operator]
    assert env.l3.keys()[0] == "note:docs/api-docs.md"  # type: ignore[attr-defined]
    cache = env.cache  # type: ignore[attr-defined]
    assert 0 < cache.tokens < cache.total and cache.reason is None
    assert capsys.readouterr().out == f"{cache.tokens} None {cache.sentence}\n"
    assert cache.sentence.startswith(
        f"The request extends turn 1's byte for byte: it repeats {cache.tokens:,} of"
    )


def test_exactly_two_setup_commands_and_ci_runs_the_test_one() -> None:
    setup = README.split("## Set up", 1)[1].split("\n## ", 1)[0]
    commands = [line for line in setup.splitlines() if line.startswith("python3 -m venv")]
    assert len(commands) == 2
    assert commands[0].endswith("lamina demo")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert commands[1] in ci


def test_the_front_page_is_short() -> None:
    """A newcomer reads it in five minutes; the details live in docs/."""
    assert len(README.splitlines()) <= 130


@pytest.mark.parametrize(
    ("doc", "index", "skip", "code"),
    [pytest.param(*b, id=f"{b[0]}-{b[1]}") for b in _blocks()],
)
def test_python_blocks_run(
    doc: str, index: int, skip: str | None, code: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every ```python block runs from the repository root, except those a preceding
    `<!-- not run: needs ... -->` comment says need something a test does not have."""
    if skip is not None:
        pytest.skip(skip)
    monkeypatch.chdir(ROOT)
    exec(compile(code, f"{doc} block {index}", "exec"), {"__name__": "__doc_snippet__"})


def test_not_run_comments_sit_right_above_a_python_block() -> None:
    """A `not run` comment anywhere else would skip nothing and mislead the reader."""
    for doc, text in ALL_DOCS.items():
        marked = text.count(NOT_RUN)
        skipped = sum(1 for d, _, skip, _ in _blocks() if d == doc and skip is not None)
        assert marked == skipped, doc


def test_demo_figures_match_the_demo() -> None:
    assert "six turns over examples/vault" in README
    assert len(DEMO_SCRIPT["turns"]) == 6
    window, reserve = re.search(
        r"over a ([\d,]+)-token window with ([\d,]+) reserved", DOCS["CLI.md"]
    ).groups()  # type: ignore[union-attr]
    assert (_number(window), _number(reserve)) == (
        DEMO_BUDGET.context_window,
        DEMO_BUDGET.reserve_output,
    )


def test_carry_forward_threshold_matches_the_policy() -> None:
    pattern = r"at most ([\d,]+) tokens\s+\(`Policy.verbatim_tokens`\)"
    (tokens,) = re.findall(pattern, DOCS["CACHE.md"])
    assert _number(tokens) == Policy().verbatim_tokens


def test_default_reserve_rule_is_the_code_s() -> None:
    """`min(4096, window/4)` as the docs state it is what `--window` alone gives, and
    what Python's default is."""
    from lamina._cli import _budget

    for name in ("CLI.md", "BUDGET.md"):
        assert "min(4096, window/4)" in DOCS[name], name
    for window in (2000, 6000, 16384, 100_000):
        budget = _budget(window, None, None)
        assert budget is not None
        assert budget.reserve_output == min(4096, window // 4)
    assert BudgetSettings(context_window=10).reserve_output == 2
    assert re.search(r"`reserve_output` defaults to `min\(4096, window/4\)`", DOCS["BUDGET.md"])


def test_text_free_share_matches_the_budget() -> None:
    pattern = r"## Text-free forms: at most (\d+)% of the window"
    (percent,) = re.findall(pattern, DOCS["BUDGET.md"])
    share = BudgetSettings(context_window=10).text_free_share
    assert int(percent) / 100 == share
    assert f"(default {share})" in DOCS["BUDGET.md"]


def test_tool_headroom_and_calibration_figures_match() -> None:
    adapters = DOCS["ADAPTERS.md"]
    (headroom,) = re.findall(r"`tool_headroom` free \(default ([\d,]+) tokens", adapters)
    assert _number(headroom) == DEFAULT_TOOL_HEADROOM
    last, low, high = re.search(
        r"the largest of the last (\d+) ratios, within (\d+)-(\d+)%", " ".join(adapters.split())
    ).groups()  # type: ignore[union-attr]
    assert int(last) == CALIBRATION_WINDOW
    assert (int(low) / 100, int(high) / 100) == MARGIN_BOUNDS


def _options(command: str) -> dict[str, click.Option]:
    return {
        opt: p
        for p in cli.commands[command].params
        if isinstance(p, click.Option)
        for opt in (*p.opts, *p.secondary_opts)
    }


def test_serve_limits_match_its_defaults() -> None:
    """The limits table of docs/SERVER.md against `lamina serve`'s option defaults."""
    options = _options("serve")
    table = dict(re.findall(r"^\| `(--[a-z-]+) \w+` \| ([^|]+?) \|", DOCS["SERVER.md"], re.M))
    assert _mib(table["--max-body"]) == options["--max-body"].default
    assert _mib(table["--max-text"]) == options["--max-text"].default
    for timeout in ("--header-timeout", "--body-timeout"):
        assert float(table[timeout].removesuffix(" s")) == options[timeout].default
    cli_doc = DOCS["CLI.md"]
    assert f"[--port {options['--port'].default}]" in cli_doc
    assert f"[--host {options['--host'].default}]" in cli_doc
    assert f"[--store {options['--store'].default}]" in cli_doc


def test_replay_figures_match() -> None:
    (worst,) = re.findall(r"`--worst N` \(default (\d+)\)", DOCS["REPLAY.md"])
    assert int(worst) == _options("replay")["--worst"].default
    from lamina._corpus import MAX_TRANSCRIPT_BYTES
    from lamina._script import MAX_SCRIPT_BYTES

    text = " ".join(DOCS["REPLAY.md"].split())
    script, transcript = re.search(
        r"a script over (\d+) MB or a transcript over (\d+) MB", text
    ).groups()  # type: ignore[union-attr]
    assert (int(script) * 10**6, int(transcript) * 10**6) == (
        MAX_SCRIPT_BYTES,
        MAX_TRANSCRIPT_BYTES,
    )


def _simulate(*args: str) -> dict[str, Any]:
    script = str(ROOT / "examples" / "chat30.yaml")
    result = CliRunner().invoke(cli, ["simulate", script, "--json", *args])
    assert result.exit_code == 0, result.output
    layouts: dict[str, Any] = json.loads(result.output)["layouts"]
    return layouts


def test_the_trade_off_quotes_what_simulate_measures() -> None:
    """The README's and CACHE.md's layout figures are today's `lamina simulate` output."""
    free, windowed = _simulate(), _simulate("--window", "6000")
    cost = {
        (layout, provider): f"{free[layout][provider]['relative_cost']:.3f}"
        for layout in free
        for provider in free[layout]
    }
    pitch = README.split("The trade-off, measured", 1)[1].split("## Set up", 1)[0]
    quoted = re.search(
        r"append-only costs (0\.\d+) .*?OpenAI's cache\s+and (0\.\d+) with Anthropic's, the "
        r"default layout (0\.\d+) and (0\.\d+)",
        pitch,
        re.S,
    )
    assert quoted is not None
    assert quoted.groups() == (
        cost["append-only", "openai"],
        cost["append-only", "anthropic"],
        cost["default", "openai"],
        cost["default", "anthropic"],
    )
    limit = 6000 - min(4096, 6000 // 4)
    turns = {k: windowed[k]["openai"]["turns"] for k in windowed}
    over = sum(t["input_tokens"] > limit for t in turns["append-only"])
    assert all(t["input_tokens"] <= limit for t in turns["default"])
    assert f"{over} of its 30 requests pass the {limit:,} tokens" in " ".join(pitch.split())
    flat = " ".join(pitch.split())
    total = windowed["default"]["openai"]["input_tokens"]
    assert f"the default sends {round(total / 1000)}k tokens" in flat
    total = windowed["append-only"]["openai"]["input_tokens"]
    peak = max(t["input_tokens"] for t in turns["append-only"])
    assert f"append-only sends {round(total / 1000)}k and" in flat
    assert f"(up to {peak:,})" in flat

    table = _section(DOCS["CACHE.md"], "## `lamina simulate`")
    for layout in ("default", "batched", "append-only", "naive"):
        row = re.search(rf"^\| {layout} \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", table, re.M)
        assert row is not None, layout
        assert row.groups() == tuple(cost[layout, p] for p in ("openai", "anthropic", "gemini"))
    table = _section(DOCS["CACHE.md"], "## `lamina simulate`").split("--window 6000", 1)[1]
    for layout in ("default", "batched", "append-only"):
        openai, anthropic = windowed[layout]["openai"], windowed[layout]["anthropic"]
        peak = max(t["input_tokens"] for t in openai["turns"])
        expected = (
            f"| {layout} | {openai['input_tokens']:,} | {peak:,} | "
            f"{openai['relative_cost']:.3f} | {anthropic['relative_cost']:.3f} |"
        )
        assert expected in table.splitlines(), layout
    assert f"passes it in {over} of the 30 turns" in " ".join(table.split())
    assert all(t["input_tokens"] <= limit for t in turns["batched"])


REPO_PATH = re.compile(
    r"`((?:\.ci|benchmarks|docs|examples|lamina|pipeline|processors|renderers|tests)/[\w./-]*)`"
)


@pytest.mark.parametrize("doc", sorted(ALL_DOCS))
def test_cited_paths_exist(doc: str) -> None:
    missing = [p for p in REPO_PATH.findall(ALL_DOCS[doc]) if not (ROOT / p).exists()]
    assert missing == []


@pytest.mark.parametrize("doc", sorted(ALL_DOCS))
def test_no_issue_numbers_or_outside_files(doc: str) -> None:
    """A reader of the repository cannot open an issue number or a file outside it."""
    text = ALL_DOCS[doc]
    assert re.findall(r"\bissues? \d+", text, re.I) == []
    assert re.findall(r"(?<![\w&/])#\d+\b", text) == []
    assert "shared/" not in text


def test_every_cli_form_in_cli_md_is_accepted() -> None:
    """Each `lamina <command> ...` shown names a command and only flags it has."""
    forms = re.findall(r"`lamina ([a-z]+)((?: [^`]*)?)`", DOCS["CLI.md"])
    assert {command for command, _ in forms} >= set(cli.commands)
    for command, rest in forms:
        assert command in cli.commands, command
        known = set(_options(command)) | {"--help", "-h"}
        flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", rest))
        assert flags <= known, (command, flags - known)


def test_trace_md_lists_every_decision_action() -> None:
    """The closed set hosts match on is the one the code has."""
    from lamina.pipeline import DecisionAction

    pattern = r"one of a closed set \(`lamina.pipeline.DecisionAction`\):(.*?)\. Match"
    listed = re.search(pattern, DOCS["TRACE.md"], re.S)
    assert listed is not None
    assert re.findall(r"`([a-z-]+)`", listed.group(1)) == [str(a) for a in DecisionAction]


def test_budget_settings_figures_match_the_budget() -> None:
    text = " ".join(DOCS["BUDGET.md"].split())
    settings = BudgetSettings(context_window=10)
    for knob in ("headroom", "cache_weight", "text_free_share"):
        assert f"**`{knob}`** ({getattr(settings, knob)}" in text
    assert "**`source_weights`** (1 for every source type)" in text and settings.recall
    shares = re.search(r"the request <= limit - reserve .*? text_free_share of the window", text)
    assert shares is not None
