"""The HTML report: a conversation's window, cached prefix, decisions and artifacts on one page.

The page is an lxml element tree serialized once, so every text and attribute taken from
notes, pages or queries is escaped by the serializer and can never become markup. CSS and
SVG are inline, the page carries no script and a Content-Security-Policy that forbids
loading anything: the file works from ``file://`` offline.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from lxml import etree
from lxml.builder import ElementMaker  # type: ignore[import-not-found]

from lamina.pipeline import Envelope
from lamina.renderers._explain import explain_cache, extends_previous
from lamina.renderers._xml import xml_safe

__all__ = ["REPORT_LAYERS", "render_report", "report_blocks"]



class _Builder:
    """lxml's E-factory (``E.div({"class": "x"}, child, "text")``), typed for mypy."""

    def __init__(self) -> None:
        self._make = ElementMaker()
        self._tags: dict[str, Callable[..., etree._Element]] = {}

    def __getattr__(self, tag: str) -> Callable[..., etree._Element]:
        maker = self._tags.get(tag)
        if maker is None:
            maker = cast("Callable[..., etree._Element]", getattr(self._make, tag))
            self._tags[tag] = maker
        return maker


E = _Builder()

# (trace name, label, fill colour): the bands of a request as sent (``renderers._sent``);
# "deferred" is context riding in earlier user messages, "framing" what no block holds.
REPORT_LAYERS: tuple[tuple[str, str, str], ...] = (
    ("L1", "L1 system", "#4e79a7"),
    ("L2", "L2 library", "#59a14f"),
    ("deferred", "context in earlier messages", "#76b7b2"),
    ("L3", "L3 turn", "#f28e2b"),
    ("L4", "L4 history", "#b07aa1"),
    ("L5", "L5 query", "#e15759"),
    ("framing", "framing", "#bab0ac"),
)
_CHURNING = ("L1", "L2", "L4")  # layers carried across turns: only changes are listed

_W, _H = 960, 300
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 150, 14, 34
_PLOT_W, _PLOT_H = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

_CSS = """
:root { --ink:#1f2933; --muted:#66727f; --line:#d8dee4; --bg:#f6f8fa; --accent:#0b7285; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
  color:var(--ink); background:#fff; }
header { padding:20px 32px 12px; border-bottom:1px solid var(--line); background:var(--bg); }
header h1 { margin:0 0 4px; font-size:20px; }
header p { margin:0; color:var(--muted); }
main { padding:8px 32px 40px; max-width:1100px; }
h2 { font-size:16px; margin:28px 0 6px; }
.cards { display:flex; flex-wrap:wrap; gap:12px; margin:16px 0 4px; }
.card { border:1px solid var(--line); border-radius:8px; padding:8px 14px; min-width:150px; }
.card b { display:block; font-size:20px; font-variant-numeric:tabular-nums; }
.card span { color:var(--muted); font-size:12px; }
.note { color:var(--muted); margin:2px 0 8px; max-width:820px; }
.chartbox { overflow-x:auto; }
svg.chart { width:100%; height:auto; max-width:960px; min-width:760px; display:block; }
svg text { font:11px system-ui,sans-serif; fill:var(--muted); }
@media (max-width: 1000px) {
  main, header { padding-left:12px; padding-right:12px; }
  svg text { font-size:14px; }
}
svg .grid { stroke:#eceff2; }
svg .axis { stroke:#9aa5b1; }
svg .limit { stroke:#c92a2a; stroke-width:1.5; stroke-dasharray:5 3; }
svg .reserve { fill:#c92a2a; fill-opacity:.10; }
svg .window { stroke:#c92a2a; stroke-width:1.5; }
svg .sent { fill:#dde3ea; }
svg .cached { fill:var(--accent); }
svg .observed { fill:#fff; stroke:#e8590c; stroke-width:2; }
svg .break line { stroke:#c92a2a; stroke-width:1; stroke-dasharray:2 2; }
svg .break path { fill:#c92a2a; }
svg g.turn:hover rect, svg g.cache:hover rect { opacity:.8; }
table { border-collapse:collapse; width:100%; margin:6px 0 10px; }
th, td { text-align:left; padding:4px 8px; border-bottom:1px solid var(--line);
  vertical-align:top; }
th { font-size:12px; color:var(--muted); font-weight:600; background:var(--bg); }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; }
td.key { word-break:break-all; }
.swatch { display:inline-block; width:10px; height:10px; border-radius:2px;
  margin-right:6px; vertical-align:baseline; }
.legend { display:flex; flex-wrap:wrap; gap:14px; font-size:12px; color:var(--muted);
  margin:4px 0; }
details summary { cursor:pointer; }
pre { white-space:pre-wrap; word-break:break-word; background:var(--bg);
  border:1px solid var(--line); border-radius:6px; padding:8px; margin:6px 0;
  font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace; max-height:420px;
  overflow:auto; }
section.turn { border-top:1px solid var(--line); margin-top:18px; }
section.turn h3 { font-size:15px; margin:12px 0 2px; }
.query { font-weight:400; color:var(--muted); }
.muted { color:var(--muted); }
.warn { color:#a61e4d; margin:2px 0; }
.broke { color:#c92a2a; }
.low { color:#8f5b00; }
nav.turns a { margin-right:6px; color:var(--accent); text-decoration:none; }
"""

_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def _t(value: object) -> str:
    """Text for the tree: XML can hold it (lxml refuses control characters)."""
    return xml_safe(str(value))


def _n(value: int) -> str:
    return f"{value:,}"


def _f(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def report_blocks(envelopes: Iterable[Envelope]) -> dict[tuple[int, str, str], str]:
    """The rendered block of every segment, by (turn, layer, key), for the report's details."""
    return {
        (env.turn, str(layer.name), seg.key): seg.text
        for env in envelopes
        for layer in env.layers
        for seg in layer.segments
    }


def _step(top: float) -> int:
    """A 1-2-5 tick step giving about five gridlines up to ``top``."""
    raw = max(top / 5, 1)
    mag = 10 ** math.floor(math.log10(raw))
    return int(next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw))


class _Frame:
    """Turn index and token count to SVG coordinates for one chart."""

    def __init__(self, turns: int, top: int) -> None:
        self.turns = max(turns, 1)
        self.top = max(top, 1)
        self.slot = _PLOT_W / self.turns

    def x(self, i: int) -> float:
        return _LEFT + i * self.slot

    def bar(self) -> float:
        return min(max(self.slot * 0.72, 1.0), 64.0)

    def y(self, tokens: float) -> float:
        return _TOP + _PLOT_H * (1 - tokens / self.top)

    def h(self, tokens: float) -> float:
        return _PLOT_H * tokens / self.top


def _axes(frame: _Frame, numbers: Sequence[int], label: str) -> list[etree._Element]:
    parts: list[etree._Element] = []
    step = _step(frame.top)
    for tick in range(0, frame.top + 1, step):
        y = _f(frame.y(tick))
        parts.append(E.line({"class": "grid", "x1": str(_LEFT), "x2": str(_LEFT + _PLOT_W),
                             "y1": y, "y2": y}))
        parts.append(E.text({"x": str(_LEFT - 6), "y": _f(frame.y(tick) + 4),
                             "text-anchor": "end"}, _n(tick)))
    base = _f(frame.y(0))
    parts.append(E.line({"class": "axis", "x1": str(_LEFT), "x2": str(_LEFT + _PLOT_W),
                         "y1": base, "y2": base}))
    every = max(1, math.ceil(len(numbers) / 20))
    for i, number in enumerate(numbers):
        if (len(numbers) - 1 - i) % every == 0:  # the last turn always has its label
            parts.append(E.text({"x": _f(frame.x(i) + frame.slot / 2), "y": str(_H - _BOTTOM + 16),
                                 "text-anchor": "middle"}, str(number)))
    parts.append(E.text({"x": _f(_LEFT + _PLOT_W / 2), "y": str(_H - 2),
                         "text-anchor": "middle"}, "turn"))
    parts.append(E.text({"x": "12", "y": _f(_TOP + _PLOT_H / 2), "text-anchor": "middle",
                         "transform": f"rotate(-90 12 {_f(_TOP + _PLOT_H / 2)})"}, label))
    return parts


def _budgets(turns: Sequence[Mapping[str, Any]]) -> list[tuple[int, int, int, int]]:
    """Runs of turns with one budget: (first index, last index, window, reserve)."""
    runs: list[tuple[int, int, int, int]] = []
    for i, turn in enumerate(turns):
        budget = turn.get("budget")
        if budget is None:
            continue
        window, reserve = int(budget["window"]), int(budget["reserve_output"])
        if runs and runs[-1][1] == i - 1 and runs[-1][2:] == (window, reserve):
            runs[-1] = (runs[-1][0], i, window, reserve)
        else:
            runs.append((i, i, window, reserve))
    return runs


def _layer_tokens(turn: Mapping[str, Any]) -> list[tuple[str, str, str, int]]:
    """The request's bands as sent (a trace without them, another layout's: the layers)."""
    sent = turn.get("sent")
    layers = turn["layers"]
    counts = [
        int(sent.get(name, 0)) if sent is not None else int(layers.get(name, {}).get("tokens", 0))
        for name, _, _ in REPORT_LAYERS[:-1]
    ]
    framing = max(int(turn["tokens_total"]) - sum(counts), 0)
    return [
        (name, label, colour, count)
        for (name, label, colour), count in zip(REPORT_LAYERS, [*counts, framing], strict=True)
    ]


def _window_chart(turns: Sequence[Mapping[str, Any]]) -> etree._Element:
    numbers = [int(t["turn"]) for t in turns]
    runs = _budgets(turns)
    top = max([int(t["tokens_total"]) for t in turns] + [w for _, _, w, _ in runs] + [1])
    frame = _Frame(len(turns), math.ceil(top * 1.06))
    svg = E.svg({"class": "chart window-chart", "viewBox": f"0 0 {_W} {_H}", "role": "img",
                 "aria-label": "tokens per layer per turn against the window"},
                *_axes(frame, numbers, "tokens"))
    for first, last, window, reserve in runs:
        x1, x2 = frame.x(first), frame.x(last + 1)
        band = E.rect({"class": "reserve", "x": _f(x1), "width": _f(x2 - x1),
                       "y": _f(frame.y(window)), "height": _f(frame.h(reserve))},
                      E.title(f"reserved for the reply: {_n(reserve)} tokens"))
        svg.append(band)
        for cls, level, text in (("window", window, f"window {_n(window)}"),
                                 ("limit", window - reserve, f"limit {_n(window - reserve)}")):
            level_y = _f(frame.y(level))
            svg.append(E.line({"class": cls, "x1": _f(x1), "x2": _f(x2), "y1": level_y,
                               "y2": level_y},
                              E.title(text)))
            if last == len(turns) - 1:
                svg.append(E.text({"x": _f(x2 + 6), "y": _f(frame.y(level) + 4)}, text))
    bar = frame.bar()
    for i, turn in enumerate(turns):
        total = int(turn["tokens_total"])
        group = E.g({"class": "turn", "data-turn": str(turn["turn"]), "data-total": str(total)})
        y = frame.y(0)
        for name, label, colour, count in _layer_tokens(turn):
            if count <= 0:
                continue
            height = frame.h(count)
            y -= height
            group.append(E.rect(
                {"class": f"layer {name}", "data-layer": name, "data-tokens": str(count),
                 "x": _f(frame.x(i) + (frame.slot - bar) / 2), "width": _f(bar),
                 "y": _f(y), "height": _f(height), "fill": colour},
                E.title(f"turn {turn['turn']} · {label}: {_n(count)} tokens "
                        f"(request {_n(total)})"),
            ))
        svg.append(group)
    return svg


def _breaks(turn: Mapping[str, Any]) -> str | None:
    """The reason the cached prefix broke at this turn; the first turn has nothing to break."""
    cache = turn.get("cache") or {}
    reason = cache.get("break_reason")
    return None if reason is None or reason == "first-turn" else str(reason)


def _observed(turn: Mapping[str, Any]) -> int | None:
    """Cached tokens the provider reported for this turn, when the trace recorded usage."""
    usage = turn.get("usage") or {}
    value = usage.get("cached_tokens")
    return None if value is None else int(value)


def _cache_chart(turns: Sequence[Mapping[str, Any]]) -> etree._Element:
    numbers = [int(t["turn"]) for t in turns]
    top = max([int(t["tokens_total"]) for t in turns] + [1])
    frame = _Frame(len(turns), math.ceil(top * 1.12))
    svg = E.svg({"class": "chart cache-chart", "viewBox": f"0 0 {_W} {_H}", "role": "img",
                 "aria-label": "cached prefix per turn"},
                *_axes(frame, numbers, "tokens"))
    bar = frame.bar()
    for i, turn in enumerate(turns):
        total = int(turn["tokens_total"])
        cached = int((turn.get("cache") or {}).get("common_prefix_tokens", 0))
        previous = turns[i - 1] if i else None
        x = frame.x(i) + (frame.slot - bar) / 2
        shown = min(cached, total)
        group = E.g(
            {"class": "cache", "data-turn": str(turn["turn"]), "data-cached": str(cached)},
            E.rect({"class": "sent", "x": _f(x), "width": _f(bar), "y": _f(frame.y(total)),
                    "height": _f(frame.h(total))},
                   E.title(f"turn {turn['turn']}: request {_n(total)} tokens")),
            E.rect({"class": "cached", "x": _f(x), "width": _f(bar), "y": _f(frame.y(shown)),
                    "height": _f(frame.h(shown))},
                   E.title(f"turn {turn['turn']}: {_n(cached)} tokens repeat the previous "
                           f"request's prefix (predicted cache hit)")),
        )
        observed = _observed(turn)
        if observed is not None:
            group.append(E.circle(
                {"class": "observed", "cx": _f(x + bar / 2), "cy": _f(frame.y(min(observed, top))),
                 "r": _f(min(max(bar / 3, 2.0), 5.0))},
                E.title(f"turn {turn['turn']}: {_n(observed)} cached tokens reported by the "
                        "provider"),
            ))
        svg.append(group)
        reason = _breaks(turn)
        if reason is not None:
            cx = frame.x(i) + frame.slot / 2
            size = min(max(frame.slot / 2.5, 3.0), 7.0)
            svg.append(E.g(
                {"class": "break", "data-turn": str(turn["turn"]), "data-reason": _t(reason)},
                E.title(f"turn {turn['turn']}: the cached prefix broke. "
                        f"{_t(' '.join(explain_cache(turn, previous)))}"),
                E.line({"x1": _f(cx), "x2": _f(cx), "y1": str(_TOP),
                        "y2": _f(max(frame.y(total) - 2, _TOP))}),
                E.path({"d": f"M{_f(cx - size)} {_TOP} L{_f(cx + size)} {_TOP} "
                             f"L{_f(cx)} {_f(_TOP + size * 1.4)} Z"}),
            ))
    return svg


def _legend(items: Iterable[tuple[str, str]]) -> etree._Element:
    return E.div({"class": "legend"}, *[
        E.span(E.span({"class": "swatch", "style": f"background:{colour}"}), label)
        for label, colour in items
    ])


def _decisions(turns: Sequence[Mapping[str, Any]]) -> etree._Element:
    rows: list[etree._Element] = []
    for turn in turns:
        for d in (turn.get("budget") or {}).get("decisions", []):
            action = str(d.get("kind") or d.get("action") or d.get("reason", ""))
            reason = str(d.get("reason", ""))
            cell = E.td(_t(action))
            if reason and reason != action:
                cell.append(E.div({"class": "muted"}, _t(reason)))
            rows.append(E.tr(
                {"data-turn": str(turn["turn"])},
                E.td(E.a({"href": f"#turn-{int(turn['turn'])}"}, str(turn["turn"]))),
                cell,
                E.td({"class": "key"}, _t(d.get("target", ""))),
                E.td(_t(f"{d.get('from', '')} → {d.get('to', '')}")),
                E.td({"class": "num"}, _n(int(d.get("tokens_saved", 0)))),
            ))
    if not rows:
        return E.p({"class": "note"}, "No budget decisions: every turn fit as built.")
    head = E.tr(E.th("turn"), E.th("action"), E.th("target"), E.th("from → to"),
                E.th({"class": "num"}, "tokens saved"))
    return E.table({"class": "decisions"}, E.thead(head), E.tbody(*rows))


def _warning_text(warning: object) -> str:
    if isinstance(warning, Mapping):
        text = warning.get("message") or warning.get("text")
        if text is not None:
            key = warning.get("key") or warning.get("source")
            return f"{key}: {text}" if key else str(text)
        return json.dumps(warning, sort_keys=True, ensure_ascii=False)
    return str(warning)


def _messages(
    turn: Mapping[str, Any], previous: Mapping[str, Any] | None = None
) -> etree._Element:
    """The request's messages as sent, in order: role, size and what each carries (the
    system message the library's settled entries, an earlier user message its deferred
    context). A run of plain history messages is one line, and so is a run of those the
    last request (``previous``) sent the same in the same place before its own turn's
    message, so the page stays linear however long a batch grows."""
    batch = turn.get("batch") or {}
    layers = turn.get("layers") or {}
    library = len((layers.get("L2") or {}).get("segments", ()))
    settled = int(batch.get("settled_entries", library))
    deferred = {int(n) for n in batch.get("deferred_turns", ())}
    users = [int(str(s["key"]).split(":")[1]) for s in (layers.get("L4") or {}).get("segments", ())
             if str(s["key"]).endswith(":user")]
    messages = turn.get("messages") or []
    before = [(str(m.get("role", "")), str(m.get("content", "")))
              for m in (previous or {}).get("messages") or ()]  # fmt: skip
    items: list[etree._Element] = []
    run: list[int] = []  # sizes of the current run of plain or unchanged messages
    runs = ""  # what the run is: "history" or "same"

    def flush() -> None:
        if run:
            s = "s" if len(run) != 1 else ""
            what = (f"{len(run)} history message{s} (L4: earlier queries and replies)"
                    if runs == "history" else
                    f"{len(run)} message{s} as the last request sent them")  # fmt: skip
            items.append(E.li({"data-role": runs}, f"{what} · {_n(sum(run))} characters"))
            run.clear()

    def add(kind: str, size: int) -> None:
        nonlocal runs
        if kind != runs:
            flush()
            runs = kind
        run.append(size)

    seen_users = 0
    for i, m in enumerate(messages):
        role, content = str(m.get("role", "")), str(m.get("content", ""))
        if role == "system":
            what = f"L1 and the library ({settled} of {library} entries)" if library else "L1"
        elif i == len(messages) - 1:
            what = "this turn's context (L3) and query (L5)"
        else:
            number = users[seen_users] if role == "user" and seen_users < len(users) else None
            seen_users += role == "user"
            if i < len(before) - 1 and before[i] == (role, content):
                add("same", len(content))
                continue
            if number is None or number not in deferred:
                add("history", len(content))
                continue
            what = f"turn {number}'s message with the context it attached (deferred)"
        flush()
        items.append(E.li({"data-role": role}, E.b(role), f" · {_n(len(content))} characters · "
                          f"{what}: ", E.span({"class": "muted"}, _t(_first(content)))))
    flush()
    return E.details({"class": "messages"}, E.summary(f"messages as sent ({len(messages)})"),
                     E.ol(*items))


def _first(text: str, limit: int = 100) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rsplit(" ", 1)[0] + " …"


def _query(turn: Mapping[str, Any], blocks: Mapping[tuple[int, str, str], str]) -> str:
    text = blocks.get((int(turn["turn"]), "L5", "query"))
    if text is None:
        return ""
    first = " ".join(text.split())
    return first if len(first) <= 160 else first[:159].rsplit(" ", 1)[0] + " …"


def _artifacts(
    turn: Mapping[str, Any],
    previous: Mapping[str, Any] | None,
    blocks: Mapping[tuple[int, str, str], str],
    shown: dict[tuple[str, str], str],
) -> etree._Element:
    """Rows of this turn's segments; carried layers list only what changed since the last turn."""
    number = int(turn["turn"])
    rows: list[etree._Element] = []
    # The library entries past the settled ones ride in earlier user messages.
    settled = int((turn.get("batch") or {}).get("settled_entries", 1 << 30))
    for name, _label, colour in REPORT_LAYERS[:-1]:
        layer = turn["layers"].get(name) or {"segments": []}
        before: dict[str, tuple[str, str]] = {}
        if previous is not None and name in _CHURNING:
            before = {
                s["key"]: (s["form"], s["content_hash"])
                for s in (previous["layers"].get(name) or {"segments": []})["segments"]
            }
        same_count, same_tokens = 0, 0
        for i, seg in enumerate(layer["segments"]):
            if before.get(seg["key"]) == (seg["form"], seg["content_hash"]):
                same_count += 1
                same_tokens += int(seg["tokens"])
                continue
            text = blocks.get((number, name, seg["key"]))
            key_cell = E.td({"class": "key"})
            anchor = f"b{number}-{name}-{i}"
            if text is None:
                key_cell.text = _t(seg["key"])
            else:
                first = shown.get((seg["form"], text))
                if first is None:
                    shown[(seg["form"], text)] = anchor
                    key_cell.append(E.details({"id": anchor}, E.summary(_t(seg["key"])),
                                              E.pre(_t(text))))
                else:
                    key_cell.append(E.span(_t(seg["key"]), " ",
                                           E.a({"href": f"#{first}", "class": "muted"},
                                               "(block shown earlier)")))
            rows.append(E.tr(
                {"class": "segment", "data-layer": name},
                E.td(E.span({"class": "swatch", "style": f"background:{colour}"}), name),
                key_cell,
                E.td(_t(seg.get("source_type", ""))),
                E.td(_t(seg["form"] + (" (sent in an earlier user message)"
                                       if name == "L2" and i >= settled else ""))),
                E.td({"class": "num"}, _n(int(seg["tokens"]))),
            ))
        if same_count:
            rows.append(E.tr(
                {"class": "unchanged", "data-layer": name},
                E.td(E.span({"class": "swatch", "style": f"background:{colour}"}), name),
                E.td({"class": "muted", "colspan": "3"},
                     f"{same_count} {'entry' if same_count == 1 else 'entries'} unchanged "
                     f"since turn {previous['turn'] if previous else ''}"),
                E.td({"class": "num muted"}, _n(same_tokens)),
            ))
    head = E.tr(E.th("layer"), E.th("artifact (click for the rendered block)"), E.th("source"),
                E.th("form"), E.th({"class": "num"}, "tokens"))
    return E.table({"class": "artifacts"}, E.thead(head), E.tbody(*rows))


def _turn_section(
    turn: Mapping[str, Any],
    previous: Mapping[str, Any] | None,
    blocks: Mapping[tuple[int, str, str], str],
    shown: dict[tuple[str, str], str],
) -> etree._Element:
    number = int(turn["turn"])
    total = int(turn["tokens_total"])
    cached = int((turn.get("cache") or {}).get("common_prefix_tokens", 0))
    facts = [f"request {_n(total)} tokens", f"cached prefix {_n(cached)}"]
    budget = turn.get("budget")
    if budget is not None:
        limit = int(budget["window"]) - int(budget["reserve_output"])
        facts.append(f"limit {_n(limit)}, headroom {_n(limit - total)}")
        saved = sum(int(d.get("tokens_saved", 0)) for d in budget.get("decisions", []))
        if saved:
            facts.append(f"{len(budget['decisions'])} decisions saved {_n(saved)}")
    observed = _observed(turn)
    if observed is not None:
        facts.append(f"provider reported {_n(observed)} cached")
    section = E.section(
        {"class": "turn", "id": f"turn-{number}", "data-turn": str(number)},
        E.h3(f"Turn {number} ", E.span({"class": "query"}, _t(_query(turn, blocks)))),
        E.p({"class": "muted"}, " · ".join(facts)),
    )
    why = explain_cache(turn, previous)
    if why:
        if previous is None:
            label = ""
        elif _breaks(turn) is not None:
            label = "The cached prefix broke: "
        elif extends_previous(turn, previous):
            label = "Extends the request before: "
        else:
            label = "Little cached: "
        section.append(E.p({"class": "broke" if _breaks(turn) else "low"}, label,
                           _t(" ".join(why))))
    for warning in turn.get("warnings") or ():
        section.append(E.p({"class": "warn"}, "warning: ", _t(_warning_text(warning))))
    section.append(_artifacts(turn, previous, blocks, shown))
    section.append(_messages(turn, previous))
    request = turn.get("request")
    if request is not None:
        section.append(E.details(E.summary("request body"),
                                 E.pre(_t(json.dumps(request, indent=1, ensure_ascii=False)))))
    return section


def _window_heading(turns: Sequence[Mapping[str, Any]]) -> list[etree._Element]:
    """The layer chart's heading: a chat run under a budget is drawn against its window, one
    without a budget has no window to fill."""
    if any(t.get("budget") is not None for t in turns):
        return [
            E.h2("How the window filled"),
            E.p({"class": "note"}, "Tokens of each request as sent per layer, stacked: context "
                "in earlier messages is what earlier user messages still carry while the "
                "library's growth waits; framing is what no block holds (per-message "
                "overhead, headings, labels). The red band is the output reserved "
                "for the reply: a request must stay under the dashed limit."),
        ]
    return [
        E.h2("Tokens per layer"),
        E.p({"class": "note"}, "Tokens of each request as sent per layer, stacked: context "
            "in earlier messages is what earlier user messages still carry while the "
            "library's growth waits; framing is what no block holds (per-message overhead, "
            "headings, labels). This chat ran without a budget, so no "
            "window or limit is drawn (the --window or --model option sets one)."),
    ]


def _card(value: str, label: str) -> etree._Element:
    return E.div({"class": "card"}, E.b(value), E.span(label))


def render_report(
    trace: Mapping[str, Any],
    blocks: Mapping[tuple[int, str, str], str] | None = None,
    *,
    title: str = "Lamina report",
) -> str:
    """One self-contained HTML page for a JSON trace (`docs/TRACE.md`).

    ``blocks`` (``report_blocks(envelopes)``) adds each artifact's rendered block, behind
    a ``<details>``; without it the page lists keys, forms and tokens only.
    """
    blocks = blocks or {}
    turns: Sequence[Mapping[str, Any]] = trace.get("turns", [])
    sent = sum(int(t["tokens_total"]) for t in turns)
    cached = sum(int((t.get("cache") or {}).get("common_prefix_tokens", 0)) for t in turns)
    breaks = [t for t in turns if _breaks(t) is not None]
    decisions = sum(len((t.get("budget") or {}).get("decisions", [])) for t in turns)
    subtitle = [f"{len(turns)} turns", f"tokenizer {trace.get('tokenizer', '?')}"]
    if trace.get("conversation_id"):
        subtitle.append(f"conversation {trace['conversation_id']}")
    if trace.get("layout"):
        subtitle.append(f"requests in the {trace['layout']} layout")
    cards = E.div(
        {"class": "cards"},
        _card(_n(sent), "tokens sent (all turns)"),
        _card(_n(cached), "of them a repeated prefix"),
        _card(f"{cached / sent:.0%}" if sent else "0%", "predicted cache share"),
        _card(str(len(breaks)), "prefix breaks"),
        _card(str(decisions), "budget decisions"),
    )
    body = E.body(
        E.header(E.h1(_t(title)), E.p(_t(" · ".join(subtitle)))),
        E.main(
            cards,
            *_window_heading(turns),
            _legend((label, colour) for _, label, colour in REPORT_LAYERS),
            E.div({"class": "chartbox"}, _window_chart(turns)),
            E.h2("Cached prefix"),
            E.p({"class": "note"}, "The part of each request that repeats the previous "
                "request byte for byte (what a provider's prompt cache can serve). A red marker "
                "is a break: bytes cached before changed; hover it for the reason."),
            _legend([("request", "#dde3ea"), ("cached prefix (predicted)", "#0b7285"),
                     ("break", "#c92a2a")]
                    + ([("cached (observed)", "#e8590c")]
                       if any(_observed(t) is not None for t in turns) else [])),
            E.div({"class": "chartbox"}, _cache_chart(turns)),
            E.h2("Budget decisions"),
            _decisions(turns),
            E.h2("Turns"),
            E.p({"class": "note"}, "Each turn's artifacts. Layers carried from turn to turn "
                "(system, library, history) list only what is new or changed."),
            E.nav({"class": "turns"}, *[
                E.a({"href": f"#turn-{int(t['turn'])}"}, str(t["turn"])) for t in turns
            ]),
            *_sections(turns, blocks),
        ),
    )
    page = E.html(
        {"lang": "en"},
        E.head(
            E.meta({"charset": "utf-8"}),
            E.meta({"http-equiv": "Content-Security-Policy", "content": _CSP}),
            E.meta({"name": "viewport", "content": "width=device-width, initial-scale=1"}),
            E.title(_t(title)),
            E.style(_CSS),
        ),
        body,
    )
    return str(
        etree.tostring(page, doctype="<!DOCTYPE html>", method="html", encoding="unicode")
    )


def _sections(
    turns: Sequence[Mapping[str, Any]], blocks: Mapping[tuple[int, str, str], str]
) -> list[etree._Element]:
    shown: dict[tuple[str, str], str] = {}
    previous: Mapping[str, Any] | None = None
    out = []
    for turn in turns:
        out.append(_turn_section(turn, previous, blocks, shown))
        previous = turn
    return out
