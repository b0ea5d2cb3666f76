"""Run the ``lamina`` CLI in a subprocess, as a user does, or in this process when a test
only needs its output and status (tests share these helpers)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[1]


def lamina(
    *args: str, cwd: Path = ROOT, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m lamina._cli ARGS``; ``env`` is added to this process's environment."""
    return subprocess.run(
        [sys.executable, "-m", "lamina._cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=None if env is None else {**os.environ, **env},
        timeout=120,
        check=False,
    )


@attrs.frozen
class Ran:
    """What an in-process run of the CLI printed, and its exit status."""

    returncode: int
    stdout: str
    stderr: str


def lamina_here(*args: str, cwd: Path = ROOT) -> Ran:
    """``lamina ARGS`` run in this process (fast; an exception that escapes the CLI's own
    handling propagates to the test, as a traceback would reach the user)."""
    from lamina._cli import main

    out, err = io.StringIO(), io.StringIO()
    with (
        contextlib.chdir(cwd),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        status = main(list(args))
    return Ran(status, out.getvalue(), err.getvalue())
