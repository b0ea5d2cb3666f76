"""The HTML report as written: deterministic, self-contained, escaped, small at 200 turns."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lxml.html

from lamina import Conversation
from lamina.pipeline import Budget, Envelope, SystemPrompt
from lamina.processors import note
from lamina.renderers import prefix_reports, render_report, report_blocks, trace_document, xml_safe
from tests.conftest import write_vault

HOSTILE = (
    "</pre></svg></details><script>alert(1)</script><!-- x --> "
    "\"' onmouseover=\"alert(2)\" <img src=x onerror=alert(3)> & &amp; \x0b end"
)


def _trace(conv: Conversation, envelopes: list[Envelope]) -> dict[str, Any]:
    trace = trace_document(envelopes, conv.counter)
    for turn, report in zip(trace["turns"], prefix_reports(envelopes, conv.counter), strict=True):
        turn["cache"] = report.trace()
    return trace


def _conversation(
    vault: Path, turns: int
) -> tuple[Conversation, list[Envelope], dict[str, Any]]:
    body = "Sync keeps devices in step. " * 40
    notes = {f"n{i:03}.md": f"# Note {i}\n\n{body}" for i in range(turns)}
    write_vault(vault, notes)
    conv = Conversation(
        SystemPrompt("You are terse.", mutable="Memory: metric units."),
        vault=vault,
        budget=Budget(context_window=16_000, reserve_output=2_000),
    )
    envelopes: list[Envelope] = []
    for i in range(turns):
        envelopes.append(conv.turn(f"What does note {i} say?", attach=[note(f"n{i:03}.md")]))
        conv.reply(f"Note {i} says sync keeps devices in step.")
    return conv, envelopes, _trace(conv, envelopes)


def test_report_is_byte_identical_for_the_same_trace(tmp_path: Path) -> None:
    _, envelopes, trace = _conversation(tmp_path / "v", 3)
    first = render_report(trace, report_blocks(envelopes))
    assert first == render_report(trace, report_blocks(envelopes))
    assert first.startswith("<!DOCTYPE html>")


def test_report_loads_nothing_and_carries_no_script(tmp_path: Path) -> None:
    _, envelopes, trace = _conversation(tmp_path / "v", 3)
    html = render_report(trace, report_blocks(envelopes))
    doc = lxml.html.document_fromstring(html)
    assert doc.xpath("//script") == []
    assert doc.xpath("//@src") == []
    assert all(href.startswith("#") for href in doc.xpath("//a/@href"))
    assert "url(" not in html and "@import" not in html
    (csp,) = doc.xpath("//meta[@http-equiv='Content-Security-Policy']/@content")
    assert csp.startswith("default-src 'none'")


def test_hostile_block_text_is_serialized_as_text(tmp_path: Path) -> None:
    """Parsed back, the hostile text is the text of its <pre>, and no element was injected."""
    trace = {
        "lamina_trace": 1,
        "tokenizer": "o200k_base",
        "turns": [
            {
                "turn": 1,
                "tokens_total": 40,
                "layers": {
                    "L5": {
                        "tokens": 30,
                        "segments": [
                            {
                                "key": HOSTILE,
                                "source_type": HOSTILE,
                                "form": "text",
                                "content_hash": "00",
                                "tokens": 30,
                            }
                        ],
                    }
                },
                "cache": {"common_prefix_tokens": 0, "break_reason": HOSTILE},
                "warnings": [HOSTILE],
                "budget": {
                    "window": 100,
                    "reserve_output": 10,
                    "used": 40,
                    "decisions": [
                        {"target": HOSTILE, "from": "full", "to": HOSTILE, "tokens_saved": 1,
                         "reason": HOSTILE}
                    ],
                },
            }
        ],
    }
    html = render_report(trace, {(1, "L5", HOSTILE): HOSTILE}, title=HOSTILE)
    doc = lxml.html.document_fromstring(html)
    expected = xml_safe(HOSTILE)  # a control character becomes its visible picture
    assert doc.xpath("//script") == [] and doc.xpath("//img") == []
    assert doc.xpath("//@onmouseover | //@onerror") == []
    assert [pre.text_content() for pre in doc.xpath("//pre")] == [expected]
    assert len(doc.xpath("//svg")) == 2
    assert expected in doc.xpath("//svg//g[@class='break']/title")[0].text_content()
    assert doc.xpath("//svg//g[@class='break']/@data-reason")[0] == expected


def test_messages_the_last_request_sent_the_same_are_one_line(tmp_path: Path) -> None:
    """A batch's messages the request before sent the same, before its own turn's, are one
    line; the one it ended with is listed once, as the deferred message it now is (a
    batch of 200 turns listed every message in each turn: 7 MB)."""
    _, envelopes, trace = _conversation(tmp_path / "v", 3)
    doc = lxml.html.document_fromstring(render_report(trace, report_blocks(envelopes)))
    items = [
        li.text_content()
        for li in doc.xpath("//section[@id='turn-3']//details[@class='messages']/ol/li")
    ]
    assert items[:2] == [
        "system · 37 characters · L1 and the library (0 of 2 entries): You are terse. "
        "Memory: metric units.",
        "2 messages as the last request sent them · 1,272 characters",
    ]
    assert items[2].startswith(
        "user · 1,233 characters · turn 2's message with the context it attached (deferred): "
    )
    assert items[3:4] == ["1 history message (L4: earlier queries and replies) · 39 characters"]
    assert items[4].startswith("user · 1,233 characters · this turn's context (L3) and query")
    assert len(items) == 5


def test_two_hundred_turn_report_size_and_write_time(tmp_path: Path) -> None:
    """Figures for the issue's note (printed with -s); the size stays under a few MB."""
    _, envelopes, trace = _conversation(tmp_path / "v", 200)
    out = tmp_path / "report.html"
    start = time.perf_counter()
    out.write_text(render_report(trace, report_blocks(envelopes)), encoding="utf-8")
    seconds = time.perf_counter() - start
    size = out.stat().st_size
    print(f"\n200-turn report: {size:,} bytes written in {seconds * 1000:.0f} ms")
    doc = lxml.html.document_fromstring(out.read_bytes())
    assert len(doc.xpath("//svg[contains(@class, 'window-chart')]/g[@class='turn']")) == 200
    assert len(doc.xpath("//section[@class='turn']")) == 200
    assert size < 5_000_000


def test_a_break_is_explained_from_the_library_entrys_own_chain_of_cuts() -> None:
    """The library entry's cuts (preview -> summary -> stub) make the sentence; a cut of
    this turn's item of the same key (full -> preview) is not part of it."""
    from lamina.renderers import explain_cache

    turn = {
        "turn": 4,
        "tokens_total": 3000,
        "cache": {"common_prefix_tokens": 80, "break_reason": "l2-compacted:note:a.md"},
        "budget": {
            "decisions": [
                {"target": "note:a.md", "from": "preview", "to": "summary", "tokens_saved": 900,
                 "action": "compacted"},
                {"target": "note:a.md", "from": "summary", "to": "evicted", "tokens_saved": 200,
                 "action": "evicted"},
                {"target": "note:a.md", "from": "full", "to": "preview", "tokens_saved": 700,
                 "action": "compacted"},
            ]
        },
    }
    assert explain_cache(turn) == (
        "The budget cut library entry note:a.md from preview to a stub (key, title and where "
        "to find it) (saving 1,100 tokens) to fit this turn in the window, so the request is "
        "sent uncached from there on.",
    )


def test_a_batch_settled_for_an_entry_given_back_says_so() -> None:
    """A request the batch settles because the budget gave back an entry of the library's
    deferred growth says why, and what the system message took."""
    from lamina.renderers import explain_cache

    previous = {"turn": 3, "layers": {"L2": {"segments": []}}, "batch": {"settled_entries": 0}}
    turn = {
        "turn": 4,
        "tokens_total": 1108,
        "cache": {"common_prefix_tokens": 11, "break_reason": "library-settled"},
        "layers": {"L2": {"segments": [{"key": "note:atlas.md"}, {"key": "note:survey.md"}]}},
        "batch": {"settled": "given-back", "settled_entries": 2},
    }
    assert explain_cache(turn, previous) == (
        "The library's deferred growth settled because the budget gave back whole an entry an "
        "earlier user message sent cut: the library in the system message took 2 entries "
        "(note:atlas.md, note:survey.md) and the earlier user messages that carried context "
        "are sent as their bare queries, so the request repeats the one before only up to "
        "there (11 of 1,108 tokens).",
    )
