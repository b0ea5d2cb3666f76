"""Overlapping page ranges of one PDF: one library entry per page set, no page sent twice."""

from __future__ import annotations

import re
from pathlib import Path

from fpdf import FPDF

from lamina import Conversation
from lamina.pipeline.stages import format_pages, parse_pages
from lamina.processors import Sources, pdf


def write_pdf(path: Path, pages: int) -> None:
    doc = FPDF()
    doc.set_font("Helvetica", size=12)
    for n in range(1, pages + 1):
        doc.add_page()
        doc.multi_cell(0, 8, f"Text of page {n}.")
    path.write_bytes(bytes(doc.output()))


def sent_pages(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"Text of page (\d+)\.", text)]


def test_page_text_helpers_round_trip() -> None:
    assert parse_pages("1-3,7") == {1, 2, 3, 7}
    assert format_pages({7, 1, 2, 3}) == "1-3,7"


def test_overlapping_ranges_in_one_turn_send_each_page_once(tmp_path: Path) -> None:
    write_pdf(tmp_path / "a.pdf", 5)
    conv = Conversation(sources=Sources.for_vault(tmp_path))
    env = conv.turn("read", [pdf("a.pdf", "1-3"), pdf("a.pdf", "2-4"), pdf("a.pdf")])
    assert [s.key for s in env.l3.segments] == [
        "pdf:a.pdf#pages=1-3",
        "pdf:a.pdf#pages=4",
        "pdf:a.pdf#pages=5",
    ]
    assert sent_pages(env.user_text) == [1, 2, 3, 4, 5]
    assert [(d.target, d.to_form) for d in env.report.decisions if d.stage == "pages"] == [
        ("pdf:a.pdf#pages=2-4", "cut"),
        ("pdf:a.pdf", "cut"),
    ]


def test_pages_in_the_library_are_not_sent_again(tmp_path: Path) -> None:
    write_pdf(tmp_path / "a.pdf", 5)
    conv = Conversation(sources=Sources.for_vault(tmp_path))
    conv.turn("first", [pdf("a.pdf", "1-3")])
    second = conv.turn("more", [pdf("a.pdf", "2-5")])
    assert [s.key for s in second.l3.segments] == ["pdf:a.pdf#pages=4-5"]
    assert sent_pages(second.user_text) == [4, 5]
    assert 'pages-sent-before="2-3"' in second.user_text
    third = conv.turn("all", [pdf("a.pdf")])
    assert sent_pages(third.user_text) == []  # every page is in L2 already
    assert sorted(sent_pages(third.system_text)) == [1, 2, 3, 4, 5]
    assert [d.to_form for d in third.report.decisions if d.stage == "pages"] == ["dropped"]
