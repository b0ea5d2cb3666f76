"""Run the ``lamina`` CLI in a subprocess, as a user does (tests share this one helper)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

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
