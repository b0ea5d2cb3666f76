"""`lamina bench` at its smallest scale, end to end, so the benchmark cannot rot."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from benchmarks.comparators import NOT_INSTALLED, PEERS
from benchmarks.workload import conversation_workload, library_workload, make_note

ROOT = Path(__file__).resolve().parents[2]
BENCH = (sys.executable, "-m", "lamina._cli", "bench")


def test_small_scale_runs_end_to_end_and_writes_the_result_shape(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "lamina._cli", "bench", "--scale", "small", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # the command finds benchmarks/ from its own location, not the cwd
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["scale"] == "small"
    assert doc["machine"]["cores"] >= 1
    assert {p["kind"] for p in doc["points"]} == {"cold", "library", "conversation"}
    for point in doc["points"]:
        lamina = point["lamina"]
        assert lamina["cold_s"] > 0 and lamina["request_tokens"] > 0
        assert lamina["peak_bytes"] > 0 and point["payload_bytes"] > 0
        assert point["naive"]["p50_s"] > 0
        if point["kind"] == "cold":
            assert point["floor"]["tiktoken_s"] > 0
            assert lamina["promotion_s"] >= 0  # timed apart from the turn
        else:
            assert lamina["promotion_p50_s"] >= 0
            assert lamina["warm_p50_s"] > 0 and lamina["warm_p95_s"] >= lamina["warm_p50_s"]
            assert point["floor"]["p50_s"] > 0
            # The turn's own encoding is part of the counter's delta, the promotion's too.
            assert 0 < lamina["turn_encoded_chars_p50"] <= lamina["encoded_chars_p50"]
        assert set(point["peers"]) == set(PEERS)
        for name, peer in point["peers"].items():
            assert peer["cannot_express"], name
            assert peer.get("p50_s", 0) > 0 or peer["status"] == NOT_INSTALLED, (name, peer)
    assert {r["kind"] for r in doc["requests"]} == {"stateless", "peers-task"}
    for request in doc["requests"]:
        lamina = request["lamina"]
        assert lamina.get("p50_s", lamina.get("restored_p50_s", 0)) > 0
        if request["kind"] == "stateless":
            assert lamina["first_p50_s"] > 0  # with the process memos emptied first
        assert lamina["request_tokens"] > 0
        assert set(request["peers"]) == set(PEERS)
    assert doc["targets"] and all("met" in t for t in doc["targets"])
    assert "targets" in proc.stdout and "requests: stateless" in proc.stdout


def test_workloads_are_the_same_bytes_for_the_same_seed() -> None:
    a, b = conversation_workload(3, 10), conversation_workload(3, 10)
    assert a == b
    assert a != conversation_workload(4, 10)


def test_notes_have_headings_lists_and_code_at_the_asked_size() -> None:
    text = make_note(random.Random(1), 20_000, "Sizes")
    assert 20_000 <= len(text) < 25_000
    assert text.startswith("# Sizes\n") and "\n## " in text
    assert "\n- " in text or "\n1. " in text
    assert "```" in text


def test_library_turns_each_add_one_new_10_kb_note_and_reattach_library_notes() -> None:
    work = library_workload(1, 10, 3)
    assert len(work.library) == 10 and len(work.turns) == 3
    for turn in work.turns:
        (new,) = turn.new
        assert 10_000 <= len(work.notes[new]) < 13_000
        assert any(p in work.library for p in turn.attach)


def test_replay_suite_measures_every_engine_and_checks_they_agree(tmp_path: Path) -> None:
    out = tmp_path / "replay.json"
    proc = subprocess.run(
        [*BENCH, "--suite", "replay", "--conversations", "8", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["conversations"] == 8 and doc["identical_results"] is True
    engines = {(r["engine"], r["workers"]) for r in doc["runs"]}
    assert {("serial", 1), ("local", 1), ("dask", 1)} <= engines
    assert all(r["conversations_per_s"] > 0 for r in doc["runs"])
    assert set(doc["speedup_per_added_worker"]) == {"local", "dask"}
    assert "conversations/s" in proc.stdout
