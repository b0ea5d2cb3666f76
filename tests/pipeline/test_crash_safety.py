"""A writer killed with SIGKILL at random points leaves a store holding a complete prefix."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline import Conversation, ConversationState, SqliteStore

TURNS = 400
ITERATIONS = 30

WRITER = """
import sys
from pipeline import Conversation, ConversationInfo, SqliteStore, save_turn
from tests.pipeline.test_crash_safety import attach_for

store_path, vault, cid = sys.argv[1:4]
store = SqliteStore(store_path)
store.create(ConversationInfo(cid))
conv = Conversation("Be terse.", vault=vault)
print("ready", flush=True)
for i in range(1, {turns} + 1):
    attach = attach_for(i)
    env = conv.turn(f"question {{i}}", attach)
    conv.reply(f"answer {{i}}")
    save_turn(store, cid, conv, env, attach)
"""


def attach_for(i: int) -> list[dict[str, str]]:
    """Turn i's attachments: notes that come back, plus a selection unique to the turn."""
    notes = ["project-spec.md", "docs/api-docs.md", "docs/auth.md"]
    return [{"note": notes[i % 3]}, {"selection": f"picked text {i}", "source": "x.md"}]


def _reference(vault: Path, turns: int) -> list[ConversationState]:
    conv = Conversation("Be terse.", vault=vault)
    states = []
    for i in range(1, turns + 1):
        conv.turn(f"question {i}", attach_for(i))
        conv.reply(f"answer {i}")
        states.append(conv.state)
    return states


def test_sigkill_at_random_points_leaves_a_loadable_prefix(tmp_path: Path, vault: Path) -> None:
    rng = random.Random(20260101)
    store_path = tmp_path / "crash.db"
    writer = tmp_path / "writer.py"
    writer.write_text(WRITER.format(turns=TURNS), encoding="utf-8")
    root = Path(__file__).resolve().parents[2]
    killed_mid_run = 0
    for n in range(ITERATIONS):
        proc = subprocess.Popen(
            [sys.executable, str(writer), str(store_path), str(vault), f"w{n}"],
            stdout=subprocess.PIPE,
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
        )
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0.0, 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        killed_mid_run += proc.returncode == -signal.SIGKILL
    assert killed_mid_run == ITERATIONS
    reference = _reference(vault, TURNS)
    saved: list[int] = []
    with SqliteStore(store_path) as store:
        ids = [c.id for c in store.conversations()]
        assert sorted(ids) == sorted(f"w{n}" for n in range(ITERATIONS))
        for cid in ids:
            records = store.turns(cid)
            assert [r.turn for r in records] == list(range(1, len(records) + 1))
            if records:
                assert records[-1].reply == f"answer {len(records)}"
                assert store.load(cid) == reference[len(records) - 1]
                assert store.manifest(cid, len(records)) is not None
            saved.append(len(records))
    # The kills landed at many different points, not all before or after the writes.
    assert len(set(saved)) >= ITERATIONS // 3
    assert max(saved) < TURNS
