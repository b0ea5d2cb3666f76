"""The server benchmark runs end to end on a tiny point and reports every measure."""

from __future__ import annotations

from benchmarks.server import run_server_bench


def test_the_server_benchmark_reports_throughput_latency_and_overhead() -> None:
    doc = run_server_bench(conversations=2, turns=3, rounds=2)
    assert doc["suite"] == "server"
    assert doc["concurrent"]["turns_per_s"] > 0
    assert 0 < doc["concurrent"]["p50_ms"] <= doc["concurrent"]["p99_ms"]
    sequential = doc["sequential"]
    assert doc["paired_turns"] == 6
    assert set(sequential) == {
        "http_p50_ms",
        "http_p95_ms",
        "build_p50_ms",
        "build_and_save_p50_ms",
        "build_and_save_p95_ms",
        "overhead_p50_ms",
        "overhead_p99_ms",
        "http_over_build_and_save_p50_ms",
        "http_over_build_and_save_p95_ms",
        "http_to_build_and_save_ratio_p50",
        "server_cpu_over_build_and_save_p50_ms",
        "server_cpu_over_build_and_save_p95_ms",
        "reply_in_process_p50_ms",
        "http_reply_over_in_process_p50_ms",
        "http_reply_over_in_process_p95_ms",
    }
    assert sequential["build_p50_ms"] > 0
    assert sequential["http_to_build_and_save_ratio_p50"] > 0
    assert isinstance(sequential["server_cpu_over_build_and_save_p50_ms"], float)
