"""Hostile content from every source stays inside its block in the messages the model gets.

A note, a selection, a tool result, a web page, a PDF and a video transcript all carry the
same break-out corpus (closing tags of every block Lamina renders, CDATA ends, comment
openers, fake blocks and references); the reply carries it too. Lamina's own scanner must
find, in the system and user messages, exactly the blocks Lamina rendered.
"""

from __future__ import annotations

import html
import itertools
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fpdf import FPDF
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lamina import Conversation
from lamina.pipeline import Envelope, Form, check_envelope
from lamina.pipeline.text import markup_blocks, strip_reply
from lamina.pipeline.tools import tool
from lamina.processors import ProcessContext, Sources, Vault, note, pdf, selection, url, youtube
from tests.pipeline.test_markup import CORPUS
from tests.strategies import serve_site

# fpdf2's core fonts hold Latin-1 only, and a PDF's text layer drops line structure, so
# every source gets the ASCII part of the corpus as words on lines.
ASCII = [c for c in CORPUS if c.isascii() and c.strip()]
hostile = st.lists(st.sampled_from(ASCII), min_size=1, max_size=6).map(" ".join)
FILLER = "Operations are pushed in batches of five hundred and pulled by sequence number. "


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    root = tmp_path_factory.mktemp("breakout")
    (root / "site").mkdir()
    with serve_site(root / "site") as base:
        yield root, base


_counter = itertools.count()


def _write_sources(root: Path, text: str) -> str:
    n = next(_counter)
    (root / f"n{n}.md").write_text(f"# Note {n}\n\n{text}\n\n{FILLER}\n", encoding="utf-8")
    cues = "\n".join(
        f"00:00:{2 * i:02d}.000 --> 00:00:{2 * i + 1:02d}.000\n{line}\n"
        for i, line in enumerate([text, FILLER, text])
    )
    (root / f"t{n}.vtt").write_text("WEBVTT\n\n" + cues, encoding="utf-8")
    doc = FPDF()
    doc.set_creation_date(datetime(2026, 1, 1, tzinfo=UTC))
    doc.set_font("helvetica", size=10)
    doc.add_page()
    doc.multi_cell(0, 6, f"{text}\n{FILLER}")
    doc.output(str(root / f"p{n}.pdf"))
    page = (
        f"<html><head><title>Page {n}</title></head><body><article><h1>Page {n}</h1>"
        f"<p>{html.escape(text)}</p><p>{FILLER * 3}</p><p>{html.escape(text)}</p>"
        "</article></body></html>"
    )
    (root / "site" / f"w{n}.html").write_text(page, encoding="utf-8")
    return str(n)


def _assert_only_rendered_blocks(env: Envelope) -> None:
    """The scanner finds the L2 blocks in the system message and the L3 blocks in the
    user message, byte for byte, and nothing else."""
    system = [s.text for s in env.l2.segments]
    found = [env.system_text[b.start : b.end] for b in markup_blocks(env.system_text)]
    assert found == system
    user = [s.text for s in env.l3.segments if s.text]
    found = [env.user_text[b.start : b.end] for b in markup_blocks(env.user_text)]
    assert sorted(found) == sorted(user)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=hostile, reply=hostile)
def test_no_source_breaks_out(site: tuple[Path, str], text: str, reply: str) -> None:
    root, base = site
    n = _write_sources(root, text)
    conv = Conversation(
        "sys",
        sources=Sources(context=ProcessContext(vault=Vault(root), allow_private_network=True)),
    )
    attach = [
        note(f"n{n}.md"),
        selection(text, source=f"n{n}.md"),
        tool("search", {"q": n}, text),
        url(f"{base}/w{n}.html"),
        pdf(f"p{n}.pdf"),
        youtube("https://youtu.be/dQw4w9WgXcQ", transcript=f"t{n}.vtt"),
    ]
    first = conv.turn("What do these say?", attach=attach)
    check_envelope(first)
    _assert_only_rendered_blocks(first)
    bodies = [s for s in first.l3.segments if s.form is Form.FULL]
    assert len(bodies) == 6
    conv.reply(reply)
    second = conv.turn("And again?", attach=attach[:1])
    check_envelope(second, first)
    _assert_only_rendered_blocks(second)
    kept = second.history()[1][1]
    assert kept == (strip_reply(reply) if markup_blocks(reply) else reply)
    assert markup_blocks(kept) == []
