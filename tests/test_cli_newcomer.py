"""What a newcomer trips on first: errors that name where they come from, a note handed
over as a script, `simulate` under a window, a replay table that explains itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli import ROOT, lamina, lamina_here

VAULT = ROOT / "examples" / "vault"


@pytest.fixture
def here(tmp_path: Path) -> Path:
    (tmp_path / "missing-note.yaml").write_text(
        f"vault: {VAULT}\nturns:\n  - user: hi\n    reply: ok\n"
        "  - user: read this\n    attach: [{note: nope.md}]\n",
        encoding="utf-8",
    )
    (tmp_path / "good.yaml").write_text(
        f"vault: {VAULT}\nturns:\n  - user: hi\n    attach: [{{note: project-spec.md}}]\n"
        "    reply: ok\n  - user: again\n    attach: [{note: docs/api-docs.md}]\n",
        encoding="utf-8",
    )
    return tmp_path


def _one_error(ran: object) -> str:
    stderr: str = ran.stderr  # type: ignore[attr-defined]
    assert ran.returncode == 2, stderr  # type: ignore[attr-defined]
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("lamina: error: "), stderr
    return lines[0]


def test_a_missing_note_names_the_vault_and_the_turn(here: Path) -> None:
    line = _one_error(lamina_here("run", "missing-note.yaml", cwd=here))
    assert line.startswith("lamina: error: nope.md: no such note in the vault ")
    assert str(VAULT.resolve()) in line
    assert line.endswith("; in turn 2 of missing-note.yaml")


def test_a_missing_vault_flag_is_reported_as_the_flag_not_the_script(here: Path) -> None:
    line = _one_error(lamina_here("run", "good.yaml", "--vault", "/nonexistent/vault", cwd=here))
    assert line == "lamina: error: --vault: folder /nonexistent/vault does not exist"


@pytest.mark.parametrize("command", ["run", "inspect", "simulate", "report"])
def test_a_note_given_as_script_says_what_a_script_is(command: str) -> None:
    line = _one_error(lamina_here(command, str(VAULT / "project-spec.md")))
    assert "a .md file is not a script: a script is a YAML or JSON file with a 'turns' list" in (
        line
    )
    assert "Traceback" not in line and "found another document" not in line


def test_simulate_takes_a_window_and_its_budget_applies(here: Path) -> None:
    free = json.loads(lamina_here("simulate", "good.yaml", "--json", cwd=here).stdout)
    tight = lamina_here("simulate", "good.yaml", "--json", "--window", "1800", cwd=here)
    assert tight.returncode == 0, tight.stderr
    sent = json.loads(tight.stdout)["layouts"]["default"]["openai"]["input_tokens"]
    assert sent < free["layouts"]["default"]["openai"]["input_tokens"]


def test_the_replay_table_names_every_column_and_never_cuts_a_config_name(
    tmp_path: Path,
) -> None:
    from tests.lamina.test_cli_replay import write_report_corpus

    chats, configs = write_report_corpus(tmp_path)
    args = ["replay", str(chats)]
    for path in configs:
        args += ["--config", str(path)]
    ran = lamina(*args, env={"COLUMNS": "100"})
    assert ran.returncode == 0, ran.stderr
    text = " ".join(ran.stdout.split())
    for header in ("failed", "invariant", "tokens/conv", "p50"):
        assert header in text
    assert "invariant failures: conversations whose envelopes broke" in text
    assert "…" not in ran.stdout


def test_recall_is_a_budget_flag(here: Path) -> None:
    """--recall / --no-recall switch the budget's recall (on by default); without a window
    it is refused by name; it takes no value."""
    ran = lamina_here("run", "good.yaml", "--window", "1800", "--no-recall", "--json", cwd=here)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["turns"][-1]["budget"]["window"] == 1800
    line = _one_error(lamina_here("run", "good.yaml", "--recall", cwd=here))
    assert line == "lamina: error: --recall: needs --window or --model"
    valued = lamina_here("run", "good.yaml", "--window", "1800", "--recall", "0.3", cwd=here)
    assert valued.returncode == 2
