"""Output files under hostile names and failing disks: written whole or not at all, never
a traceback, an earlier file never left empty or half written."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lamina._files import write_atomic
from lamina.pipeline.errors import ConfigError
from tests.cli import ROOT
from tests.hostile.corpus import assert_one_error_line, lamina_limited

NOT_UTF8 = os.fsdecode(b"caf\xe9.md")  # "caf\udce9.md": the byte decoded with surrogateescape


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """A store (``st.sqlite``) whose chat ``c1`` attached a note named by a non-UTF-8 byte."""
    vault = tmp_path / "vault"
    vault.mkdir()
    (vault / NOT_UTF8).write_bytes(b"A note whose name is not UTF-8.\n")
    script = tmp_path / "s.json"
    # JSON may spell the lone surrogate as an escape: the note's name as Python holds it.
    turn = {"user": "hi", "attach": [{"note": NOT_UTF8}], "reply": "ok " * 100_000}
    script.write_text(json.dumps({"turns": [turn]}), encoding="utf-8")
    ran = lamina_limited(
        "run", str(script), "--vault", str(vault), "--store", str(tmp_path / "st.sqlite"),
        "--conversation", "c1",
    )
    assert ran.returncode == 0, ran.stderr
    return tmp_path / "st.sqlite"


def test_export_of_a_non_utf8_note_name_replaces_the_file_with_the_terminal_text(
    saved: Path,
) -> None:
    """The file gets what stdout shows: the name's byte as its ``\\udcXX`` escape."""
    out = saved.parent / "out.md"
    out.write_text("an earlier export\n", encoding="utf-8")
    shown = lamina_limited("export", str(saved), "--conversation", "c1")
    assert shown.returncode == 0, shown.stderr
    assert "[Context: Notes: caf\\udce9.md]" in shown.stdout
    written = lamina_limited("export", str(saved), "--conversation", "c1", "--out", str(out))
    assert written.returncode == 0, written.stderr
    assert out.read_bytes() == shown.stdout.encode("utf-8")
    assert sorted(p.name for p in saved.parent.iterdir() if p.name.startswith(".")) == []


def _fsize_limited(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG, no kill


def test_export_onto_a_full_disk_leaves_the_earlier_file_as_it_was(saved: Path) -> None:
    """A write that fails midway (here: a 200 kB file size limit, the transcript is 300 kB)
    is one error line, and
    the file it was to replace keeps every byte; no temporary file is left behind."""
    out = saved.parent / "out.md"
    out.write_text("an earlier export\n", encoding="utf-8")
    ran = subprocess.run(
        [sys.executable, "-m", "lamina._cli", "export", str(saved), "--conversation", "c1",
         "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=90, check=False,
        preexec_fn=lambda: _fsize_limited(200_000),
    )
    assert_one_error_line(ran, "--out", "cannot write", "File too large")
    assert out.read_text(encoding="utf-8") == "an earlier export\n"
    assert [p.name for p in saved.parent.iterdir() if p.name.startswith(".")] == []


def test_write_atomic_keeps_the_mode_follows_symlinks_and_writes_devices_in_place(
    tmp_path: Path,
) -> None:
    target = tmp_path / "results.txt"
    target.write_text("old", encoding="utf-8")
    target.chmod(0o640)
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    assert write_atomic(link, "new \udcff") == target
    assert target.read_bytes() == b"new \\udcff"
    assert oct(target.stat().st_mode & 0o777) == "0o640"
    assert link.is_symlink()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    write_atomic(fifo, b"through the pipe")
    assert reader.communicate(timeout=10)[0] == b"through the pipe"
    with pytest.raises(ConfigError, match="--report.*cannot write"):
        write_atomic(target / "under-a-file", "x", option="--report")
