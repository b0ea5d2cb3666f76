"""`python -m benchmarks.store_growth` end to end on a short chat: sizes and the ratio
to the inline manifests measured in the same run."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.store_growth import main


def test_store_growth_reports_sizes_beside_inline_manifests(tmp_path: Path) -> None:
    out = tmp_path / "growth.json"
    main(["--turns", "4", "12", "--out", str(out)])
    short, longer = json.loads(out.read_text(encoding="utf-8"))
    assert (short["turns"], longer["turns"]) == (4, 12)
    assert longer["library"] > short["library"] > 1
    for point in (short, longer):
        assert point["file_bytes"] > 0 and point["manifest_bytes"] > 0
        kinds = set(point["snapshot_bytes"])
        assert {"manifest", "report", "segments", "chunks", "state", "library"} <= kinds
    assert longer["inline_over_chunked"] > short["inline_over_chunked"]
