"""A writer killed with SIGKILL at random points leaves a store holding a complete prefix."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from multiprocessing.connection import Connection
from pathlib import Path

from lamina import Conversation
from lamina.pipeline import ConversationState
from lamina.pipeline.store import ConversationInfo, open_store, save_turn
from tests.stores import Backend

TURNS = 100
ITERATIONS = 30


def _writer(store_path: str, vault: str, cid: str, conn: Connection) -> None:
    """The child: save turns one transaction each, acknowledging every save."""
    store = open_store(store_path)
    store.create(ConversationInfo(cid))
    conv = Conversation("Be terse.", vault=vault)
    conn.send("ready")
    for i in range(1, TURNS + 1):
        attach = attach_for(i)
        env = conv.turn(f"question {i}", attach)
        conv.reply(f"answer {i}")
        save_turn(store, cid, conv, env, attach)
        conn.send(i)


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


def test_sigkill_at_random_points_leaves_a_loadable_prefix(backend: Backend, vault: Path) -> None:
    rng = random.Random(20260101)
    store_path = backend.value
    # Forked children skip the interpreter start-up; each is still a real process, SIGKILLed.
    fork = multiprocessing.get_context("fork")
    killed_mid_run = 0
    acknowledged: list[int] = []
    for n in range(ITERATIONS):
        parent, child = fork.Pipe()
        proc = fork.Process(target=_writer, args=(str(store_path), str(vault), f"w{n}", child))
        proc.start()
        assert parent.recv() == "ready"
        # Kill after a random number of acknowledged saves, a random moment into the next.
        target = rng.randint(0, 30)
        for i in range(1, target + 1):
            assert parent.recv() == i
        acknowledged.append(target)
        time.sleep(rng.uniform(0.0, 0.03))
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=10)
        killed_mid_run += proc.exitcode == -signal.SIGKILL
        parent.close()
    assert killed_mid_run == ITERATIONS
    reference = _reference(vault, TURNS)  # cheap: the writers never get far
    saved: list[int] = []
    with backend.open() as store:
        ids = [c.id for c in store.conversations()]
        assert sorted(ids) == sorted(f"w{n}" for n in range(ITERATIONS))
        for n in range(ITERATIONS):
            records = store.turns(f"w{n}")
            assert [r.turn for r in records] == list(range(1, len(records) + 1))
            assert len(records) >= acknowledged[n]  # every acknowledged save survived
            if records:
                assert records[-1].reply == f"answer {len(records)}"
                assert store.load(f"w{n}") == reference[len(records) - 1]
                assert store.manifest(f"w{n}", len(records)) is not None
            saved.append(len(records))
    # The kills landed at many different points, none after the writer finished.
    assert len(set(saved)) >= ITERATIONS // 3
    assert max(saved) < TURNS
