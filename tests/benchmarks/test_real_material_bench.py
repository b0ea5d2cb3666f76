"""``benchmarks/real_material.py`` on the two vaults in the repository, end to end, so the
benchmark run on fetched vaults cannot rot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.real_material import (
    HELD_OUT,
    MAX_GROUP,
    chats,
    compare,
    forgone,
    summary,
    vault_shape,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "vault"
KEPANO = ROOT / "tests" / "data" / "kepano-obsidian"


def test_the_chats_come_from_the_vaults_largest_groups_and_notes() -> None:
    """Folders and tags of at most MAX_GROUP notes, none inside another chosen, largest
    first; the largest notes by bytes; the same script every time."""
    shape = vault_shape(KEPANO)
    assert shape.notes == len(list(KEPANO.rglob("*.md")))
    assert shape.folders[0] == ("Templates", 52)
    for groups in (shape.folders, shape.tags):
        counts = [n for _, n in groups]
        assert counts == sorted(counts, reverse=True) and all(2 <= n <= MAX_GROUP for n in counts)
        names = [g for g, _ in groups]
        assert not any(a.startswith(b + "/") for a in names for b in names)
    sizes = [(KEPANO / p).stat().st_size for p, _ in shape.largest]
    assert sizes == [n for _, n in shape.largest] == sorted(sizes, reverse=True)
    assert chats(shape) == chats(vault_shape(KEPANO))
    mixed, shifted, folder = chats(shape)
    assert [(c.name, len(c.turns)) for c in (mixed, shifted, folder)] == [
        ("mixed", 16),
        ("shifted", 16),
        ("folder", 1),
    ]
    for chat in (mixed, shifted):
        attached = [a for _, attach in chat.turns for a in attach]
        assert {k for a in attached for k in a} == {"folder", "tag", "note"}
        assert len(attached) > len({json.dumps(a) for a in attached})  # re-attachments
    # The shifted chat attaches the fifth to eighth largest groups and notes, none of mixed's.
    first = {json.dumps(a) for _, attach in mixed.turns for a in attach}
    assert not first & {json.dumps(a) for _, attach in shifted.turns for a in attach}
    # A vault with at most four folders and tags has no shifted chat.
    assert [c.name for c in chats(vault_shape(EXAMPLES))] == ["mixed", "folder"]


def test_the_script_judges_each_chat_and_window_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "real.json"
    env = {**os.environ, "LAMINA_VAULTS": os.pathsep.join([str(EXAMPLES), str(KEPANO)])}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.real_material", "--windows", "4096", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    assert "kepano-obsidian: 103 notes" in proc.stdout and "stub+idx" in proc.stdout
    assert "attached" in proc.stdout
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["summary"] == summary(doc) and doc["summary"]["chats"] == 5
    assert "cached_chats 3," in proc.stdout  # mixed in both vaults, shifted in kepano
    assert [v["vault"] for v in doc["vaults"]] == ["vault", "kepano-obsidian"]
    assert not any(v["held_out"] for v in doc["vaults"]) and HELD_OUT
    names = {"vault": ["mixed", "folder"], "kepano-obsidian": ["mixed", "shifted", "folder"]}
    for vault in doc["vaults"]:
        assert [(r["chat"], r["window"]) for r in vault["rows"]] == [
            (name, 4096) for name in names[vault["vault"]]
        ]
        for row in vault["rows"]:
            assert row["over_limit"] == 0 and row["input_tokens"] > 0
            assert 0 < row["window_use"] <= 1.0 and 0 <= row["cached_share"] <= 1.0
            assert 0 < row["attached_share"] <= 1.0
            assert row["turns"] == (1 if row["chat"] == "folder" else 16)
            assert isinstance(row["misses"], list)
            assert sum(row["forgone"].values()) == row["bound_tokens"] - row["cached_tokens"]
    assert f"run forgone: {', '.join(f'{k} {v}' for k, v in forgone(doc).items())}" in proc.stdout


def test_the_script_refuses_to_run_without_vaults() -> None:
    env = {k: v for k, v in os.environ.items() if k != "LAMINA_VAULTS"}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.real_material"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2 and "LAMINA_VAULTS" in proc.stderr


def _row(chat: str, cached: int, bound: int, **judged: object) -> dict[str, object]:
    measures = {"window_use": 0.95, "left_cut": 0, "text_free_share": 0.02, "over_limit": 0}
    return {
        "chat": chat,
        "window": 4096,
        "cached_tokens": cached,
        "bound_tokens": bound,
        "cached_of_bound": round(cached / bound, 4) if bound else 1.0,
        "misses": ["cached"] if bound and cached < 0.8 * bound else [],
        **measures,
        **judged,
    }


def test_a_run_is_summed_up_pooled_and_two_runs_compared() -> None:
    """The chats with a cache measure pooled (their cached tokens over their bounds, not
    the mean of their ratios) and counted against the target; a comparison lists the
    chats whose judged measures moved, then both summaries."""
    before = {
        "vaults": [
            {
                "vault": "v",
                "rows": [
                    _row("mixed", 790, 1000),
                    _row("shifted", 900, 1000),
                    _row("folder", 0, 0),
                ],
            }
        ]
    }
    after = {
        "vaults": [
            {
                "vault": "v",
                "rows": [
                    _row("mixed", 1600, 2000),
                    _row("shifted", 900, 1000, left_cut=2),
                    _row("folder", 0, 0),
                ],
            }
        ]
    }
    assert summary(before) == {
        "chats": 3,
        "cached_chats": 2,
        "cached_met": 1,
        "pooled_cached_of_bound": 0.845,
        "missing": 1,
    }
    assert summary(after)["pooled_cached_of_bound"] == round(2500 / 3000, 4)
    held = {"vault": "h", "held_out": True, "rows": [_row("mixed", 700, 1000)]}
    both = {"vaults": [*after["vaults"], held]}
    assert summary(both)["pooled_cached_of_bound"] == round(3200 / 4000, 4)
    assert {k: v for k, v in summary(both).items() if k.startswith("held_out_")} == {
        "held_out_cached_chats": 1,
        "held_out_cached_met": 0,
        "held_out_pooled_cached_of_bound": 0.7,
    }
    assert compare(before, after) == [
        "v mixed 4096: cached_of_bound 0.79 -> 0.8",
        "v shifted 4096: left_cut 0 -> 2",
        "before: chats 3, cached_chats 2, cached_met 1, pooled_cached_of_bound 0.845, missing 1",
        "after: chats 3, cached_chats 2, cached_met 2, pooled_cached_of_bound 0.8333, missing 0",
    ]


def test_the_cache_forgone_is_pooled_by_how_the_requests_were_sent() -> None:
    """A run's rows' ``forgone`` summed by reason, the largest first (rows written before
    it was kept add nothing); a comparison ends with both runs' sums."""
    doc = {
        "vaults": [
            {
                "vault": "v",
                "rows": [
                    _row("mixed", 790, 1000, forgone={"over-budget": 150, "extended": 60}),
                    _row("shifted", 900, 1000, forgone={"extended": 100}),
                    _row("folder", 0, 0),
                ],
            }
        ]
    }
    assert list(forgone(doc).items()) == [("extended", 160), ("over-budget", 150)]
    assert compare(doc, doc)[-2:] == [
        "before forgone: extended 160, over-budget 150",
        "after forgone: extended 160, over-budget 150",
    ]
