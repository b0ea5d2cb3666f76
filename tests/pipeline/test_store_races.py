"""Real processes racing on one conversation, and SIGKILLs: no turn lost, nothing partial."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pytest

from lamina import Conversation, export_transcript, load_conversation
from lamina.pipeline.errors import ConflictError
from lamina.pipeline.store import ConversationInfo, SqliteStore, open_store, save_turn
from tests.cli import ROOT, lamina
from tests.stores import BACKENDS, Backend

WORKERS = 8
ROUNDS = 20
WAIT_S = 60
"""Seconds a racer waits for the others at a round's barrier, and the test for a round's
results."""


def _racer(store_path: str, vault: str, name: str, barrier: Barrier, conn: Connection) -> None:
    """Each round: load the head, build a turn, wait for all, then try to save it. A racer
    that fails says why and breaks the barrier, so no other waits there for ever."""
    try:
        store = open_store(store_path, timeout=30)
        for n in range(ROUNDS):
            barrier.wait(WAIT_S)
            conv = load_conversation(store, "c", vault=vault)
            text = f"round {n} from {name}"
            env = conv.turn(text, [{"note": "project-spec.md"}])
            conv.reply(f"reply {n} {name}")
            barrier.wait(WAIT_S)  # every worker now holds the same head
            try:
                save_turn(store, "c", conv, env, [{"note": "project-spec.md"}])
                conn.send(("won", n, text))
            except ConflictError as exc:
                conn.send(("lost", n, exc.head_turn))
    except BaseException as exc:
        barrier.abort()
        conn.send(("failed", name, f"{type(exc).__name__}: {exc}"))
        raise


def test_racing_workers_exactly_one_wins_each_round(backend: Backend, vault: Path) -> None:
    """8 processes resume one conversation at the same head each round and save the next
    turn: one wins, the others get ConflictError, the history is the winners' turns."""
    store_path = backend.value
    with backend.open() as store:
        store.create(ConversationInfo("c"))
        conv = Conversation("Be terse.", vault=vault)
        conv.turn("start")
        save_turn(store, "c", conv)
    fork = multiprocessing.get_context("fork")
    barrier = fork.Barrier(WORKERS)
    pipes = [fork.Pipe() for _ in range(WORKERS)]
    procs = [
        fork.Process(target=_racer, args=(str(store_path), str(vault), f"w{i}", barrier, child))
        for i, (_, child) in enumerate(pipes)
    ]
    for p in procs:
        p.start()
    winners: list[str] = []
    try:
        for n in range(ROUNDS):
            until = time.monotonic() + WAIT_S  # for the whole round, not each racer
            results = [
                parent.recv() if parent.poll(max(0.0, until - time.monotonic())) else None
                for parent, _ in pipes
            ]
            won = [r for r in results if r is not None and r[0] == "won"]
            assert len(won) == 1, results
            assert all(r == ("lost", n, n + 2) for r in results if r != won[0]), results
            winners.append(won[0][2])
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
    finally:
        for p in procs:
            p.kill()
            p.join()
    with backend.open() as store:
        records = store.turns("c")
        assert [r.user for r in records] == ["start", *winners]
        assert [r.turn for r in records] == list(range(1, ROUNDS + 2))
        assert [h.user for h in store.load("c").history] == ["start", *winners]
        assert all(
            r.reply == "reply " + r.user.removeprefix("round ").replace(" from ", " ")
            for r in records[1:]
        )


def _seeded_store(backend: Backend, vault: Path, turns: int = 1) -> str:
    with backend.open() as store:
        store.create(ConversationInfo("c", vault=str(vault)))
        conv = Conversation("Be terse.", vault=vault)
        for i in range(turns):
            conv.turn(f"seed {i}", [{"note": "project-spec.md"}])
            conv.reply(f"seed reply {i}")
            save_turn(store, "c", conv)
    return backend.value


def _script(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"turns:\n  - user: {name}\n    attach: [{{note: docs/auth.md}}]\n    reply: ok {name}\n",
        encoding="utf-8",
    )
    return path


def _resume(store: str, script: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "lamina._cli", "resume", store, "--conversation", "c",
         "--script", str(script), "--json"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _users(store_value: str) -> list[str]:
    with open_store(store_value) as store:
        records = store.turns("c")
        assert [r.turn for r in records] == list(range(1, len(records) + 1))
        assert [h.user for h in store.load("c").history] == [r.user for r in records]
        return [r.user for r in records]


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_two_cli_resumes_at_once_lose_no_turn(
    tmp_path: Path, vault: Path, new_backend: Callable[[str], Backend], backend_name: str
) -> None:
    """Per trial: each run that exits 0 has its turn stored; the other says why, exit 2."""
    conflicts = 0
    for trial in range(4):
        folder = tmp_path / f"t{trial}"
        folder.mkdir()
        store = _seeded_store(new_backend(backend_name), vault)
        names = [f"A{trial}", f"B{trial}"]
        procs = [_resume(store, _script(folder, name)) for name in names]
        outcomes = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in procs]
        for code, err in outcomes:
            assert code in (0, 2) and "Traceback" not in err, err
            if code == 2:
                assert len(err.splitlines()) == 1 and "moved on" in err, err
        won = [name for name, (code, _) in zip(names, outcomes, strict=True) if code == 0]
        assert won, outcomes
        users = _users(store)
        assert users[0] == "seed 0" and sorted(users[1:]) == sorted(won)
        conflicts += len(names) - len(won)
    assert conflicts >= 1  # the runs did overlap at least once (they nearly always do)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_sigkill_during_concurrent_resumes_loses_nothing(
    tmp_path: Path, vault: Path, new_backend: Callable[[str], Backend], backend_name: str
) -> None:
    rng = random.Random(1414)
    for trial in range(3):
        folder = tmp_path / f"k{trial}"
        folder.mkdir()
        store = _seeded_store(new_backend(backend_name), vault)
        scripts = [_script(folder, f"K{trial}"), _script(folder, f"S{trial}")]
        victim, survivor = _resume(store, scripts[0]), _resume(store, scripts[1])
        time.sleep(rng.uniform(0.2, 1.5))
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=60)
        code = survivor.wait(timeout=120)
        assert code in (0, 2), survivor.stderr.read() if survivor.stderr else ""
        users = _users(store)  # the store opens and holds whole turns only
        assert users[0] == "seed 0" and set(users[1:]) <= {f"K{trial}", f"S{trial}"}
        if code == 0:
            assert f"S{trial}" in users
        # Whatever the kill left, running the killed (and a refused) script again succeeds.
        for name, script in zip(("K", "S"), scripts, strict=True):
            if f"{name}{trial}" not in users:
                retry = lamina("resume", store, "--conversation", "c", "--script", str(script))
                assert retry.returncode == 0, retry.stderr
        assert sorted(_users(store)[1:]) == sorted([f"K{trial}", f"S{trial}"])


def _transcript(tmp_path: Path, vault: Path, turns: int) -> Path:
    notes = ["project-spec.md", "docs/api-docs.md", "docs/auth.md"]
    with SqliteStore(tmp_path / "source.db") as store:
        store.create(ConversationInfo("long"))
        conv = Conversation("Be terse.", vault=vault)
        for i in range(turns):
            attach = [{"note": notes[i % 3]}, {"note": notes[(i + 1) % 3]}]
            env = conv.turn(f"question {i} " + "words " * 40, attach)
            conv.reply(f"answer {i} " + "more words " * 60)
            save_turn(store, "long", conv, env, attach)
        path = tmp_path / "long.md"
        path.write_text(export_transcript(store, "long"), encoding="utf-8")
    return path


def test_sigkill_during_import_leaves_nothing_partial_and_retry_succeeds(
    tmp_path: Path, vault: Path
) -> None:
    turns = 30
    transcript = _transcript(tmp_path, vault, turns)
    rng = random.Random(1415)
    argv = [sys.executable, "-m", "lamina._cli", "import", str(transcript), "--vault", str(vault)]
    started = time.monotonic()
    first = subprocess.run([*argv, "--store", str(tmp_path / "timing.db")], cwd=ROOT, check=False,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    whole = time.monotonic() - started
    assert first.returncode == 0, first.stderr
    killed = 0
    scale = 1.0  # shrinks when a run outpaces its kill (a warm cache, an idle machine)
    for trial in range(12):
        if killed >= 3 and trial >= 5:
            break
        store = tmp_path / f"i{trial}.db"
        proc = subprocess.Popen([*argv, "--store", str(store)], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        # Kills spread over the whole run, some close to its end (the write phase).
        share = rng.uniform(0.3, 1.0) if trial % 5 < 3 else 0.95
        time.sleep(whole * share * scale)
        proc.send_signal(signal.SIGKILL)
        was_killed = proc.wait(timeout=60) == -signal.SIGKILL
        killed += was_killed
        scale = scale if was_killed else scale * 0.6
        if store.exists():
            with SqliteStore(store) as opened:
                ids = [c.id for c in opened.conversations()]
                for cid in ids:  # all of it or none of it
                    assert len(opened.turns(cid)) == turns
        retry = lamina("import", str(transcript), "--vault", str(vault), "--store", str(store))
        if retry.returncode != 0:  # the killed run had finished: the id is taken, as it should be
            assert "already exists" in retry.stderr, retry.stderr
        with SqliteStore(store) as opened:
            (info,) = opened.conversations()
            assert len(opened.turns(info.id)) == turns
            assert len(opened.load(info.id).history) == turns
    assert killed >= 3
    assert os.path.getsize(transcript) > 0
