"""``lamina replay`` as a user runs it: results file, summary, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

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
    assert not (tmp_path / "results.jsonl.sorting").exists()
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
