"""Several processes write different conversations into one store while others read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from lamina import Conversation
from tests.stores import Backend

WRITERS = 4
READERS = 2
TURNS = 25

WRITER = """
import sys
from lamina import Conversation
from lamina.pipeline.store import ConversationInfo, open_store, save_turn
from tests.pipeline.test_store_concurrency import attach_for

store_path, vault, name, turns = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
store = open_store(store_path, timeout=30)
store.create(ConversationInfo(name))
conv = Conversation(f"You serve {name}.", vault=vault)
for i in range(1, turns + 1):
    attach = attach_for(name, i)
    env = conv.turn(f"{name} question {i}", attach)
    conv.reply(f"{name} answer {i}")
    save_turn(store, name, conv, env, attach)
"""

READER = """
import json, sys, time
from lamina.pipeline.store import open_store

store_path, writers, turns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
store = open_store(store_path, timeout=30)
checks, errors = 0, []
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    done = 0
    for info in store.conversations():
        records = store.turns(info.id)
        if [r.turn for r in records] != list(range(1, len(records) + 1)):
            errors.append(f"{info.id}: gap in {[r.turn for r in records]}")
        if any(not r.user.startswith(info.id + " ") for r in records):
            errors.append(f"{info.id}: a turn of another conversation")
        if records:
            state = store.load(info.id)
            users = [h.user for h in state.history]
            if len(users) < len(records) or any(not u.startswith(info.id + " ") for u in users):
                errors.append(f"{info.id}: state history {users[-1:]} does not match")
        checks += 1
        done += len(records) == turns
    if done == writers:
        break
print(json.dumps({"checks": checks, "errors": errors}))
"""


def attach_for(name: str, i: int) -> list[dict[str, str]]:
    notes = ["project-spec.md", "docs/api-docs.md", "docs/auth.md"]
    return [{"note": notes[i % 3]}, {"selection": f"{name} picked {i}"}]


def test_parallel_writers_and_readers_lose_and_mix_nothing(
    tmp_path: Path, vault: Path, backend: Backend
) -> None:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    store_path = backend.value
    (tmp_path / "writer.py").write_text(WRITER, encoding="utf-8")
    (tmp_path / "reader.py").write_text(READER, encoding="utf-8")
    names = [f"conv{n}" for n in range(WRITERS)]

    def spawn(script: str, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(tmp_path / script), str(store_path), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=root,
            env=env,
        )

    backend.open().close()  # created up front so readers never see a missing file
    readers = [spawn("reader.py", str(WRITERS), str(TURNS)) for _ in range(READERS)]
    writers = [spawn("writer.py", str(vault), name, str(TURNS)) for name in names]
    for w in writers:
        _, err = w.communicate(timeout=120)
        assert w.returncode == 0, err
    for r in readers:
        out, err = r.communicate(timeout=120)
        assert r.returncode == 0, err
        result = json.loads(out)
        assert result["errors"] == []
        assert result["checks"] > 0

    with backend.open() as store:
        assert [c.id for c in store.conversations()] == names
        for name in names:
            conv = Conversation(f"You serve {name}.", vault=vault)
            for i in range(1, TURNS + 1):
                conv.turn(f"{name} question {i}", attach_for(name, i))
                conv.reply(f"{name} answer {i}")
            assert store.load(name) == conv.state
            assert len(store.turns(name)) == TURNS
