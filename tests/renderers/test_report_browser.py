"""The report in a real browser: Debian's headless Chromium, driven by Playwright.

Playwright only drives /usr/bin/chromium (no browser of its own is installed). In CI
(CI=true) a missing Chromium fails the test; elsewhere it skips with the reason.
Screenshots are kept in .artifacts/ (gitignored).
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lamina import Conversation, find_corpus, replay
from lamina._replay_report import write_replay_report
from lamina._summary import summarize
from lamina.pipeline import Policy, SystemPrompt
from lamina.processors import note
from lamina.renderers import render_report, report_blocks, xml_safe
from tests.cli import ROOT, lamina
from tests.conftest import write_vault
from tests.lamina.test_cli_replay import HOSTILE_NAME, write_report_corpus
from tests.renderers.test_report import HOSTILE, _trace

ARTIFACTS = ROOT / ".artifacts"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _chromium() -> str:
    found = shutil.which("chromium") or (
        "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
    )
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is missing in CI: .ci/run installs Debian's chromium package")
        pytest.skip("chromium is not installed (apt-get install chromium); CI runs this test")
    return found


class Page:
    """A report opened from file://, with every console message and request it made."""

    def __init__(self, page: Any, url: str) -> None:
        self.page = page
        self.url = url
        self.console: list[str] = []
        self.errors: list[str] = []
        self.requests: list[str] = []

    def evaluate(self, script: str) -> Any:
        return self.page.evaluate(script)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Chromium for the module (starting it costs about 2 s); each test opens pages."""
    executable = _chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("profile")),  # a fresh --user-data-dir
            executable_path=executable,
            headless=True,
            args=FLAGS,
            viewport={"width": 1200, "height": 900},
        )
        try:
            yield context
        finally:
            context.close()


def _open(context: Any, path: Path) -> Page:
    page = context.new_page()
    opened = Page(page, path.resolve().as_uri())
    page.on("console", lambda m: opened.console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: opened.errors.append(str(e)))
    page.on("request", lambda r: opened.requests.append(r.url))
    page.goto(opened.url)
    page.wait_for_load_state("load")
    return opened


def test_demo_report_in_chromium(browser: Any, tmp_path: Path) -> None:
    """One chart group per turn whose layers add up to the trace's total, break markers
    at the turns the trace reports, nothing logged, nothing fetched; a screenshot kept."""
    out = tmp_path / "demo.html"
    run = lamina("demo", "--json", "--report", str(out))
    assert run.returncode == 0, run.stderr
    assert f"report: {out.resolve()}" in run.stderr
    turns = json.loads(run.stdout)["turns"]
    page = _open(browser, out)

    groups = page.evaluate(
        """[...document.querySelectorAll('svg.window-chart g.turn')].map(g => ({
            turn: +g.dataset.turn, total: +g.dataset.total,
            layers: [...g.querySelectorAll('rect')].reduce((n, r) => n + +r.dataset.tokens, 0)}))"""
    )
    assert [(g["turn"], g["total"], g["layers"]) for g in groups] == [
        (t["turn"], t["tokens_total"], t["tokens_total"]) for t in turns
    ]
    cached = page.evaluate(
        "[...document.querySelectorAll('svg.cache-chart g.cache')].map(g => +g.dataset.cached)"
    )
    assert cached == [t["cache"]["common_prefix_tokens"] for t in turns]
    breaks = page.evaluate(
        """[...document.querySelectorAll('svg.cache-chart g.break')].map(g =>
            [+g.dataset.turn, g.dataset.reason, g.querySelector('title').textContent])"""
    )
    reported = [
        (t["turn"], t["cache"]["break_reason"])
        for t in turns
        if t["cache"]["break_reason"] not in (None, "first-turn")
    ]
    assert reported, "the demo's last turn moves the history cut: a break"
    assert [b[0] for b in breaks] == [turn for turn, _ in reported]
    assert [b[1] for b in breaks] == [reason for _, reason in reported]
    # People read a sentence, not the code (the code stays in data-reason).
    assert all(":" not in b[2].split(". ", 1)[1][:12] for b in breaks)
    assert all("cached prefix broke. " in b[2] for b in breaks)
    decisions = page.evaluate("document.querySelectorAll('table.decisions tbody tr').length")
    assert decisions == sum(len(t["budget"]["decisions"]) for t in turns)
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report-demo.png"
    page.page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    assert page.console == [] and page.errors == []
    assert page.requests == [page.url]


def test_hostile_note_renders_as_text_in_chromium(browser: Any, tmp_path: Path) -> None:
    """A note, a query and a reply full of markup stay text in the browser's DOM."""
    vault = write_vault(tmp_path / "vault", {"evil.md": f"# Evil\n\n{HOSTILE}\n"})
    conv = Conversation(  # the library grown every turn, so the refresh is a break
        SystemPrompt("You are terse."),
        vault=vault,
        policy=Policy(freshness="refresh"),
        defer_library=False,
    )
    envelopes = [conv.turn(f"Read {HOSTILE}", attach=[note("evil.md")])]
    conv.reply(f"It says {HOSTILE}")
    envelopes.append(conv.turn("Again", attach=[note("evil.md")]))  # now in the library
    (vault / "evil.md").write_text(f"# Evil\n\nchanged {HOSTILE}\n", encoding="utf-8")
    envelopes.append(conv.turn("Again", attach=[note("evil.md")]))  # refreshed: a break
    blocks = report_blocks(envelopes)
    out = tmp_path / "evil.html"
    out.write_text(render_report(_trace(conv, envelopes), blocks), encoding="utf-8")
    page = _open(browser, out)

    dom = page.evaluate(
        """(() => {
            const walker = document.createTreeWalker(document, NodeFilter.SHOW_COMMENT);
            let comments = 0; while (walker.nextNode()) comments++;
            const on = [...document.querySelectorAll('*')].filter(
                e => [...e.attributes].some(a => a.name.startsWith('on'))).length;
            return {scripts: document.scripts.length, imgs: document.images.length,
                    svgs: document.querySelectorAll('svg').length, comments, on,
                    pres: [...document.querySelectorAll('pre')].map(p => p.textContent),
                    body: document.body.textContent};
        })()"""
    )
    assert dom["scripts"] == 0 and dom["imgs"] == 0 and dom["comments"] == 0 and dom["on"] == 0
    assert dom["svgs"] == 2
    rendered = [xml_safe(text) for key, text in blocks.items() if key[0] == 1]
    assert [text for text in rendered if text not in dom["pres"]] == []
    shown = xml_safe(HOSTILE)
    assert any(f"Read {shown}" in p for p in dom["pres"])  # the query, raw
    assert any(f"It says {shown}" in p for p in dom["pres"])  # the reply, raw
    assert page.evaluate(
        "[...document.querySelectorAll('svg.cache-chart g.break title')].map(t => t.textContent)"
    ) == [
        "turn 3: the cached prefix broke. note:evil.md changed since the library took it (its "
        "freshness policy sent the new text), so the request is sent uncached from there on."
    ]
    assert page.console == [] and page.errors == []
    assert page.requests == [page.url]


def test_replay_report_in_chromium(browser: Any, tmp_path: Path) -> None:
    """Per config the chart's columns add up to the results file's totals and the summary
    table shows the summary's; every worst-conversation link opens an existing report; a
    conversation named and written in markup stays text; nothing logged, nothing fetched."""
    chats, configs = write_report_corpus(tmp_path)
    run = replay(chats, configs, engine="serial")
    written = write_replay_report(run, find_corpus(chats), tmp_path / "replay.html", worst=2)
    rows = [r.to_json() for r in run.results]
    summary = summarize(run).to_json()
    page = _open(browser, written.path)

    charts = page.evaluate(
        """[...document.querySelectorAll('svg.config-chart')].map(svg => ({
            config: svg.dataset.config, total: +svg.dataset.tokensSent,
            conversations: [...svg.querySelectorAll('g.conversation')].map(
                g => g.dataset.conversation),
            sent: [...svg.querySelectorAll('g.conversation rect.sent')].reduce(
                (n, r) => n + +r.dataset.tokens, 0),
            bills: [...svg.querySelectorAll('rect.cost')].map(r => [
                r.dataset.provider, +r.dataset.cost,
                +svg.querySelector(`g.conversation[data-index="${
                    r.closest('g').dataset.index}"] rect.share[data-provider="${
                    r.dataset.provider}"]`).dataset.cached])}))"""
    )
    assert [c["config"] for c in charts] == ["pin", "tight"]
    for chart in charts:
        mine = [r for r in rows if r["config"] == chart["config"]]
        assert chart["conversations"] == [r["conversation"] for r in mine]
        assert chart["sent"] == chart["total"] == sum(r["tokens_sent"] for r in mine)
        for provider in {p for r in mine for p in r["providers"]}:
            bills = [b for b in chart["bills"] if b[0] == provider]
            expected = [r["providers"][provider] for r in mine if provider in r["providers"]]
            assert sum(b[2] for b in bills) == sum(e["cached_tokens"] for e in expected)
            assert sum(b[1] for b in bills) == pytest.approx(sum(e["cost"] for e in expected))
    table = page.evaluate(
        """[...document.querySelectorAll('table.summary tbody tr')].map(tr =>
            [tr.dataset.config, tr.children[5].textContent])"""
    )
    assert table == [[n, f"{c['tokens_sent']:,}"] for n, c in summary["configs"].items()]

    links = page.evaluate(
        """[...document.querySelectorAll('ol.worst a')].map(a => [a.textContent, a.href])"""
    )
    assert len(links) == 4 and [name for name, _ in links[::2]] == [HOSTILE_NAME] * 2
    files = [Path(urllib.parse.unquote(urllib.parse.urlparse(href).path)) for _, href in links]
    assert files == list(written.pages) and all(f.is_file() for f in files)
    dom = page.evaluate(
        """(() => {
            const walker = document.createTreeWalker(document, NodeFilter.SHOW_COMMENT);
            let comments = 0; while (walker.nextNode()) comments++;
            const on = [...document.querySelectorAll('*')].filter(
                e => [...e.attributes].some(a => a.name.startsWith('on'))).length;
            return {scripts: document.scripts.length, comments, on,
                    svgs: document.querySelectorAll('svg').length};
        })()"""
    )
    assert dom == {"scripts": 0, "comments": 0, "on": 0, "svgs": 2}
    ARTIFACTS.mkdir(exist_ok=True)
    page.page.screenshot(path=str(ARTIFACTS / "report-replay.png"), full_page=True)
    assert page.console == [] and page.errors == []
    assert page.requests == [page.url]

    linked = _open(browser, files[0])  # the hostile conversation's own report (turn 1)
    assert linked.evaluate(
        "[...document.querySelectorAll('svg.window-chart g.turn')].map(g => +g.dataset.turn)"
    ) == [1]
    pres = linked.evaluate("[...document.querySelectorAll('pre')].map(p => p.textContent)")
    assert any("</pre></svg><script>alert(1)</script><!-- x -->" in p for p in pres)
    assert linked.evaluate("document.scripts.length") == 0
    assert linked.console == [] and linked.errors == []
    assert linked.requests == [linked.url]


@pytest.mark.parametrize("width", [700, 1400])
def test_report_text_stays_readable_at_narrow_and_wide_widths(
    browser: Any, tmp_path: Path, width: int
) -> None:
    """At 700 px and 1,400 px every chart label renders at 9 px or more (the charts scroll
    sideways rather than shrink), nothing overflows the page but the chart boxes, and a
    chat without a budget is drawn without a window."""
    out = tmp_path / "plain.html"
    run = lamina("report", str(ROOT / "examples" / "chat30.yaml"), "--out", str(out))
    assert run.returncode == 0, run.stderr
    page = browser.new_page()
    try:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(out.resolve().as_uri())
        page.wait_for_load_state("load")
        sizes = page.evaluate(
            """[...document.querySelectorAll('svg.chart text')].map(t =>
                t.getBoundingClientRect().height)"""
        )
        assert sizes and min(sizes) >= 9, sizes
        fonts = page.evaluate(
            """[...document.querySelectorAll('td, th, p, h2, h3, .card span')].map(e =>
                parseFloat(getComputedStyle(e).fontSize))"""
        )
        assert min(fonts) >= 12
        overflow = page.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0
        headings = page.evaluate("[...document.querySelectorAll('h2')].map(h => h.textContent)")
        assert "How the window filled" not in headings and "Tokens per layer" in headings
        assert page.evaluate("document.querySelectorAll('svg .limit, svg .window').length") == 0
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"report-{width}.png"), full_page=False)
    finally:
        page.close()
