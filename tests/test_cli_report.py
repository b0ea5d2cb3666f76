"""`lamina report` and the terminal output that explains itself (demo, run --help, simulate,
inspect), run as a user runs them."""

from __future__ import annotations

from pathlib import Path

import lxml.html
import pytest

from tests.cli import lamina
from tests.test_cli import script  # noqa: F401 (the fixture)


def _turn_groups(path: Path) -> list[str]:
    doc = lxml.html.document_fromstring(path.read_bytes())
    return doc.xpath("//svg[contains(@class, 'window-chart')]/g[@class='turn']/@data-turn")


def test_report_of_a_script_and_of_its_saved_chat_are_the_same_page(
    script: Path, tmp_path: Path  # noqa: F811
) -> None:
    """The store's rebuilt turns give the same page as the script (but for the title)."""
    direct, saved = tmp_path / "direct.html", tmp_path / "saved.html"
    out = lamina("report", str(script), "--out", str(direct))
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"report: {direct.resolve()} (2 turns)\n"
    store = tmp_path / "chat.sqlite"
    assert lamina("run", str(script), "--store", str(store), "--conversation", "c1").returncode == 0
    out = lamina("report", "--store", str(store), "--conversation", "c1", "--out", str(saved))
    assert out.returncode == 0, out.stderr
    assert _turn_groups(direct) == _turn_groups(saved) == ["1", "2"]
    body = lxml.html.document_fromstring(saved.read_bytes()).xpath("//main")[0]
    expected = lxml.html.document_fromstring(direct.read_bytes()).xpath("//main")[0]
    assert lxml.html.tostring(body) == lxml.html.tostring(expected)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "give a SCRIPT or --store FILE --conversation ID"),
        (("--store", "nope.sqlite", "--conversation", "c"), "no such store file"),
        (("--store", "x.sqlite"), "--store: needs --conversation ID"),
    ],
)
def test_report_usage_errors_are_one_line(args: tuple[str, ...], message: str) -> None:
    out = lamina("report", *args)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and message in out.stderr


def test_demo_ends_with_the_report_path(tmp_path: Path) -> None:
    out = lamina("demo", "--report", str(tmp_path / "r.html"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().splitlines()[-1] == (
        f"report: {(tmp_path / 'r.html').resolve()} (the whole conversation on one HTML page)"
    )
    assert _turn_groups(tmp_path / "r.html") == ["1", "2", "3", "4", "5", "6"]


def test_demo_introduces_itself_explains_each_small_prefix_and_says_what_next(
    tmp_path: Path,
) -> None:
    out = lamina("demo", "--report", str(tmp_path / "r.html")).stdout
    text = " ".join(out.split())
    assert text.startswith("Lamina demo: six turns of a chat over a small notes vault.")
    # One total per request: the bands as sent add up to it, and no second figure.
    assert (
        "request: L1=28 L2=0 deferred=0 L3=1284 L4=0 L5=4 framing=14 = 1330 tokens sent; "
        "limit 3800 (window 4800 - reserve 1000), headroom 2470" in text
    )
    assert "tokens used" not in text and "budget plan" not in text
    assert "why: First request of the chat: nothing is cached yet." in text
    # Turn 2 appends to turn 1's request (the library's growth is deferred): said so,
    # not that the library was added to the system message.
    assert (
        "why: The request extends turn 1's byte for byte: it repeats 1,327 of that "
        "request's 1,330 tokens; the 1,668 new tokens follow it" in text
    )
    assert "The library grew by 1 entry" not in text
    # The budget's cut falls in the library's deferred growth (turn 4): the batch re-sends
    # its messages from that entry's block on, said so, not shown as a code.
    assert "why: The budget changed an entry of the library's deferred growth" in text
    assert "l2-compacted:" not in text and "library-shed" not in text
    summary = text.split("─ Summary ─", 1)[1]
    assert summary.lstrip("─ ").startswith("6 turns: ")
    assert "1 prefix break (turn 4)" in summary
    # The claim beside its baseline: each layout's tokens, requests over, largest, cost.
    baseline = summary.split("─ Against other layouts ─", 1)[1]
    assert "default 18,285 tokens sent" in baseline
    assert "append-only 19,341 tokens sent" in baseline and "3 of 6 over the limit" in baseline
    assert "naive: the yardstick" in baseline
    assert "lamina demo --full" in text.split("─ Next ─", 1)[1]


def test_run_prints_the_last_request_and_a_summary_not_every_request(tmp_path: Path) -> None:
    """A 30-turn run is a page per turn of tables and one request, ending in a summary;
    'Turn N:' is not said twice when the script's queries start with it."""
    from tests.cli import ROOT

    out = lamina("run", str(ROOT / "examples" / "chat30.yaml"), "--window", "6000")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) < 1500, len(lines)
    assert sum(line == "request" for line in lines) == 1
    assert not any("Turn 1: Turn 1:" in line for line in lines)
    assert any("─ Summary ─" in line for line in lines)
    assert "decisions;" in out.stdout or "decision;" in out.stdout
    everything = lamina(
        "run", str(ROOT / "examples" / "chat30.yaml"), "--window", "6000", "--messages", "all"
    )
    assert sum(line == "request" for line in everything.stdout.splitlines()) == 30


def test_run_help_describes_the_script_format() -> None:
    out = lamina("run", "--help").stdout
    for line in ("system: You are terse.", "  turns:", "- note: project-spec.md", "reply:",
                 "vault_changes:", "Example: examples/chat30.yaml"):
        assert line in out


def test_simulate_explains_its_columns(script: Path) -> None:  # noqa: F811
    out = lamina("simulate", str(script)).stdout
    assert "cached% = cached / input" in out and "cost/naive = cost /" in out
    assert "cost/uncached  input cost with the provider's cache prices" in lamina(
        "simulate", "--help"
    ).stdout


def test_inspect_cuts_a_long_query_at_a_word_with_a_marker(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    query = "alpha " * 5 + "supercalifragilistic expialidocious " * 3
    path.write_text(f"turns: [{{user: '{query}'}}]\n", encoding="utf-8")
    out = lamina("inspect", str(path), env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    title = " ".join(out.stdout.split("┏", 1)[0].split())  # rich wraps it at words
    assert title == (
        "turn 1: alpha alpha alpha alpha alpha supercalifragilistic …"
    )
