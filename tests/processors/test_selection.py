"""Selected text: a non-recoverable artifact keyed by its content hash."""

from __future__ import annotations

import re

import pytest

from lamina.pipeline._errors import AttachmentError
from lamina.pipeline._hashing import content_hash
from lamina.processors._context import ProcessContext
from lamina.processors._selection import SelectionPayload, SelectionProcessor, selection


def test_selection_key_is_the_first_16_hex_of_the_payload_hash() -> None:
    out = SelectionProcessor().process(selection("some text"), ProcessContext())
    (art,) = out.artifacts
    assert re.fullmatch(r"selection:[0-9a-f]{16}", art.key)
    assert art.key == f"selection:{content_hash(SelectionPayload('some text'))[:16]}"
    assert art.source_type == "selection"
    assert art.recoverable is False


def test_same_selection_same_key_and_source_changes_it() -> None:
    proc, ctx = SelectionProcessor(), ProcessContext()
    a = proc.process(selection("t", "a.md", (1, 2)), ctx).artifacts[0]
    b = proc.process(selection("t", "a.md", [1, 2]), ctx).artifacts[0]
    c = proc.process(selection("t", "b.md", (1, 2)), ctx).artifacts[0]
    assert a == b
    assert a.key != c.key


def test_title_and_attributes() -> None:
    bare = SelectionPayload("x")
    full = SelectionPayload("x", "docs/a.md", (3, 7))
    assert (bare.title, bare.attributes()) == ("selection", ())
    assert full.title == "selection from docs/a.md"
    assert full.attributes() == (("source", "docs/a.md"), ("lines", "3-7"))
    assert SelectionPayload("x", lines=(1, 1)).attributes() == (("lines", "1-1"),)


def test_replace_text_maps_the_text() -> None:
    payload = SelectionPayload("a@b.c", "s.md")
    assert payload.replace_text(str.upper) == SelectionPayload("A@B.C", "s.md")


def test_script_form_parses() -> None:
    spec = SelectionProcessor().parse({"selection": "txt", "source": "a.md", "lines": [1, 3]})
    assert spec == selection("txt", "a.md", (1, 3))
    assert spec.kind == "selection"
    assert "a.md" in spec.describe()


@pytest.mark.parametrize(
    "data",
    [
        {"selection": ""},
        {"selection": "  \n"},
        {"selection": 5},
        {"selection": "t", "source": ""},
        {"selection": "t", "source": 3},
        {"selection": "t", "lines": [3, 1]},
        {"selection": "t", "lines": [0, 2]},
        {"selection": "t", "lines": [1]},
        {"selection": "t", "lines": [1, "2"]},
        {"selection": "t", "lines": [True, 2]},
        {"selection": "t", "lines": "1-2"},
        {"selection": "t", "line": [1, 2]},
    ],
)
def test_invalid_selections_are_attachment_errors(data: dict[str, object]) -> None:
    with pytest.raises(AttachmentError):
        SelectionProcessor().parse(data)
