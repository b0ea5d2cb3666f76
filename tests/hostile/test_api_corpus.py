"""The hostile corpus through the Python API: a LaminaError subclass, and the conversation
exactly as a twin that never saw the bad turn, and still usable."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lamina import Conversation, load_script
from lamina.pipeline import LaminaError
from lamina.pipeline._model.tools import canonical_args
from lamina.pipeline.errors import (
    AttachmentError,
    ChatTranscriptError,
    PdfError,
    ScriptError,
    TranscriptError,
)
from lamina.pipeline.store import parse_transcript
from lamina.processors import note, pdf, youtube
from lamina.processors._notes import parse_note
from tests.hostile.corpus import BIG_INT, alias_bomb, deep_block, deep_flow

VIDEO = "https://youtu.be/dQw4w9WgXcQ"


def _vault(tmp_path: Path) -> Path:
    vault = tmp_path / "vault"
    vault.mkdir()
    (vault / "ok.md").write_text("# OK\n\nA note that is fine.\n", encoding="utf-8")
    return vault


def _state(env: Any) -> tuple[int, str, str, Any]:
    return env.turn, env.system_text, env.user_text, env.history()


def _assert_unchanged_and_usable(conv: Conversation, vault: Path) -> None:
    """The next turn equals the same turn of a twin conversation that never saw the failure."""
    twin = Conversation("You are terse.", vault=vault)
    twin.turn("first", [note("ok.md")])
    twin.reply("fine")
    expected = twin.turn("next", [note("ok.md")])
    assert _state(conv.turn("next", [note("ok.md")])) == _state(expected)


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _device(path: Path) -> None:
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("creating a device node needs CAP_MKNOD")


def _write(text: str) -> Callable[[Path], None]:
    return lambda path: path.write_text(text, encoding="utf-8")


ATTACHMENTS: dict[str, tuple[str, Callable[[Path], None], Any, type[LaminaError]]] = {
    "fifo-pdf": ("x.pdf", _fifo, pdf("x.pdf"), PdfError),
    "device-pdf": ("x.pdf", _device, pdf("x.pdf"), PdfError),
    "fifo-vtt": ("x.vtt", _fifo, youtube(VIDEO, "x.vtt"), TranscriptError),
    "device-vtt": ("x.vtt", _device, youtube(VIDEO, "x.vtt"), TranscriptError),
    "fifo-note": ("x.md", _fifo, note("x.md"), AttachmentError),
    "infinity-json": (
        "x.json",
        _write('{"duration": Infinity, "cues": [{"start": 0, "text": "hi"}]}'),
        youtube(VIDEO, "x.json"),
        TranscriptError,
    ),
    "bigint-json": (
        "x.json",
        _write(f'[{{"start": {BIG_INT}, "text": "hi"}}]'),
        youtube(VIDEO, "x.json"),
        TranscriptError,
    ),
    "deep-json": ("x.json", _write(deep_flow()), youtube(VIDEO, "x.json"), TranscriptError),
}


@pytest.mark.parametrize("name", sorted(ATTACHMENTS))
def test_hostile_attachment_raises_a_typed_error_and_changes_nothing(
    tmp_path: Path, name: str
) -> None:
    file_name, make, spec, error = ATTACHMENTS[name]
    vault = _vault(tmp_path)
    make(vault / file_name)
    conv = Conversation("You are terse.", vault=vault)
    conv.turn("first", [note("ok.md")])
    conv.reply("fine")
    with pytest.raises(error):
        conv.turn("bad", [spec])
    _assert_unchanged_and_usable(conv, vault)


@pytest.mark.parametrize(
    ("front", "problem"),
    [
        (alias_bomb(), "aliases are expanded"),
        (deep_block(200), "nested deeper"),
        (f"id: {BIG_INT}", "5,000 digits"),
        ("a: &a [*a]", "recursive alias"),
        ("rating: .inf", "finite"),
    ],
)
def test_hostile_frontmatter_is_a_warning_and_the_note_is_kept(front: str, problem: str) -> None:
    payload, warnings = parse_note("n.md", f"---\n{front}\n---\nBODY\n")
    assert payload.body_text.endswith("BODY\n")
    (warning,) = warnings
    assert warning.code == "frontmatter-malformed"
    assert warning.message.startswith("malformed YAML frontmatter")
    assert problem in warning.message


def test_impossible_date_in_frontmatter_stays_text() -> None:
    payload, warnings = parse_note("n.md", "---\ntitle: 2024-13-45\n---\nBODY\n")
    assert warnings == ()
    assert payload.title == "2024-13-45"


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("bomb.yaml", alias_bomb() + "turns: [{user: hi}]\n"),
        ("deep.yaml", deep_flow()),
        ("deep.json", deep_flow()),
        ("int.yaml", f"turns: [{{user: hi, reply: {BIG_INT}}}]"),
        ("inf.json", '{"turns": [{"user": "hi", "reply": NaN}]}'),
    ],
)
def test_hostile_script_raises_script_error(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / name).write_text(text, encoding="utf-8")
    with pytest.raises(ScriptError):
        load_script(tmp_path / name)


@pytest.mark.parametrize(
    "front",
    [alias_bomb(), deep_block(50), f"epoch: {BIG_INT}\n", "epoch: 99999999999999999\n"],
)
def test_hostile_transcript_frontmatter_raises_chat_transcript_error(front: str) -> None:
    with pytest.raises(ChatTranscriptError):
        parse_transcript(f"---\n{front}---\n\n**user**: hi\n", "chat.md")


@pytest.mark.parametrize(
    "args", [deep_flow(), '{"n": ' + BIG_INT + "}", '{"x": Infinity}', '{"x": NaN}']
)
def test_hostile_tool_arguments_raise_attachment_error(args: str) -> None:
    with pytest.raises(AttachmentError):
        canonical_args(args)


def test_deeply_nested_tool_argument_object_raises_attachment_error() -> None:
    value: dict[str, Any] = {}
    for _ in range(100_000):
        value = {"a": value}
    with pytest.raises(AttachmentError):
        canonical_args(value)
