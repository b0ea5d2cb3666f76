"""Hostile inputs, generated (never stored), and the CLI run under memory and CPU limits."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

from tests.cli import ROOT

MEMORY_LIMIT = 1024 * 1024 * 1024  # address space: the old bombs died at 1.5-2 GB
CPU_SECONDS = 60


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """Billion laughs: each anchor is a list of ``width`` aliases of the previous one."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def deep_flow(depth: int = 100_000) -> str:
    """``[[[...]]]``: valid YAML and JSON nested ``depth`` deep."""
    return "[" * depth + "]" * depth


def deep_block(depth: int = 1_000) -> str:
    """Block-style YAML mappings nested ``depth`` deep."""
    return "".join(f"{' ' * i}k:\n" for i in range(depth)) + " " * depth + "k: v\n"


BIG_INT = "9" * 5_000


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))


def lamina_limited(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """The CLI in a subprocess with ``ulimit -v`` 1 GiB and 60 s of CPU; a hang fails the
    test by its wall-clock timeout instead of holding the suite."""
    return subprocess.run(
        [sys.executable, "-m", "lamina._cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=90,
        check=False,
        preexec_fn=_limits,
    )


def assert_one_error_line(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """Exit 2, no traceback, exactly one ``lamina: error:`` line naming the fragments."""
    assert result.returncode == 2, (result.returncode, result.stdout[-500:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("lamina: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
