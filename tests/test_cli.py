"""The CLI as a user runs it: subprocesses, byte-identical output, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli import lamina


@pytest.fixture
def script(tmp_path: Path, vault: Path) -> Path:
    path = tmp_path / "chat.yaml"
    path.write_text(
        f"""
system: {{stable: "You are terse.", mutable: "Memory: metric units."}}
vault: {vault}
turns:
  - user: Summarize this
    attach: [{{note: project-spec.md}}, {{selection: "x = 1", source: a.py, lines: [1, 1]}}]
    reply: It is a spec.
  - user: And the API?
    attach: [{{note: project-spec.md}}, {{folder: docs}}]
    vault_changes: {{docs/auth.md: "# Auth\\n\\nchanged"}}
""",
        encoding="utf-8",
    )
    return path


def test_run_json_is_byte_identical_across_processes(script: Path) -> None:
    first, second = lamina("run", str(script), "--json"), lamina("run", str(script), "--json")
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    trace = json.loads(first.stdout)
    assert trace["lamina_trace"] == 1 and trace["tokenizer"] == "o200k_base"
    t1, t2 = trace["turns"]
    assert [s["key"] for s in t1["layers"]["L1"]["segments"]] == ["system:stable", "system:mutable"]
    assert t1["layers"]["L5"]["segments"][0]["key"] == "query"
    assert [s["form"] for s in t2["layers"]["L3"]["segments"]] == ["reference", "full", "full"]
    assert [s["key"] for s in t2["layers"]["L4"]["segments"]] == [
        "history:1:user",
        "history:1:assistant",
    ]
    assert t2["messages"][0]["role"] == "system"
    assert t2["tokens_total"] > sum(layer["tokens"] for layer in t2["layers"].values())


def test_demo_runs_and_json_is_stable() -> None:
    out = lamina("demo")
    assert out.returncode == 0, out.stderr
    assert "cached prefix" in out.stdout and "Turn 3" in out.stdout
    a, b = lamina("demo", "--json"), lamina("demo", "--json")
    assert a.stdout == b.stdout
    turns = json.loads(a.stdout)["turns"]
    assert [s["key"] for s in turns[2]["layers"]["L2"]["segments"]] == [
        "note:project-spec.md",
        "note:docs/api-docs.md",
    ]


def test_cl100k_tokenizer_option(script: Path) -> None:
    out = lamina("run", str(script), "--json", "--tokenizer", "cl100k_base")
    assert json.loads(out.stdout)["tokenizer"] == "cl100k_base"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("turns: [", "not valid YAML"),
        ("turns: []", "turns: must be a non-empty list"),
        ("turns: [{user: hi, attach: [{video: x}]}]", "unknown attachment kind"),
        ("turns: [{user: hi, attach: [{note: ../../etc/passwd}]}]", "escapes the vault"),
        ("turns: [{user: hi, attach: [{note: nope.md}]}]", "no such note"),
        ("turns: [{user: hi, colour: red}]", "unknown turn field"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, vault: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "bad.yaml"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    out = lamina("run", str(path), "--vault", str(vault))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lamina: error:"), out.stderr
    assert message in lines[0]
    assert "Traceback" not in out.stderr


def test_run_with_a_window_adds_the_budget_and_fits(script: Path) -> None:
    out = lamina("run", str(script), "--json", "--window", "900", "--reserve", "100")
    assert out.returncode == 0, out.stderr
    for turn in json.loads(out.stdout)["turns"]:
        assert turn["budget"]["window"] == 900 and turn["budget"]["reserve_output"] == 100
        assert turn["budget"]["used"] <= 800
        assert "timings" not in turn
        assert set(turn["cache"]) == {"common_prefix_tokens", "break_reason", "sentence"}


def test_a_window_smaller_than_the_query_fails_loudly(script: Path) -> None:
    out = lamina("run", str(script), "--window", "20", "--reserve", "10")
    assert out.returncode == 2
    assert "do not fit the limit of 10" in out.stderr and "Traceback" not in out.stderr


def test_timings_are_opt_in(script: Path) -> None:
    out = lamina("run", str(script), "--json", "--timings")
    turn = json.loads(out.stdout)["turns"][1]
    assert set(turn["timings"]["ms"]) >= {"process", "expand", "dedup", "reference", "render"}
    assert turn["timings"]["ms"]["total"] > 0
    assert turn["stats"]["segments"]["L2"] == 2


def test_inspect_shows_every_artifact_and_the_window_bar(script: Path) -> None:
    out = lamina("inspect", str(script), "--window", "4000", "--verbose")
    assert out.returncode == 0, out.stderr
    assert "note:project-spec.md" in out.stdout and "reference" in out.stdout
    assert "of limit 3000 tokens sent" in out.stdout
    # With --verbose, the budget's settings and its headroom in tokens.
    assert "budget settings: headroom 0.05, cache_weight 0.9, text_free_share 0.1" in out.stdout
    assert "headroom_tokens 150" in out.stdout


def test_demo_shows_every_builtin_source_type() -> None:
    out = lamina("demo", "--json")
    keys = [
        s["key"] for t in json.loads(out.stdout)["turns"] for s in t["layers"]["L3"]["segments"]
    ]
    kinds = {k.split(":", 1)[0] for k in keys}
    assert kinds >= {"note", "selection", "pdf", "youtube", "url"}, kinds


def test_private_network_urls_are_refused_unless_allowed(tmp_path: Path) -> None:
    script = tmp_path / "url.yaml"
    script.write_text("turns: [{user: hi, attach: [{url: 'http://127.0.0.1:9/x'}]}]")
    out = lamina("run", str(script))
    assert out.returncode == 2 and "private-network" in out.stderr
    allowed = lamina("run", str(script), "--allow-private-network")
    assert allowed.returncode == 2 and "private-network" not in allowed.stderr


def test_inspect_and_the_trace_name_the_entries_sent_whole_again() -> None:
    """chat30 at 4,000: turn 16's request (a settle) sends the cut meeting note of 19
    October whole again (restore by appending); `inspect` says so on its request line
    and the trace lists its key under the batch, with the other turn that restores it:
    turn 19. (Pinned again when a copy in L3 came to be valued by what it adds to the
    library's: before, turn 17 sent the design review whole again, turn 15 the review
    and the auth notes, turn 24 the meeting note; and when the budget's rungs became
    exact counts, framed as blocks of the request.)"""
    chat = str(Path(__file__).resolve().parents[1] / "examples" / "chat30.yaml")
    out = lamina("inspect", chat, "--window", "4000")
    assert out.returncode == 0, out.stderr
    note = "note:meetings/2026-10-19.md"
    held = "the system message holds 3 of 3 library entries; sent whole again"
    assert f"request: settled (over-budget): {held}: {note}" in out.stdout.splitlines()
    run = lamina("run", chat, "--window", "4000", "--json")
    assert run.returncode == 0, run.stderr
    turns = json.loads(run.stdout)["turns"]
    restored = {i + 1: t["batch"]["restored"] for i, t in enumerate(turns)
                if t["batch"].get("restored")}  # fmt: skip
    assert restored == {16: [note], 19: [note]}
