"""`lamina bench --suite stores` end to end: both backends, both depths, ratios in one run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.stores import PgServer

ROOT = Path(__file__).resolve().parents[2]
STUCK_S = 200
"""Seconds the bench may run (a few here) before its stacks are taken and it is killed:
under the suite's per-test limit, so a stuck run fails this test, not the worker."""


def test_store_bench_measures_both_backends_and_their_ratios(
    tmp_path: Path, pg_server: PgServer
) -> None:
    out = tmp_path / "stores.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lamina._cli", "bench", "--suite", "stores", "--out", str(out),
         "--postgres", pg_server.create_database()],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=STUCK_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGUSR1)  # the bench and its workers print their stacks
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the bench ran over {STUCK_S} s; its stacks:\n{proc.communicate()[1]}")
    assert proc.returncode == 0, stderr
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert set(doc["backends"]) == {"sqlite", "postgres"}
    for found in doc["backends"].values():
        assert set(found["latency"]) == {"10", "100"}
        for point in found["latency"].values():
            assert point["save_s"] > 0 and point["load_s"] > 0 and point["head_s"] > 0
        assert found["throughput"]["workers"] == 8 and found["throughput"]["turns_per_s"] > 0
    assert set(doc["ratios"]) == {
        f"{m}_{d}" for m in ("save_s", "load_s", "head_s") for d in (10, 100)
    } | {"turns_per_s"}
    assert "postgres / sqlite" in stdout


def test_a_worker_that_cannot_open_its_store_ends_the_throughput_run_at_once(
    tmp_path: Path,
) -> None:
    """The workers and the clock meet at a barrier; a worker failing before it would leave
    the others waiting there for ever, so it breaks the barrier and the run fails."""
    from benchmarks import stores

    (tmp_path / "vault").mkdir()
    vault = stores._vault(tmp_path / "vault")
    with pytest.raises(RuntimeError, match="a store worker failed: exit codes"):
        stores._throughput(str(tmp_path), vault, 2)  # a folder: no SQLite file opens
