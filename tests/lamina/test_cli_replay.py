"""``lamina replay`` as a user runs it: results file, summary, one-line errors."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import lxml.html

from benchmarks.replay_corpus import write_configs, write_replay_corpus
from lamina import replay
from tests.cli import lamina


def test_replay_writes_sorted_results_and_prints_the_summary(tmp_path: Path) -> None:
    chats = write_replay_corpus(tmp_path, 5, seed=7)
    (chats / "zz-broken.json").write_text("{not json", encoding="utf-8")
    configs = [str(p) for p in write_configs(tmp_path / "configs")]
    out = tmp_path / "results.jsonl"
    args = ["replay", str(chats), "--config", configs[0], "--config", configs[1]]
    proc = lamina(*args, "--workers", "2", "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    expected = replay(chats, configs, engine="serial").lines()
    assert out.read_text(encoding="utf-8") == "".join(line + "\n" for line in expected)
    assert not (tmp_path / "results.jsonl.partial").exists()
    summary = json.loads(proc.stdout)
    assert summary["conversations"] == 6 and summary["compared"] == 5
    assert summary["configs"]["pin"]["errors"] == 1
    assert set(summary["winners"]) == {"openai", "anthropic", "gemini"}
    assert "6 conversations x 2 configs" in proc.stderr and "engine local" in proc.stderr

    table = lamina(*args, "--engine", "serial")
    assert table.returncode == 0, table.stderr
    assert "cheapest config per provider" in table.stdout


def test_bad_input_is_one_line_and_status_2(tmp_path: Path) -> None:
    chats = write_replay_corpus(tmp_path, 1)
    bad = tmp_path / "bad.yaml"
    bad.write_text("budget: {windw: 10}\n", encoding="utf-8")
    good = write_configs(tmp_path / "configs")[0]
    cases = [
        (["replay", str(chats), "--config", str(bad)], "config.budget.windw"),
        (["replay", str(tmp_path / "nowhere"), "--config", str(good)], "no such file or folder"),
        (["replay", str(chats), "--config", str(good), "--address", "tcp://x:1"], "--address"),
        (["replay", "--config", str(good)], "give a corpus"),
    ]
    for args, needle in cases:
        proc = lamina(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("lamina: error: ")
        assert needle in proc.stderr


HOSTILE_NAME = "<script>x<!--y-->'\"&.yaml"
HOSTILE_SCRIPT = """vault: ../vault
turns:
  - user: "</pre></svg><script>alert(1)</script><!-- x --> \\"' onmouseover=\\"alert(2)\\""
    reply: "It says <script>alert(9)</script>"
  - user: again
    attach: [{note: "<b>missing</b>.md"}]
  - user: third
"""


def write_report_corpus(root: Path) -> tuple[Path, list[str]]:
    """Three generated chats and one whose name and text are markup and whose second
    turn fails (a missing note): the worst of every config, with a one-turn report."""
    chats = write_replay_corpus(root, 3, seed=7)
    (chats / HOSTILE_NAME).write_text(HOSTILE_SCRIPT, encoding="utf-8")
    return chats, [str(p) for p in write_configs(root / "configs")]


def test_replay_report_links_the_worst_conversations_reports(tmp_path: Path) -> None:
    chats, configs = write_report_corpus(tmp_path)
    out, report = tmp_path / "results.jsonl", tmp_path / "out" / "run report.html"
    proc = lamina("replay", str(chats), "--config", configs[0], "--config", configs[1],
                  "--engine", "serial", "--out", str(out), "--report", str(report),
                  "--worst", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)  # the summary on stdout stays JSON; the report line is on stderr
    assert f"report: {report} (4 conversations x 2 configs; 4 conversation reports)\n" in (
        proc.stderr
    )
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    doc = lxml.html.document_fromstring(report.read_bytes())
    for chart in doc.xpath("//svg[contains(@class, 'config-chart')]"):
        mine = [r for r in rows if r["config"] == chart.get("data-config")]
        sent = [int(v) for v in chart.xpath("./g[@class='conversation']/@data-tokens-sent")]
        assert sent == [r["tokens_sent"] for r in mine] and len(sent) == 4
    items = doc.xpath("//ol[@class='worst']/li")
    assert len(items) == 4
    for li, config in zip(items, ["pin", "pin", "tight", "tight"], strict=True):
        (href,) = li.xpath("./a/@href")
        page = report.parent / urllib.parse.unquote(href)
        assert page.is_file() and page.parent.name == "run report_files"
        name = li.xpath("./a")[0].text_content()
        (row,) = [r for r in rows if r["conversation"] == name and r["config"] == config]
        linked = lxml.html.document_fromstring(page.read_bytes())
        turns = linked.xpath("//svg[contains(@class, 'window-chart')]/g[@class='turn']")
        assert len(turns) == row["turns"]
        assert linked.xpath("//head/title/text()") == [
            f"Lamina report: {name} under config {config}"
        ]
    assert [li.xpath("./a")[0].text_content() for li in items[::2]] == [HOSTILE_NAME] * 2
    assert "error at turn 2: NoteNotFound: <b>missing</b>.md" in items[0].text_content()
