"""Hostile CLI input: one ``lamina: error:`` line, exit 2, no traceback, nothing changed."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from tests.cli import lamina

STRICT = {"PYTHONIOENCODING": "utf-8"}  # a UTF-8 terminal that refuses surrogates


def _one_error_line(out: object) -> str:
    assert out.returncode == 2, (out.stdout, out.stderr)  # type: ignore[attr-defined]
    lines = out.stderr.splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1 and lines[0].startswith("lamina: error: "), out.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in out.stderr and "Usage:" not in out.stderr  # type: ignore[attr-defined]
    return str(lines[0])


@pytest.fixture
def script(tmp_path: Path, vault: Path) -> Path:
    path = tmp_path / "chat.yaml"
    path.write_text(
        f"vault: {vault}\nturns:\n  - user: hi\n    attach: [{{note: project-spec.md}}]\n",
        encoding="utf-8",
    )
    return path


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "{script}", "--window", "lots"], "'--window': 'lots' is not a valid integer"),
        (["run"], "Missing argument 'SCRIPT'"),
        (["run", "{tmp}/missing.yaml"], "no such file"),
        (["run", "{script}", "--vault", "{script}"], "is a file"),
        (["run", "{script}", "--bogus"], "No such option"),
        (["bench", "--scale", "nope"], "'nope' is not one of"),
        (["nosuch"], "No such command"),
        (["run", "{script}", "--reserve", "10"], "--reserve: needs --window or --model"),
        (["run", "{script}", "--window", "-5"], "budget.context_window: must be at least 1"),
        (["run", "{script}", "--model", "gpt-4o", "--window", "0"], "must be at least 1"),
        (["resume", "{tmp}/none.db", "--conversation", "c", "--script", "{script}"], "no such"),
        (["export", "{tmp}/none.db", "--conversation", "c"], "no such store file"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(
    args: list[str], needle: str, script: Path, tmp_path: Path
) -> None:
    argv = [a.format(script=script, tmp=tmp_path) for a in args]
    assert needle in _one_error_line(lamina(*argv))


def test_help_still_prints_and_exits_0() -> None:
    out = lamina("run", "--help")
    assert out.returncode == 0 and "Usage:" in out.stdout


def test_foreign_sqlite_file_as_store_is_refused_byte_identical(
    script: Path, tmp_path: Path
) -> None:
    other = tmp_path / "app.db"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE settings (k TEXT, v TEXT)")
    db.commit()
    db.close()
    before = other.read_bytes()
    out = lamina("run", str(script), "--store", str(other))
    assert "not a Lamina store" in _one_error_line(out)
    assert other.read_bytes() == before


@pytest.fixture
def odd_vault(tmp_path: Path) -> Path:
    """A vault folder and a note whose names are not valid UTF-8 (Latin-1 bytes)."""
    root = Path(os.fsdecode(os.fsencode(tmp_path) + b"/v\xe9"))
    root.mkdir()
    (root / os.fsdecode(b"caf\xe9.md")).write_text("# Cafe\n\nhello\n", encoding="utf-8")
    return root


def _odd_script(tmp_path: Path) -> Path:
    path = tmp_path / "odd.json"
    path.write_text('{"turns": [{"user": "hi", "attach": [{"folder": "."}]}]}', encoding="utf-8")
    return path


def test_non_utf8_names_in_json_trace(tmp_path: Path, odd_vault: Path) -> None:
    out = lamina("run", str(_odd_script(tmp_path)), "--vault", str(odd_vault), "--json", env=STRICT)
    assert out.returncode == 0, out.stderr
    trace = json.loads(out.stdout)
    keys = [s["key"] for s in trace["turns"][0]["layers"]["L3"]["segments"]]
    assert keys == ["note:" + os.fsdecode(b"caf\xe9.md")]  # the same str the file system gave


def test_non_utf8_names_in_table_output(tmp_path: Path, odd_vault: Path) -> None:
    out = lamina("run", str(_odd_script(tmp_path)), "--vault", str(odd_vault), env=STRICT)
    assert out.returncode == 0, out.stderr
    assert "note:caf\\udce9.md" in out.stdout


def test_non_utf8_names_with_store(tmp_path: Path, odd_vault: Path) -> None:
    store = os.fsdecode(os.fsencode(tmp_path) + b"/st\xff.db")
    script = _odd_script(tmp_path)
    out = lamina(
        "run", str(script), "--vault", str(odd_vault), "--store", store, "--conversation", "c",
        "--json", env=STRICT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["conversation_id"] == "c"
    exported = lamina("export", store, "--conversation", "c", env=STRICT)
    assert exported.returncode == 0, exported.stderr
    assert "**user**: hi" in exported.stdout
    more = tmp_path / "more.json"
    more.write_text('{"turns": [{"user": "more"}]}', encoding="utf-8")
    again = lamina("resume", store, "--conversation", "c", "--script", str(more), env=STRICT)
    assert again.returncode == 0, again.stderr
