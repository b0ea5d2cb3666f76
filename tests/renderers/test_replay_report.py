"""The replay run's HTML report as written: charts whose columns are the results, literal
summary rows, worst-conversation links, escaped names, nothing loaded."""

from __future__ import annotations

from typing import Any

import lxml.html
import pytest

from lamina.renderers import render_replay_report, xml_safe
from tests.renderers.test_report import HOSTILE


def _bill(model: str, sent: int, cached: int, cost: float, usd: float | None = None) -> Any:
    return {"model": model, "input_tokens": sent, "cached_tokens": cached,
            "written_tokens": 0, "cost": cost, "usd": usd}


def _row(conversation: str, config: str, sent: int, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "conversation": conversation, "config": config, "source": "script", "status": "ok",
        "turns": 3, "recorded_turns": 3, "tokens_sent": sent, "peak_tokens": sent // 2,
        "providers": {
            "openai": _bill("gpt-4.1", sent, sent // 4, sent * 0.875, sent * 2e-6),
            "anthropic": _bill("claude-sonnet-4-5", sent + 9, sent // 2, sent * 0.6),
        },
        "decisions": {}, "invariants": "ok", "errors": [], "unrebuilt": [],
    }
    row.update(extra)
    return row


RESULTS = [
    _row("a.yaml", "pin", 1000),
    _row("a.yaml", "tight", 800),
    _row(HOSTILE, "pin", 3000),
    _row(HOSTILE, "tight", 2000, invariants={"turn": 2, "invariant": 3, "message": HOSTILE}),
    _row("z.yaml", "pin", 0, status="error", turns=0, providers={},
         errors=[{"turn": 1, "type": "ScriptError", "message": f"bad {HOSTILE}"}]),
    _row("z.yaml", "tight", 0, status="error", turns=0, providers={},
         errors=[{"turn": 1, "type": "ScriptError", "message": "bad"}]),
]


def _config(sent: int, openai: tuple[float, float], anthropic: float) -> dict[str, Any]:
    return {
        "conversations": 3, "errors": 1, "invariant_failures": 0,
        "conversations_with_unrebuilt": 0, "turns": 6, "tokens_sent": sent,
        "tokens_per_conversation": {"p50": sent // 4, "p90": sent * 3 // 4, "p99": sent},
        "peak_tokens": sent // 2, "decisions": {},
        "providers": {
            "anthropic": {"model": "claude-sonnet-4-5", "input_tokens": sent,
                          "cached_tokens": sent // 2, "cached_share": 0.5, "cost": anthropic,
                          "usd": None, "cost_per_conversation": {}},
            "openai": {"model": "gpt-4.1", "input_tokens": sent, "cached_tokens": sent // 4,
                       "cached_share": 0.25, "cost": openai[0], "usd": openai[1],
                       "cost_per_conversation": {}},
        },
    }


SUMMARY = {
    "lamina_replay_summary": 1, "conversations": 3, "compared": 2,
    "configs": {"pin": _config(4000, (3500.0, 0.008), 2400.0),
                "tight": _config(2800, (2450.0, 0.0056), 1680.0)},
    "winners": {"anthropic": "tight", "openai": "tight"},
}
WORST = {
    "pin": [{"conversation": "z.yaml", "why": f"error at turn 1: ScriptError: bad {HOSTILE}",
             "href": None},
            {"conversation": HOSTILE, "why": "3,000 tokens sent", "href": "r_files/1-2-x.html"}],
    "tight": [],
}


@pytest.fixture(scope="module")
def html() -> str:
    return render_replay_report(RESULTS, SUMMARY, WORST, title="Replay <b>&")


@pytest.fixture(scope="module")
def doc(html: str) -> Any:
    return lxml.html.document_fromstring(html)


def test_one_chart_per_config_with_a_column_per_result(doc: Any) -> None:
    charts = doc.xpath("//svg[contains(@class, 'config-chart')]")
    assert [c.get("data-config") for c in charts] == ["pin", "tight"]
    for chart in charts:
        rows = [r for r in RESULTS if r["config"] == chart.get("data-config")]
        groups = chart.xpath("./g[@class='conversation']")
        assert [g.get("data-conversation") for g in groups] == [
            xml_safe(r["conversation"]) for r in rows
        ]
        sent = [int(g.get("data-tokens-sent")) for g in groups]
        assert sent == [r["tokens_sent"] for r in rows]
        assert int(chart.get("data-tokens-sent")) == sum(sent)
        for provider in ("openai", "anthropic"):
            cached = chart.xpath(f".//rect[@class='share'][@data-provider='{provider}']")
            costs = chart.xpath(f".//rect[@class='cost'][@data-provider='{provider}']")
            bills = [r["providers"][provider] for r in rows if r["providers"]]
            assert [int(r.get("data-cached")) for r in cached] == [
                b["cached_tokens"] for b in bills
            ]
            assert [float(r.get("data-cost")) for r in costs] == [b["cost"] for b in bills]
        assert [g.get("data-status") for g in groups] == (
            ["ok", "ok", "failed"] if chart.get("data-config") == "pin" else ["ok", "failed",
                                                                             "failed"]
        )


def test_summary_rows_are_the_summary_json(doc: Any) -> None:
    rows = [[td.text_content() for td in tr.xpath("./td")]
            for tr in doc.xpath("//table[@class='summary']/tbody/tr")]
    assert rows == [
        ["pin", "2", "1", "0", "6", "4,000", "1,000", "3,000", "2,400 tok-eq (50%)",
         "$0.0080 (25%)"],
        ["tight", "2", "1", "0", "6", "2,800", "700", "2,100", "* 1,680 tok-eq (50%)",
         "* $0.0056 (25%)"],
    ]
    assert [h.text_content() for h in doc.xpath("//table[@class='summary']//th")][-2:] == [
        "anthropic cost (cached)", "openai cost (cached)"
    ]


def test_worst_conversations_link_to_their_reports(doc: Any) -> None:
    pin = doc.xpath("//section[@id='config-1']//ol[@class='worst']/li")
    assert [li.text_content() for li in pin] == [
        f"z.yaml (column 3) · error at turn 1: ScriptError: bad {xml_safe(HOSTILE)} "
        "(no report: no turn replayed)",
        f"{xml_safe(HOSTILE)} (column 2) · 3,000 tokens sent",
    ]
    assert [a.get("href") for a in doc.xpath("//ol[@class='worst']//a")] == ["r_files/1-2-x.html"]
    assert doc.xpath("//section[@id='config-2']/p[@class='note']/text()")[-1] == (
        "No conversations to list."
    )


def test_names_and_messages_stay_text(html: str, doc: Any) -> None:
    assert doc.xpath("//script | //img | //comment() | //@src") == []
    assert [e.tag for e in doc.iter() if any(a.startswith("on") for a in e.attrib)] == []
    titles = doc.xpath("//svg//g[@data-status='failed']/g[@class='failed']/title/text()")
    assert titles == [
        f"z.yaml: error at turn 1: ScriptError: bad {xml_safe(HOSTILE)}",
        f"{xml_safe(HOSTILE)}: invariant 3 broke at turn 2: {xml_safe(HOSTILE)}",
        "z.yaml: error at turn 1: ScriptError: bad",
    ]
    assert doc.xpath("//title/text()")[0] == "Replay <b>&"
    assert "<script>" not in html


def test_the_page_is_deterministic_and_loads_nothing(html: str, doc: Any) -> None:
    assert html == render_replay_report(RESULTS, SUMMARY, WORST, title="Replay <b>&")
    assert html.startswith("<!DOCTYPE html>")
    (csp,) = doc.xpath("//meta[@http-equiv='Content-Security-Policy']/@content")
    assert csp == "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
    assert "http://" not in html and "https://" not in html
