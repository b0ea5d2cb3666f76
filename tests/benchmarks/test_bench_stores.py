"""`lamina bench --suite stores` end to end: both backends, both depths, ratios in one run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.stores import PgServer

ROOT = Path(__file__).resolve().parents[2]


def test_store_bench_measures_both_backends_and_their_ratios(
    tmp_path: Path, pg_server: PgServer
) -> None:
    out = tmp_path / "stores.json"
    proc = subprocess.run(
        [sys.executable, "-m", "lamina._cli", "bench", "--suite", "stores", "--out", str(out),
         "--postgres", pg_server.create_database()],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
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
    assert "postgres / sqlite" in proc.stdout
