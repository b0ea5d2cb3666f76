"""The hostile corpus through the CLI: exit 2, one ``lamina: error:`` line, no traceback,
within 1 GiB of address space and 60 s of CPU (a note's bad frontmatter: a warning, the
note kept)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tests.hostile.corpus import (
    BIG_INT,
    alias_bomb,
    assert_one_error_line,
    deep_block,
    deep_flow,
    lamina_limited,
)

VIDEO = "https://youtu.be/dQw4w9WgXcQ"

SCRIPTS = {
    "bomb.yaml": (alias_bomb() + "turns: [{user: hi}]\n", "aliases are expanded"),
    "deep-flow.yaml": (deep_flow(), "nest"),
    "deep-block.yaml": (deep_block(), "nested deeper than 64 levels"),
    "recursive.yaml": ("a: &a [*a]\nturns: [{user: hi}]\n", "recursive alias"),
    "deep.json": (deep_flow(), "nested deeper than 64 levels"),
    "bigint.yaml": (f"turns: [{{user: hi, reply: {BIG_INT}}}]\n", "5,000 digits"),
    "bigint.json": (f'{{"turns": [{{"user": "hi", "reply": {BIG_INT}}}]}}', "5,000 digits"),
    "infinity.json": ('{"turns": [{"user": "hi", "reply": Infinity}]}', "Infinity"),
    "infinity.yaml": ("turns: [{user: hi, reply: .inf}]\n", "finite"),
    "huge.yaml": ("turns: [{user: '" + "x" * 4_100_000 + "'}]\n", "over 4,000,000 bytes"),
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_hostile_script_is_one_error_line(tmp_path: Path, name: str) -> None:
    text, fragment = SCRIPTS[name]
    script = tmp_path / name
    script.write_text(text, encoding="utf-8")
    assert_one_error_line(lamina_limited("run", str(script)), name, fragment)


def test_script_that_is_a_fifo_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "script.yaml"
    os.mkfifo(fifo)
    assert_one_error_line(lamina_limited("run", str(fifo)), "not a regular file")


def test_script_that_is_a_device_is_refused(tmp_path: Path) -> None:
    assert_one_error_line(lamina_limited("run", "/dev/zero"), "not a regular file")


def _run(tmp_path: Path, attach: list[dict[str, str]]) -> tuple[Path, Path]:
    vault = tmp_path / "vault"
    vault.mkdir(exist_ok=True)
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"turns": [{"user": "q", "attach": attach}]}), encoding="utf-8")
    return vault, script


NOTES = {
    "bomb": alias_bomb(),
    "deep": deep_block(200),
    "bigint": f"id: {BIG_INT}\n",
    "infinity": "rating: .inf\n",
    "recursive": "a: &a [*a]\n",
}


@pytest.mark.parametrize("name", sorted(NOTES))
def test_note_with_hostile_frontmatter_is_kept_with_a_warning(tmp_path: Path, name: str) -> None:
    vault, script = _run(tmp_path, [{"note": f"{name}.md"}])
    (vault / f"{name}.md").write_text(f"---\n{NOTES[name]}---\nBODY-{name}\n", encoding="utf-8")
    result = lamina_limited("run", str(script), "--vault", str(vault), "--full")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert f"BODY-{name}" in result.stdout
    (warning,) = result.stderr.splitlines()
    prefix = f"lamina: warning: turn 1: note:{name}.md: malformed YAML frontmatter"
    assert warning.startswith(prefix)
    assert warning.endswith("[frontmatter-malformed]")


def test_note_with_an_impossible_date_keeps_it_as_text(tmp_path: Path) -> None:
    vault, script = _run(tmp_path, [{"note": "d.md"}])
    (vault / "d.md").write_text("---\ntitle: Dated\ndate: 2024-13-45\n---\nBODY\n", "utf-8")
    result = lamina_limited("run", str(script), "--vault", str(vault), "--full")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "BODY" in result.stdout
    assert "date: 2024-13-45" in result.stdout  # a property, as written
    assert result.stderr == ""


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _char_device(path: Path) -> None:
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # the /dev/zero device
    except PermissionError:
        pytest.skip("creating a device node needs CAP_MKNOD")


SPECIAL = {
    "fifo.pdf": (_fifo, {"pdf": "x.pdf"}),
    "fifo.vtt": (_fifo, {"youtube": VIDEO, "transcript": "x.vtt"}),
    "fifo.json": (_fifo, {"youtube": VIDEO, "transcript": "x.json"}),
    "device.vtt": (_char_device, {"youtube": VIDEO, "transcript": "x.vtt"}),
    "device.pdf": (_char_device, {"pdf": "x.pdf"}),
}


@pytest.mark.parametrize("name", sorted(SPECIAL))
def test_special_file_in_the_vault_is_refused(tmp_path: Path, name: str) -> None:
    make, spec = SPECIAL[name]
    vault, script = _run(tmp_path, [spec])
    make(vault / ("x" + Path(name).suffix))
    result = lamina_limited("run", str(script), "--vault", str(vault))
    assert_one_error_line(result, "not a regular file")


TRANSCRIPTS = {
    "infinity": ('{"duration": Infinity, "cues": [{"start": 0, "text": "hi"}]}', "Infinity"),
    "overflow": ('[{"start": 1e999, "text": "hi"}]', "out of range"),
    "huge-start": ('[{"start": 1e300, "text": "hi"}]', "needs a 'text' string and a 'start'"),
    "bigint": (f'[{{"start": {BIG_INT}, "text": "hi"}}]', "5,000 digits"),
    "deep": (deep_flow(), "nested deeper"),
}


@pytest.mark.parametrize("name", sorted(TRANSCRIPTS))
def test_hostile_json_transcript_is_one_error_line(tmp_path: Path, name: str) -> None:
    text, fragment = TRANSCRIPTS[name]
    vault, script = _run(tmp_path, [{"youtube": VIDEO, "transcript": "t.json"}])
    (vault / "t.json").write_text(text, encoding="utf-8")
    result = lamina_limited("run", str(script), "--vault", str(vault))
    assert_one_error_line(result, "t.json", fragment)


FRONTMATTER = {
    "bomb": (alias_bomb(), "aliases are expanded"),
    "deep": (deep_block(100), "nested deeper than 16 levels"),
    "epoch-huge": (f"epoch: {BIG_INT}\n", "is not a time in milliseconds"),
    "epoch-far": ("epoch: 99999999999999999\n", "is not a time in milliseconds"),
    "epoch-year": ("epoch: 9999999999999999\n", "is not a time in milliseconds"),
}


@pytest.mark.parametrize("name", sorted(FRONTMATTER))
def test_hostile_transcript_frontmatter_is_one_error_line(tmp_path: Path, name: str) -> None:
    front, fragment = FRONTMATTER[name]
    transcript = tmp_path / "chat.md"
    transcript.write_text(f"---\n{front}---\n\n**user**: hi\n", encoding="utf-8")
    vault = tmp_path / "vault"
    vault.mkdir()
    result = lamina_limited(
        "import", str(transcript), "--store", str(tmp_path / "s.db"), "--vault", str(vault)
    )
    assert_one_error_line(result, "chat.md", fragment)
    assert not (tmp_path / "s.db").exists() or result.returncode == 2
