"""Every public error path of the CLI: exit status 2, one ``lamina: error:`` line, no traceback.

The CLI runs in this process (``tests.cli.lamina_here``): an exception the CLI does not turn
into its one line escapes to the test and fails it, as a traceback would reach the user.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from lamina._cli import cli
from tests.cli import ROOT, lamina_here

VAULT = ROOT / "examples" / "vault"


@pytest.fixture(scope="module")
def here(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a good script, a saved chat (``st.sqlite``, conversation ``c1``) and
    bad inputs of every kind."""
    root = tmp_path_factory.mktemp("cli-errors")
    (root / "good.yaml").write_text(
        f"system: You are terse.\nvault: {VAULT}\n"
        "turns:\n  - user: hi\n    attach: [{note: project-spec.md}]\n    reply: ok\n",
        encoding="utf-8",
    )
    (root / "unparsable.yaml").write_text("turns: [\n", encoding="utf-8")
    (root / "badkind.yaml").write_text(
        "turns:\n  - user: hi\n    attach: [{bogus: x}]\n", encoding="utf-8"
    )
    (root / "badshape.yaml").write_text("turns: 5\n", encoding="utf-8")
    (root / "binary.yaml").write_bytes(b"\xff\xfe")
    (root / "notdb.sqlite").write_text("not sqlite\n", encoding="utf-8")
    (root / "badconfig.yaml").write_text("x: [", encoding="utf-8")
    (root / "config.json").write_text("{}", encoding="utf-8")
    (root / "badfactory.yaml").write_text("summarizer: os:getcwd\n", encoding="utf-8")
    (root / "adir").mkdir()
    saved = lamina_here(
        "run", "good.yaml", "--store", "st.sqlite", "--conversation", "c1", cwd=root
    )
    assert saved.returncode == 0, saved.stderr
    return root


# A path whose parent is a file: unwritable for any user, root included.
NO_DIR = "good.yaml/sub/out"
C1, X = ["--conversation", "c1"], ["--conversation", "x"]
INTO = ["--store", "i.sqlite"]
CONFIG = ["--config", "config.json"]

BAD = {
    # run: scripts, vaults, numbers, stores
    "run a missing script": ["run", "missing.yaml"],
    "run a folder as script": ["run", "adir"],
    "run unparsable YAML": ["run", "unparsable.yaml"],
    "run an unknown attachment kind": ["run", "badkind.yaml"],
    "run turns that are not a list": ["run", "badshape.yaml"],
    "run a script that is not UTF-8": ["run", "binary.yaml"],
    "run a missing vault": ["run", "good.yaml", "--vault", "nosuch"],
    "run a negative window": ["run", "good.yaml", "--window", "-5"],
    "run a window that is no number": ["run", "good.yaml", "--window", "abc"],
    "run a reserve above the window": ["run", "good.yaml", "--window", "100", "--reserve", "500"],
    "run a window too small": ["run", "good.yaml", "--window", "10"],
    "run an unknown model": ["run", "good.yaml", "--model", "nosuch-model"],
    "run a folder as store": ["run", "good.yaml", "--store", "adir"],
    "run a store that is no database": ["run", "good.yaml", "--store", "notdb.sqlite"],
    "run a store under a file": ["run", "good.yaml", "--store", f"{NO_DIR}.sqlite"],
    # resume
    "resume a missing store": ["resume", "missing.sqlite", *C1, "--script", "good.yaml"],
    "resume an unknown conversation": ["resume", "st.sqlite", *X, "--script", "good.yaml"],
    "resume a missing script": ["resume", "st.sqlite", *C1, "--script", "missing.yaml"],
    "resume a bad store": ["resume", "notdb.sqlite", *C1, "--script", "good.yaml"],
    "resume a missing vault": [
        "resume", "st.sqlite", *C1, "--script", "good.yaml", "--vault", "nosuch"
    ],
    # export
    "export to a missing folder": ["export", "st.sqlite", "--conversation", "c1", "--out", NO_DIR],
    "export to a folder": ["export", "st.sqlite", "--conversation", "c1", "--out", "adir"],
    "export an unknown conversation": ["export", "st.sqlite", "--conversation", "x"],
    "export a missing store": ["export", "missing.sqlite", "--conversation", "c1"],
    "export a bad store": ["export", "notdb.sqlite", "--conversation", "c1"],
    # import
    "import a missing transcript": ["import", "missing.md", *INTO, "--vault", "."],
    "import a transcript that is not UTF-8": ["import", "binary.yaml", *INTO, "--vault", "."],
    "import a file that is no transcript": ["import", "good.yaml", *INTO, "--vault", "."],
    "import a missing vault": ["import", "good.yaml", *INTO, "--vault", "nosuch"],
    "import into a bad store": ["import", "good.yaml", "--store", "notdb.sqlite", "--vault", "."],
    # simulate, inspect
    "simulate a missing script": ["simulate", "missing.yaml"],
    "simulate an unknown attachment kind": ["simulate", "badkind.yaml"],
    "simulate a missing vault": ["simulate", "good.yaml", "--vault", "nosuch"],
    "inspect a missing script": ["inspect", "missing.yaml"],
    "inspect a window too small": ["inspect", "good.yaml", "--window", "10"],
    "inspect a missing vault": ["inspect", "good.yaml", "--vault", "nosuch"],
    # report
    "report nothing": ["report"],
    "report a missing script": ["report", "missing.yaml"],
    "report to a missing folder": ["report", "good.yaml", "--out", NO_DIR],
    "report to a folder": ["report", "good.yaml", "--out", "adir"],
    "report a store without conversation": ["report", "--store", "st.sqlite"],
    "report an unknown conversation": ["report", "--store", "st.sqlite", "--conversation", "x"],
    "report a missing store": ["report", "--store", "missing.sqlite", "--conversation", "c1"],
    "report a script with --conversation": ["report", "good.yaml", "--conversation", "c1"],
    # demo
    "demo a missing vault": ["demo", "--vault", "nosuch", "--json"],
    "demo a report to a missing folder": ["demo", "--json", "--report", NO_DIR],
    "demo a window too small": ["demo", "--window", "10"],
    # replay
    "replay without corpus": ["replay", "--config", "config.json"],
    "replay a missing config": ["replay", "--config", "missing.yaml", "good.yaml"],
    "replay a bad config": ["replay", "--config", "badconfig.yaml", "good.yaml"],
    "replay a summarizer factory of the wrong signature": [
        "replay", "--config", "badfactory.yaml", "good.yaml"
    ],
    "replay a missing corpus": ["replay", "--config", "config.json", "nosuch"],
    "replay to a missing folder": ["replay", *CONFIG, "good.yaml", "--out", NO_DIR],
    "replay a missing store": ["replay", "--config", "config.json", "--store", "missing.sqlite"],
    "replay zero workers": ["replay", "--config", "config.json", "good.yaml", "--workers", "0"],
    # serve (refused before it binds)
    "serve a missing vault": ["serve", "--vault", "nosuch"],
    "serve a missing token file": ["serve", "--token-file", "missing.txt"],
    "serve a port out of range": ["serve", "--port", "99999"],
    # bench, and the group itself
    "bench an unknown scale": ["bench", "--scale", "nosuch"],
    "an unknown command": ["nosuch"],
    "an unknown option": ["run", "good.yaml", "--nosuch"],
}  # fmt: skip


@pytest.mark.parametrize("args", list(BAD.values()), ids=list(BAD))
def test_a_bad_input_is_one_error_line_and_exit_2(here: Path, args: list[str]) -> None:
    ran = lamina_here(*args, cwd=here)
    lines = ran.stderr.splitlines()
    assert ran.returncode == 2, (ran.returncode, ran.stderr)
    assert len(lines) == 1 and lines[0].startswith("lamina: error: "), ran.stderr
    assert "Traceback" not in ran.stdout + ran.stderr


def test_export_to_a_missing_folder_names_the_path(here: Path) -> None:
    ran = lamina_here("export", "st.sqlite", "--conversation", "c1", "--out", NO_DIR, cwd=here)
    assert ran.stderr == f"lamina: error: --out: cannot write {NO_DIR}: Not a directory\n"


@pytest.fixture
def failing_command() -> Iterator[str]:
    """A command that ends with its own exit status (as ``bench`` passes a suite's on)."""

    @click.command("exits-3")
    def exits() -> None:
        raise click.exceptions.Exit(3)

    cli.add_command(exits)
    try:
        yield "exits-3"
    finally:
        cli.commands.pop("exits-3")


def test_a_commands_own_exit_status_is_kept(failing_command: str) -> None:
    ran = lamina_here(failing_command)
    assert (ran.returncode, ran.stderr) == (3, "")
