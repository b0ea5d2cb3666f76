"""The cache report benchmark at one round, so it cannot rot (no time is asserted)."""

from __future__ import annotations

from benchmarks.cache_report import run_cache_report_bench


def test_one_round_measures_every_point_with_the_same_figures() -> None:
    """Each turn's report equals the reference's (the benchmark asserts it as it times)."""
    doc = run_cache_report_bench(rounds=1)
    assert set(doc["report"]) == {"server-workload", "chat30", "chat30-6000"}
    for point in doc["report"].values():
        assert point["turns"] >= 19
        assert point["prefix_report_p50_ms"] > 0 and point["reference_p50_ms"] > 0
    assert doc["hub"]["turns"] == 19
    assert doc["hub"]["hub_turn_p50_ms"] > 0
