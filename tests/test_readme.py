"""The README's quickstart runs as written, and its set-up commands match CI."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_quickstart_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    (code,) = re.findall(r"## Quickstart for host apps\n\n```python\n(.*?)```", README, re.S)
    monkeypatch.chdir(ROOT)
    scope: dict[str, object] = {}
    exec(compile(code, "README quickstart", "exec"), scope)
    env = scope["env"]
    assert scope["messages"][0]["role"] == "system"  # type: ignore[index]
    assert "system" in scope["body"]  # type: ignore[operator]
    assert env.l3.keys()[0] == "note:project-spec.md"  # type: ignore[attr-defined]


def test_exactly_two_setup_commands_and_ci_runs_the_test_one() -> None:
    setup = README.split("## Set up", 1)[1].split("\n## ", 1)[0]
    commands = [line for line in setup.splitlines() if line.startswith("python3 -m venv")]
    assert len(commands) == 2
    assert commands[0].endswith("lamina demo")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert commands[1] in ci
