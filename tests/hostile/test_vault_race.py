"""Vault confinement under a race: a thread swaps a note between a regular file and a
symlink to a file outside the vault (atomic renames) while turns attach it."""

from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path

from lamina import Conversation
from lamina.pipeline import LaminaError
from lamina.pipeline.errors import PathOutsideVault
from lamina.processors import note
from lamina.processors._vault import Vault

SECRET = "OUTSIDE-SECRET-0451"
TURNS = 3_000


class Swapper:
    """Swaps ``vault/note.md`` between a file and an outside symlink until stopped."""

    def __init__(self, vault: Path, outside: Path) -> None:
        self.vault = vault
        self.outside = outside
        self.stop = threading.Event()
        self.swaps = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        stage = self.vault / ".stage"
        target = self.vault / "note.md"
        while not self.stop.is_set():
            stage.write_text("inside text\n", encoding="utf-8")
            os.replace(stage, target)
            os.symlink(self.outside, stage)
            os.replace(stage, target)
            self.swaps += 2

    def __enter__(self) -> Swapper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def _setup(tmp_path: Path) -> tuple[Path, Path]:
    vault = tmp_path / "vault"
    vault.mkdir()
    (vault / "note.md").write_text("inside text\n", encoding="utf-8")
    outside = tmp_path / "secret.md"
    outside.write_text(f"{SECRET}\n", encoding="utf-8")
    return vault, outside


def test_no_turn_carries_outside_content_while_a_note_is_swapped(tmp_path: Path) -> None:
    vault, outside = _setup(tmp_path)
    outcomes: Counter[str] = Counter()
    leaks = 0
    with Swapper(vault, outside) as swapper:
        conv = Conversation("", vault=vault)
        for i in range(TURNS):
            if i % 250 == 0:
                conv = Conversation("", vault=vault)  # keep each turn small
            try:
                env = conv.turn("q", [note("note.md")])
            except PathOutsideVault:
                outcomes["PathOutsideVault"] += 1
                continue
            except LaminaError as exc:
                outcomes[f"{type(exc).__name__}: {exc}"] += 1
                continue
            outcomes["read"] += 1
            leaks += SECRET in env.system_text or SECRET in env.user_text
    assert leaks == 0
    # Only typed errors: a raw OSError or anything else would have failed the loop above.
    assert set(outcomes) <= {"read", "PathOutsideVault"}, outcomes
    assert outcomes["read"] > 0 and outcomes["PathOutsideVault"] > 0, outcomes
    assert swapper.swaps > 100


def test_no_vault_read_returns_outside_content_while_a_note_is_swapped(tmp_path: Path) -> None:
    """The same race at the read itself, many more times (the window is the read)."""
    vault, outside = _setup(tmp_path)
    outcomes: Counter[str] = Counter()
    v = Vault(vault)
    with Swapper(vault, outside):
        for _ in range(20_000):
            try:
                text, _ = v.read_text("note.md")
            except PathOutsideVault:
                outcomes["outside"] += 1
                continue
            except LaminaError as exc:
                outcomes[f"{type(exc).__name__}: {exc}"] += 1
                continue
            outcomes["leak" if SECRET in text else "read"] += 1
    assert outcomes["leak"] == 0, outcomes
    assert outcomes["read"] > 0 and outcomes["outside"] > 0, outcomes
    assert set(outcomes) <= {"read", "outside"}, outcomes
