"""The HTML report of a replay run: per config, tokens sent, cached share and cost of every
conversation of the corpus, and links to the worst conversations' own reports.

Built from JSON only (the results file's lines and the run's summary), like the
conversation report is built from the trace, and with the same machinery: one lxml tree
serialized once (conversation ids, config names and error messages are escaped by the
serializer), inline CSS and SVG, no script, a Content-Security-Policy that loads nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from lxml import etree

from lamina.renderers._report import _CSP, _CSS, _W, E, _card, _f, _legend, _n, _step, _t

__all__ = ["PROVIDER_COLOURS", "render_replay_report"]

PROVIDER_COLOURS: dict[str, str] = {
    "openai": "#4e79a7",
    "anthropic": "#f28e2b",
    "gemini": "#59a14f",
}
_OTHER_COLOURS = ("#b07aa1", "#e15759", "#76b7b2", "#9c755f")
_SENT = "#8795a1"

_LEFT, _RIGHT, _TOP = 72, 24, 26
_PLOT_W = _W - _LEFT - _RIGHT
_PANEL_H, _GAP = 120, 44
_PANELS = ("tokens sent", "cached share", "cost")
_H = _TOP + len(_PANELS) * (_PANEL_H + _GAP) - 8

_REPLAY_CSS = """
svg .sent { fill:#8795a1; }
svg .failed path { fill:#c92a2a; }
svg .panel-title { font-weight:600; fill:#1f2933; }
svg g.conversation:hover rect { opacity:.75; }
ol.worst li { margin:3px 0; }
ol.worst a { color:var(--accent); }
td.star { color:#2b8a3e; font-weight:600; }
section.config { border-top:1px solid var(--line); margin-top:18px; }
"""


def _colour(provider: str, providers: Sequence[str]) -> str:
    known = PROVIDER_COLOURS.get(provider)
    if known is not None:
        return known
    others = [p for p in providers if p not in PROVIDER_COLOURS]
    return _OTHER_COLOURS[others.index(provider) % len(_OTHER_COLOURS)]


def _money(usd: float | None, cost: float) -> str:
    """Dollars when priced, else input-token equivalents."""
    return f"${usd:,.4f}" if usd is not None else f"{cost:,.0f} tok-eq"


def _share(cached: int, sent: int) -> float:
    return cached / sent if sent else 0.0


class _Panel:
    """One of a chart's three stacked panels: conversation index and value to coordinates."""

    def __init__(self, index: int, count: int, top: float) -> None:
        self.y0 = _TOP + index * (_PANEL_H + _GAP)
        self.top = top if top > 0 else 1.0
        self.slot = _PLOT_W / max(count, 1)

    def x(self, i: int) -> float:
        return _LEFT + i * self.slot

    def bar(self) -> float:
        return min(max(self.slot * 0.72, 1.0), 64.0)

    def y(self, value: float) -> float:
        return self.y0 + _PANEL_H * (1 - value / self.top)

    def h(self, value: float) -> float:
        return _PANEL_H * value / self.top


def _ticks(panel: _Panel, share: bool) -> list[float]:
    if share:
        return [0.0, 0.25, 0.5, 0.75, 1.0]
    step = _step(panel.top)
    return [float(t) for t in range(0, int(panel.top) + 1, step)]


def _axes(panel: _Panel, title: str, share: bool, count: int) -> list[etree._Element]:
    parts: list[etree._Element] = [
        E.text({"class": "panel-title", "x": str(_LEFT), "y": _f(panel.y0 - 8)}, title)
    ]
    for tick in _ticks(panel, share):
        y = _f(panel.y(tick))
        parts.append(E.line({"class": "grid", "x1": str(_LEFT), "x2": str(_LEFT + _PLOT_W),
                             "y1": y, "y2": y}))
        label = f"{tick:.0%}" if share else _n(int(tick))
        parts.append(E.text({"x": str(_LEFT - 6), "y": _f(panel.y(tick) + 4),
                             "text-anchor": "end"}, label))
    base = _f(panel.y(0))
    parts.append(E.line({"class": "axis", "x1": str(_LEFT), "x2": str(_LEFT + _PLOT_W),
                         "y1": base, "y2": base}))
    every = max(1, math.ceil(count / 20))
    for i in range(count):
        if (count - 1 - i) % every == 0:
            parts.append(E.text({"x": _f(panel.x(i) + panel.slot / 2), "y": _f(panel.y(0) + 14),
                                 "text-anchor": "middle"}, str(i + 1)))
    return parts


def _cost_top(rows: Sequence[Mapping[str, Any]]) -> float:
    costs = [float(p["cost"]) for r in rows for p in r["providers"].values()]
    return max(costs, default=0.0) * 1.08


def _failure(row: Mapping[str, Any]) -> str | None:
    """Why a result is not clean: its first error, or the invariant it broke."""
    if row["errors"]:
        e = row["errors"][0]
        return f"error at turn {e['turn']}: {e['type']}: {e['message']}"
    if row["invariants"] != "ok":
        inv = row["invariants"]
        return f"invariant {inv['invariant']} broke at turn {inv['turn']}: {inv['message']}"
    return None


def _config_chart(
    config: str, rows: Sequence[Mapping[str, Any]], providers: Sequence[str]
) -> etree._Element:
    """Three panels over the corpus, one column per conversation: tokens sent, each
    provider's cached share of its input, each provider's cost (input-token equivalents)."""
    count = len(rows)
    sent_top = math.ceil(max([int(r["tokens_sent"]) for r in rows] + [1]) * 1.08)
    panels = (_Panel(0, count, sent_top), _Panel(1, count, 1.0), _Panel(2, count, _cost_top(rows)))
    total = sum(int(r["tokens_sent"]) for r in rows)
    svg = E.svg({"class": "chart config-chart", "viewBox": f"0 0 {_W} {_H}", "role": "img",
                 "data-config": _t(config), "data-conversations": str(count),
                 "data-tokens-sent": str(total),
                 "aria-label": _t(f"config {config}: tokens sent, cached share and cost per "
                                  "conversation")})
    titles = ("tokens sent per conversation",
              "cached share of the input, per provider (simulated by its rules)",
              "cost per provider (input-token equivalents)")
    for panel, title, percent in zip(panels, titles, (False, True, False), strict=True):
        svg.extend(_axes(panel, title, percent, count))
    sent_panel, share_panel, cost_panel = panels
    bar = sent_panel.bar()
    for i, row in enumerate(rows):
        name = _t(row["conversation"])
        tokens = int(row["tokens_sent"])
        x = sent_panel.x(i) + (sent_panel.slot - bar) / 2
        group = E.g({"class": "conversation", "data-conversation": name,
                     "data-index": str(i + 1), "data-tokens-sent": str(tokens),
                     "data-status": "ok" if _failure(row) is None else "failed"})
        group.append(E.rect(
            {"class": "sent", "data-tokens": str(tokens), "x": _f(x), "width": _f(bar),
             "y": _f(sent_panel.y(tokens)), "height": _f(sent_panel.h(tokens))},
            E.title(f"{name}: {_n(tokens)} tokens sent over {row['turns']} of "
                    f"{row['recorded_turns']} turns (peak request {_n(int(row['peak_tokens']))})"),
        ))
        failure = _failure(row)
        if failure is not None:
            cx, size = x + bar / 2, min(max(bar / 2, 3.0), 7.0)
            top = sent_panel.y0
            group.append(E.g({"class": "failed"}, E.title(_t(f"{name}: {failure}")),
                             E.path({"d": f"M{_f(cx - size)} {_f(top)} L{_f(cx + size)} "
                                          f"{_f(top)} L{_f(cx)} {_f(top + size * 1.4)} Z"})))
        width = bar / max(len(providers), 1)
        for k, provider in enumerate(providers):
            bill = row["providers"].get(provider)
            if bill is None:
                continue
            px = x + k * width
            colour = _colour(provider, providers)
            cached, sent = int(bill["cached_tokens"]), int(bill["input_tokens"])
            share = _share(cached, sent)
            group.append(E.rect(
                {"class": "share", "data-provider": provider, "data-cached": str(cached),
                 "data-input": str(sent), "x": _f(px), "width": _f(width),
                 "y": _f(share_panel.y(share)), "height": _f(share_panel.h(share)),
                 "fill": colour},
                E.title(f"{name} · {provider}: {_n(cached)} of {_n(sent)} input tokens "
                        f"cached ({share:.0%})"),
            ))
            cost = float(bill["cost"])
            usd = bill.get("usd")
            group.append(E.rect(
                {"class": "cost", "data-provider": provider, "data-cost": repr(cost),
                 **({} if usd is None else {"data-usd": repr(float(usd))}),
                 "x": _f(px), "width": _f(width), "y": _f(cost_panel.y(cost)),
                 "height": _f(cost_panel.h(cost)), "fill": colour},
                E.title(f"{name} · {provider} ({_t(bill['model'])}): cost "
                        f"{_money(usd, cost)}"
                        + ("" if usd is None else f" ({cost:,.0f} input-token equivalents)")),
            ))
        svg.append(group)
    return svg


def _summary_table(summary: Mapping[str, Any], providers: Sequence[str]) -> etree._Element:
    winners = summary.get("winners", {})
    head = E.tr(*[E.th({"class": "num"} if c not in ("config",) else {}, c) for c in (
        "config", "ok", "errors", "invariants", "turns", "tokens sent", "p50", "p90")],
        *[E.th({"class": "num"}, f"{p} cost (cached)") for p in providers])
    rows = []
    for i, (name, c) in enumerate(summary["configs"].items(), start=1):
        pct = c["tokens_per_conversation"]
        cells = [
            E.td(E.a({"href": f"#config-{i}"}, _t(name))),
            E.td({"class": "num"}, str(c["conversations"] - c["errors"])),
            E.td({"class": "num"}, str(c["errors"])),
            E.td({"class": "num"}, str(c["invariant_failures"])),
            E.td({"class": "num"}, _n(c["turns"])),
            E.td({"class": "num"}, _n(c["tokens_sent"])),
            E.td({"class": "num"}, _n(pct["p50"])),
            E.td({"class": "num"}, _n(pct["p90"])),
        ]
        for p in providers:
            bill = c["providers"].get(p)
            if bill is None:
                cells.append(E.td({"class": "num"}, "-"))
                continue
            text = f"{_money(bill['usd'], bill['cost'])} ({bill['cached_share']:.0%})"
            star = winners.get(p) == name
            cells.append(E.td({"class": "num star" if star else "num",
                               "data-provider": p}, ("* " if star else "") + text))
        rows.append(E.tr({"data-config": _t(name)}, *cells))
    return E.table({"class": "summary"}, E.thead(head), E.tbody(*rows))


def _worst(items: Sequence[Mapping[str, Any]], columns: Mapping[str, int]) -> etree._Element:
    if not items:
        return E.p({"class": "note"}, "No conversations to list.")
    out = E.ol({"class": "worst"})
    for item in items:
        name = _t(item["conversation"])
        href = item.get("href")
        link = E.a({"href": href}, name) if href else E.span(name)
        column = columns.get(str(item["conversation"]))
        li = E.li(link, E.span({"class": "muted"}, "" if column is None else f" (column {column})",
                               " · ", _t(item["why"])))
        if not href:
            li.append(E.span({"class": "muted"}, " (no report: no turn replayed)"))
        out.append(li)
    return out


def render_replay_report(
    results: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any],
    worst: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    *,
    title: str = "Lamina replay report",
) -> str:
    """One self-contained HTML page for a replay run.

    ``results`` are the results file's rows (``ReplayResult.to_json()``), ``summary`` is
    ``RunSummary.to_json()``; ``worst`` maps a config to its worst conversations, each
    ``{"conversation", "why", "href"}`` (``href``: that conversation's own report, or None).
    """
    worst = worst or {}
    configs = list(summary["configs"])
    providers = sorted({p for r in results for p in r["providers"]})
    by_config: dict[str, list[Mapping[str, Any]]] = {c: [] for c in configs}
    for row in results:
        by_config.setdefault(str(row["config"]), []).append(row)
    sections: list[etree._Element] = []
    for i, config in enumerate(configs, start=1):
        rows = by_config[config]
        failed = sum(1 for r in rows if _failure(r) is not None)
        totals = []
        for p in providers:
            bills = [r["providers"][p] for r in rows if p in r["providers"]]
            if bills:
                cached = sum(int(b["cached_tokens"]) for b in bills)
                sent = sum(int(b["input_tokens"]) for b in bills)
                cost = sum(float(b["cost"]) for b in bills)
                usd = None if any(b.get("usd") is None for b in bills) else sum(
                    float(b["usd"]) for b in bills)
                totals.append(f"{p}: {_money(usd, cost)}, {_share(cached, sent):.0%} cached")
        sections.append(E.section(
            {"class": "config", "id": f"config-{i}", "data-config": _t(config)},
            E.h2("Config ", _t(config)),
            E.p({"class": "muted"}, " · ".join([
                f"{len(rows)} conversations", f"{failed} failed",
                f"{_n(sum(int(r['tokens_sent']) for r in rows))} tokens sent", *totals])),
            _config_chart(config, rows, providers),
            E.h3("Worst conversations"),
            E.p({"class": "note"}, "Failed conversations first, then the most expensive "
                "(by the config's first provider); each links to its own report, replayed "
                "under this config."),
            _worst(worst.get(config, ()),
                   {str(r["conversation"]): i for i, r in enumerate(rows, start=1)}),
        ))
    cards = E.div(
        {"class": "cards"},
        _card(str(summary["conversations"]), "conversations"),
        _card(str(summary["compared"]), "compared (no config failed)"),
        _card(str(len(configs)), "configs"),
        *[_card(_t(c), f"cheapest for {p}") for p, c in summary.get("winners", {}).items()],
    )
    body = E.body(
        E.header(E.h1(_t(title)), E.p(_t(
            f"{summary['conversations']} conversations x {len(configs)} configs"))),
        E.main(
            cards,
            E.h2("Summary"),
            E.p({"class": "note"}, "Totals and percentiles over the conversations every "
                "config replayed without error; cost in dollars where priced, else in "
                "input-token equivalents (cached reads and writes at the provider's shares of "
                "the input price); * marks the cheapest config per provider. Tokens are the "
                "requests' own count under each config's layout; cached shares are simulated "
                "with each provider's rules (minimum prefix, 128-token steps, breakpoints)."),
            _summary_table(summary, providers),
            E.nav({"class": "turns"}, *[
                E.a({"href": f"#config-{i}"}, _t(c)) for i, c in enumerate(configs, start=1)
            ]),
            E.p({"class": "note"}, "Each config's chart has one column per conversation of "
                "the corpus (numbered in the corpus's order; hover for its name and figures), "
                "over every conversation of that config. A red marker is a conversation that "
                "failed or broke an invariant."),
            _legend([("tokens sent", _SENT)]
                    + [(p, _colour(p, providers)) for p in providers]),
            *sections,
        ),
    )
    page = E.html(
        {"lang": "en"},
        E.head(
            E.meta({"charset": "utf-8"}),
            E.meta({"http-equiv": "Content-Security-Policy", "content": _CSP}),
            E.meta({"name": "viewport", "content": "width=device-width, initial-scale=1"}),
            E.title(_t(title)),
            E.style(_CSS + _REPLAY_CSS),
        ),
        body,
    )
    return str(
        etree.tostring(page, doctype="<!DOCTYPE html>", method="html", encoding="unicode")
    )
