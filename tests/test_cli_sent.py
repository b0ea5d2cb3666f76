"""Every view is the request as sent: the bands add up to the one count, and each cache
sentence of ``lamina run examples/chat30.yaml --vault examples/vault --window 6000`` is
read against the counts, under both layouts (the library's growth deferred, or not), and
at 4,500 where the deferred chat sheds."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from tests.cli import ROOT, Ran, lamina_here

CHAT30 = str(ROOT / "examples" / "chat30.yaml")
VAULT = str(ROOT / "examples" / "vault")
LIMIT = 6000 - 1500  # window - min(4096, window / 4)


def _run(*flags: str, window: int = 6000) -> Ran:
    return lamina_here("run", CHAT30, "--vault", VAULT, "--window", str(window), *flags)


Runs = tuple[str, list[dict[str, Any]], str, int]
# At 4,500 the deferred chat sheds its growth (turn 4) and cuts cached library entries;
# at 6,000 it settles where it would shed and moves history instead.
_WINDOWS = {"deferred": 6000, "grown": 6000, "deferred-4500": 4500}


@pytest.fixture(scope="module", params=list(_WINDOWS))
def runs(request: pytest.FixtureRequest) -> Runs:
    """The layout, the chat's JSON trace, its human output and its limit."""
    flags = ("--no-defer-library",) if request.param == "grown" else ()
    window = _WINDOWS[request.param]
    trace = _run("--json", *flags, window=window)
    shown = _run(*flags, window=window)
    assert trace.returncode == 0 and shown.returncode == 0, trace.stderr + shown.stderr
    limit = window - min(4096, window // 4)
    return str(request.param), json.loads(trace.stdout)["turns"], shown.stdout, limit


def _n(text: str) -> int:
    return int(text.replace(",", ""))


def _settled(turn: Mapping[str, Any]) -> list[str]:
    keys = [s["key"] for s in turn["layers"]["L2"]["segments"]]
    batch = turn.get("batch")
    return keys if batch is None else keys[: batch["settled_entries"]]


def _extended(turn: Mapping[str, Any], previous: Mapping[str, Any]) -> bool:
    """The cached prefix is the whole request before but its framing."""
    cached = turn["cache"]["common_prefix_tokens"]
    return cached >= previous["tokens_total"] - previous["sent"]["framing"]


def _l2_tokens(turn: Mapping[str, Any], key: str) -> int | None:
    """The tokens of library entry ``key`` in the turn's envelope as built (None: not in it)."""
    segments = turn["layers"]["L2"]["segments"]
    return next((int(s["tokens"]) for s in segments if s["key"] == key), None)


def _chain(decisions: Sequence[Mapping[str, Any]], key: str) -> list[Mapping[str, Any]]:
    """The budget's steps on library entry ``key``, each from the form the one before left:
    a later cut of this turn's item of the same key (from its full form) is not one."""
    steps: list[Mapping[str, Any]] = []
    for d in decisions:
        if d["target"] != key or d["action"] == "referenced":
            continue
        if steps and d["from"] != steps[-1]["to"]:
            break
        steps.append(d)
    return steps


def _check(turn: Mapping[str, Any], previous: Mapping[str, Any] | None) -> str:
    """Read the turn's sentence against its counts; returns which kind it was."""
    sentence = turn["cache"]["sentence"]
    cached, total = turn["cache"]["common_prefix_tokens"], turn["tokens_total"]
    if not sentence:
        assert previous is not None and cached / total >= 0.5
        return "none"
    if sentence == "First request of the chat: nothing is cached yet.":
        assert previous is None and cached == 0
        return "first"
    assert previous is not None
    if m := re.fullmatch(
        r"The request extends turn (\d+)'s byte for byte: it repeats ([\d,]+) of that "
        r"request's ([\d,]+) tokens; the ([\d,]+) new tokens follow it \(the reply and this "
        r"turn's message: ([\d,]+) tokens of context, ([\d,]+) of query\)\.",
        sentence,
    ):
        assert int(m[1]) == previous["turn"] and _n(m[2]) == cached
        assert _n(m[3]) == previous["tokens_total"] and _n(m[4]) == total - cached
        assert (_n(m[5]), _n(m[6])) == (turn["sent"]["L3"], turn["sent"]["L5"])
        assert _extended(turn, previous) and turn["cache"]["break_reason"] is None
        return "extends"
    if m := re.match(r"The library in the system message grew by (\d+) entr", sentence):
        grown = [k for k in _settled(turn) if k not in _settled(previous)]
        assert int(m[1]) == len(grown) > 0
        assert turn["sent"]["L2"] > previous["sent"]["L2"]
        assert not _extended(turn, previous)
        return "library-grew"
    if m := re.fullmatch(
        r"The library's deferred growth settled( because the extended request would not have "
        r"fit the window| because the budget gave back whole an entry an earlier user message "
        r"sent cut)?: (.*), so the request repeats the one before only up to there "
        r"\(([\d,]+) of ([\d,]+) tokens\)\.",
        sentence,
    ):
        causes = {
            " because the extended request would not have fit the window": "over-budget",
            " because the budget gave back whole an entry an earlier user message sent cut": (
                "given-back"
            ),
        }
        if m[1]:
            assert causes[m[1]] == turn["batch"]["settled"]
        else:
            assert turn["batch"]["settled"] not in causes.values()
        assert (_n(m[3]), _n(m[4])) == (cached, total)
        assert previous["sent"]["deferred"] > 0 == turn["sent"]["deferred"]
        grew = [k for k in _settled(turn) if k not in _settled(previous)]
        assert ("the library in the system message took" in m[2]) == bool(grew)
        return "settled"
    if m := re.fullmatch(
        r"The budget changed an entry of the library's deferred growth, so the earlier user "
        r"messages that carry it are sent as before up to that entry's block and as built "
        r"from there; the request repeats the one before only up to there "
        r"\(([\d,]+) of ([\d,]+) tokens\)\.",
        sentence,
    ):
        assert (_n(m[1]), _n(m[2])) == (cached, total)
        assert turn["cache"]["break_reason"] == "library-shed"
        assert previous["sent"]["deferred"] > 0 and turn["sent"]["deferred"] > 0
        assert _settled(turn) == _settled(previous)  # the system message kept
        assert not _extended(turn, previous)
        return "shed"
    decisions = turn["budget"]["decisions"]
    if m := re.match(
        r"The budget cut library entry (\S+) from (\w+) to .* \(saving ([\d,]+) tokens\)",
        sentence,
    ):
        steps = _chain(decisions, m[1])
        assert steps and steps[0]["from"] == m[2]
        assert _n(m[3]) == sum(d["tokens_saved"] for d in steps)
        was, now = _l2_tokens(previous, m[1]), _l2_tokens(turn, m[1])
        assert was is None or now is None or was - now == _n(m[3])
        assert not _extended(turn, previous)
        return "cut"
    if m := re.match(r"Library entry (\S+) was restored from (\w+) to (\w+) ", sentence):
        steps = _chain(decisions, m[1])
        assert any(d["action"] == "restored" for d in steps)
        assert (steps[0]["from"], steps[-1]["to"]) == (m[2], m[3]) and m[3] != "reference"
        assert not _extended(turn, previous)
        return "restored"
    if m := re.fullmatch(
        r"The earlier messages recalled for turn (\d+) belong to that turn only: its message "
        r"is sent again without them, so the request repeats the one before only up to there "
        r"\(([\d,]+) of ([\d,]+) tokens\)\.",
        sentence,
    ):
        assert int(m[1]) == previous["turn"] and (_n(m[2]), _n(m[3])) == (cached, total)
        assert any(s["key"] == "recalled:history" for s in previous["layers"]["L3"]["segments"])
        assert not _extended(turn, previous)
        return "recalled"
    if sentence.startswith("The budget moved where the history starts"):
        assert any(
            d["action"] in ("history-cut", "restored") and d["target"].startswith("history:")
            for d in decisions
        )
        assert not _extended(turn, previous)
        return "history"
    raise AssertionError(f"turn {turn['turn']}: a sentence no test reads: {sentence}")


def test_each_cache_sentence_holds_against_the_counts(runs: Runs) -> None:
    layout, turns, shown, _ = runs
    kinds = []
    previous = None
    for turn in turns:
        kinds.append(_check(turn, previous))
        if turn["cache"]["sentence"]:
            assert f"why: {turn['cache']['sentence']}" in " ".join(shown.split())
        previous = turn
    assert kinds[0] == "first"
    # Every kind a deferred chat has is read at least once.
    if layout == "deferred":
        assert {"extends", "settled", "restored", "history", "none"} <= set(kinds), kinds
    elif layout == "deferred-4500":
        assert {"extends", "shed", "cut", "none"} <= set(kinds), kinds  # settled: at 6,000
    else:  # its budget cuts no library entry the cache holds: each break moves history
        assert {"library-grew", "history", "none"} <= set(kinds), kinds
        assert "extends" not in kinds and "settled" not in kinds


def test_the_bands_add_up_to_the_one_count_the_budget_reports(runs: Runs) -> None:
    _, turns, shown, limit = runs
    totals = [_n(t) for t in re.findall(rf"= (\d+) tokens sent; limit {limit}", shown)]
    assert totals == [t["tokens_total"] for t in turns]
    for turn in turns:
        assert sum(turn["sent"].values()) == turn["tokens_total"] <= limit
        assert turn["budget"]["sent"] == turn["tokens_total"]
        assert min(turn["sent"].values()) >= 0
        assert turn["cache"]["common_prefix_tokens"] <= turn["tokens_total"]
    assert "tokens used" not in shown and "budget plan" not in shown


def test_deferred_context_is_its_own_band() -> None:
    """Under the default layout, context riding in earlier user messages is counted in
    the deferred band, never as L2; with the library grown every turn there is none."""
    deferred = json.loads(_run("--json").stdout)["turns"]
    grown = json.loads(_run("--json", "--no-defer-library").stdout)["turns"]
    assert all(t["sent"]["deferred"] == 0 for t in grown)
    assert all("batch" not in t for t in grown)
    turn = deferred[7]  # turn 8: 4,346 tokens sent while its layers add to 3,874
    assert turn["tokens_total"] == 4346 and turn["sent"]["deferred"] == 3781
    built = sum(layer["tokens"] for layer in turn["layers"].values())
    assert built == 3874 < sum(turn["sent"].values()) == 4346
    assert turn["budget"]["used"] != turn["budget"]["sent"] == 4346


def test_the_script_field_and_the_flag_choose_the_layout(tmp_path: Any) -> None:
    text = (ROOT / "examples" / "chat30.yaml").read_text(encoding="utf-8")
    script = tmp_path / "grown.yaml"
    script.write_text("defer_library: false\n" + text, encoding="utf-8")
    field = lamina_here("run", str(script), "--vault", VAULT, "--json")
    assert all("batch" not in t for t in json.loads(field.stdout)["turns"])
    flag = lamina_here("run", str(script), "--vault", VAULT, "--json", "--defer-library")
    assert all("batch" in t for t in json.loads(flag.stdout)["turns"])
    script.write_text("defer_library: sometimes\n" + text, encoding="utf-8")
    bad = lamina_here("run", str(script), "--vault", VAULT)
    assert bad.returncode == 2 and "defer_library" in bad.stderr and "true or false" in bad.stderr


def test_verbose_adds_the_budget_settings() -> None:
    script = str(ROOT / "examples" / "chat30.yaml")
    out = lamina_here("inspect", script, "--vault", VAULT, "--window", "6000", "--verbose")
    plans = [line for line in out.stdout.splitlines() if line.startswith("budget settings: ")]
    assert len(plans) == 30


def test_version() -> None:
    from importlib.metadata import version

    out = lamina_here("--version")
    assert out.returncode == 0 and out.stdout == f"lamina {version('lamina')}\n"


def test_simulate_shows_each_layout_beside_the_window() -> None:
    """Per layout: tokens sent, requests over the limit, the largest request, the cost;
    the naive row explained."""
    text = lamina_here("simulate", CHAT30, "--vault", VAULT, "--window", "6000")
    data = json.loads(
        lamina_here("simulate", CHAT30, "--vault", VAULT, "--window", "6000", "--json").stdout
    )
    assert data["limit"] == LIMIT
    rows: Sequence[str] = text.stdout.splitlines()
    for layout, series in data["layouts"].items():
        figures = series["openai"]
        largest = max(t["input_tokens"] for t in figures["turns"])
        over = sum(t["input_tokens"] > LIMIT for t in figures["turns"])
        assert (figures["largest_request"], figures["over_limit"]) == (largest, over)
        row = next(r for r in rows if r.startswith(f"{layout} ") and " openai " in r)
        assert row.split()[-2:] == [str(largest), str(over)]
    assert data["layouts"]["default"]["openai"]["over_limit"] == 0
    assert data["layouts"]["append-only"]["openai"]["over_limit"] == 22
    assert "naive: the yardstick, not a layout Lamina sends" in text.stdout
