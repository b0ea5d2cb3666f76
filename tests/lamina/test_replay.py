"""Replay: every engine gives the same results file, failures are reported, not fatal."""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path

import dask
import distributed  # in the test extra: the Dask tests run, never skip
import pytest

from benchmarks.replay_corpus import write_configs, write_replay_corpus
from lamina import Conversation as Conv
from lamina import (
    DaskEngine,
    EngineError,
    LocalEngine,
    ReplayConfig,
    ReplayResult,
    SerialEngine,
    export_transcript,
    find_corpus,
    load_config,
    load_script,
    replay,
    run_saved,
)
from lamina._engines import LOCAL_CLUSTER_CONFIG
from lamina._summary import summarize
from lamina.pipeline.store import ConversationInfo, SqliteStore
from lamina.processors import Sources
from tests.conftest import write_vault


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[ReplayConfig]]:
    root = tmp_path_factory.mktemp("corpus")
    chats = write_replay_corpus(root, 200)
    return chats, [load_config(p) for p in write_configs(root / "configs")]


@pytest.fixture(scope="module")
def serial_bytes(corpus: tuple[Path, list[ReplayConfig]]) -> bytes:
    chats, configs = corpus
    lines = replay(chats, configs, engine=SerialEngine()).lines()
    return "".join(line + "\n" for line in lines).encode("utf-8")


def _bytes(chats: Path, configs: list[ReplayConfig], engine: object, out: Path) -> bytes:
    replay(chats, configs, engine=engine).write(out)  # type: ignore[arg-type]
    return out.read_bytes()


def test_serial_results_cover_every_conversation_and_what_the_corpus_mixes(
    serial_bytes: bytes,
) -> None:
    rows = [json.loads(line) for line in serial_bytes.decode().splitlines()]
    assert len(rows) == 400
    assert [(r["conversation"], r["config"]) for r in rows] == sorted(
        ((r["conversation"], r["config"]) for r in rows), key=lambda k: (k[0], k[1] != "pin")
    )
    assert all(r["invariants"] == "ok" for r in rows)
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) >= 390
    assert all(r["turns"] == r["recorded_turns"] for r in ok)
    kinds = {k for r in rows for k in r["decisions"]}
    assert any(k.startswith("budget:") for k in kinds)
    assert "reference:full->reference" in kinds
    tight = [r for r in ok if r["config"] == "tight"]
    assert set(tight[0]["providers"]) == {"openai", "anthropic"}
    assert all(r["providers"]["openai"]["usd"] is not None for r in tight)
    assert any(r["providers"]["anthropic"]["cached_tokens"] > 0 for r in tight)


@pytest.mark.slow
def test_local_pool_and_dask_cluster_write_the_serial_file_byte_for_byte(
    corpus: tuple[Path, list[ReplayConfig]],
    serial_bytes: bytes,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    chats, configs = corpus
    assert _bytes(chats, configs, LocalEngine(2), tmp_path / "local.jsonl") == serial_bytes
    assert _bytes(chats, configs, DaskEngine(2), tmp_path / "dask.jsonl") == serial_bytes
    assert "running it again" not in caplog.text  # no task of a healthy cluster is redone


@pytest.mark.slow
def test_a_dask_worker_killed_mid_run_still_gives_the_identical_file(
    corpus: tuple[Path, list[ReplayConfig]], serial_bytes: bytes, tmp_path: Path
) -> None:
    chats, configs = corpus
    with (
        dask.config.set(LOCAL_CLUSTER_CONFIG),
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        pids = sorted(client.run(os.getpid).values())
        done: list[int] = []

        def kill_one(batch: tuple[ReplayResult, ...]) -> None:
            done.append(len(batch))
            if len(done) == 20:
                os.kill(pids[0], signal.SIGKILL)

        run = replay(
            chats,
            configs,
            engine=DaskEngine(address=cluster.scheduler_address),
            on_result=kill_one,
        )
        alive = sorted(client.run(os.getpid, on_error="ignore").values())
    assert len(done) == 200
    assert pids[0] not in alive  # the worker really died (its nanny started a new one)
    run.write(tmp_path / "killed.jsonl")
    assert (tmp_path / "killed.jsonl").read_bytes() == serial_bytes


@pytest.mark.timeout(120)
def test_a_result_the_client_never_hears_of_is_computed_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The hang a killed worker can cause, made certain: the scheduler holds a result in
    memory but its notice never reaches the client (dropped here). The engine asks the
    scheduler after two quiet checks and runs that item again; before, it waited for ever."""
    dropped: list[object] = []
    deliver = distributed.Client._handle_key_in_memory

    def lossy(self: distributed.Client, key: object = None, **kwargs: object) -> None:
        if not dropped:
            dropped.append(key)
            return
        deliver(self, key=key, **kwargs)

    monkeypatch.setattr(distributed.Client, "_handle_key_in_memory", lossy)
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, dashboard_address=None
    ) as cluster:
        engine = DaskEngine(address=cluster.scheduler_address, stall_check=0.5)
        results = sorted(engine.run(math.factorial, list(range(8))))
    assert results == sorted(math.factorial(n) for n in range(8))
    assert len(dropped) == 1
    assert "never reached this client (memory on the scheduler); running it again" in caplog.text


def test_a_run_with_no_result_for_the_stall_timeout_is_an_engine_error() -> None:
    """A task that never ends (a worker wedged, a conversation that never finishes) ends
    the run with a typed error after ``stall_timeout`` seconds, not never."""
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, dashboard_address=None
    ) as cluster:
        engine = DaskEngine(address=cluster.scheduler_address, stall_check=0.5, stall_timeout=2)
        results = engine.run(time.sleep, [0, 3600])
        assert next(results) is None
        with pytest.raises(EngineError, match="engine dask: no result for 2 s; 1 conversations"):
            next(results)


def _small_corpus(root: Path, n: int = 6) -> tuple[Path, list[ReplayConfig]]:
    chats = write_replay_corpus(root, n, seed=3)
    return chats, [load_config(p) for p in write_configs(root / "configs")]


def test_a_corrupt_conversation_is_reported_and_the_rest_complete(tmp_path: Path) -> None:
    chats, configs = _small_corpus(tmp_path)
    (chats / "broken.yaml").write_text("turns: [ {user: 'unclosed'\n", encoding="utf-8")
    (chats / "missing-note.json").write_text(
        json.dumps(
            {
                "vault": "../vault",
                "turns": [
                    {"user": "one", "attach": [{"note": "projects/note-00.md"}], "reply": "r"},
                    {"user": "two", "attach": [{"note": "gone.md"}]},
                ],
            }
        ),
        encoding="utf-8",
    )
    run = replay(chats, configs, engine=LocalEngine(2))
    by_id = {(r.conversation, r.config): r for r in run.results}
    assert len(run.results) == 8 * 2
    broken = by_id[("broken.yaml", "pin")]
    assert broken.errors[0].turn == 0 and broken.errors[0].type == "ScriptError"
    assert "not valid YAML" in broken.errors[0].message
    missing = by_id[("missing-note.json", "pin")]
    assert (missing.turns, missing.recorded_turns) == (1, 2)
    assert missing.errors[0].turn == 2 and "gone.md" in missing.errors[0].message
    assert missing.provider("openai") is not None  # the turn before the failure is costed
    others = [r for r in run.results if r.conversation.startswith("c")]
    assert len(others) == 12 and all(r.ok for r in others)
    summary = summarize(run).to_json()
    assert summary["compared"] == 6
    assert summary["configs"]["pin"]["errors"] == 2


def test_the_results_do_not_depend_on_the_order_results_arrive_in(tmp_path: Path) -> None:
    class Reversed:
        name = "reversed"

        def run(self, fn, items):  # type: ignore[no-untyped-def]
            yield from (fn(item) for item in reversed(items))

    chats, configs = _small_corpus(tmp_path)
    seen: list[str] = []
    backwards = replay(
        chats, configs, engine=Reversed(), on_result=lambda b: seen.append(b[0].conversation)
    )
    assert seen == sorted(seen, reverse=True)
    assert backwards.lines() == replay(chats, configs, engine="serial").lines()


PLUGIN = """---
epoch: 1712345678901
modelKey: gpt-4o|openai
topic: "Sync questions"
---

**user**: What does the spec say?
[Context: Notes: project-spec, auth.md, retired.md | URLs: https://example.com/sync]
[Timestamp: 2024/04/05 12:34:56]

**ai**: It describes the sync service.
[Timestamp: 2024/04/05 12:34:58]

**user**: And tokens?
[Timestamp: 2024/04/05 12:35:10]
"""


def test_transcripts_in_both_formats_replay_and_list_what_was_not_rebuilt(
    tmp_path: Path, vault: Path
) -> None:
    chats = tmp_path / "chats"
    chats.mkdir()
    (chats / "plugin.md").write_text(PLUGIN, encoding="utf-8")
    script = tmp_path / "s.yaml"
    script.write_text(
        "turns:\n"
        "  - user: Summarize the spec\n"
        "    attach: [{note: project-spec.md}, {selection: 'Tokens expire.', source: a.md}]\n"
        "    reply: A sync spec.\n"
        "  - user: And the API?\n"
        "    attach: [{note: docs/api-docs.md}]\n",
        encoding="utf-8",
    )
    with SqliteStore(tmp_path / "s.sqlite") as store:
        store.create(ConversationInfo("c1", "2026-01-01T00:00:00Z"))
        conv = Conv("Be brief.", sources=Sources.for_vault(vault))
        run_saved(load_script(script), conv, store, "c1")
        (chats / "lamina.md").write_text(export_transcript(store, "c1"), encoding="utf-8")
    (vault / "notes.md").write_text("# Not a chat\n\nJust a note.\n", encoding="utf-8")
    run = replay(chats, [ReplayConfig("default")], engine="serial", vault=vault)
    assert [r.conversation for r in run.results] == ["lamina.md", "plugin.md"]
    lamina_md, plugin_md = run.results
    assert lamina_md.ok and (lamina_md.turns, lamina_md.source) == (2, "transcript")
    assert [u.split(":")[0] for u in lamina_md.unrebuilt] == ["turn 1"]
    assert "selected text is not in the store" in lamina_md.unrebuilt[0]
    assert plugin_md.ok and plugin_md.turns == 2
    assert sorted(u.split(": ")[1] for u in plugin_md.unrebuilt) == [
        "note retired.md",
        "url https://example.com/sync",
    ]


def test_store_conversations_replay_from_a_store_and_a_list_file(
    tmp_path: Path, vault: Path
) -> None:
    script = tmp_path / "s.yaml"
    script.write_text(
        "turns:\n"
        "  - {user: one, attach: [{note: project-spec.md}], reply: r1}\n"
        "  - {user: two, attach: [{note: docs/auth.md}],\n"
        "     vault_changes: {docs/auth.md: '# Auth v2'}}\n",
        encoding="utf-8",
    )
    store_path = tmp_path / "chats.sqlite"
    with SqliteStore(store_path) as store:
        for cid in ("a", "b"):
            store.create(ConversationInfo(cid, vault=str(vault)))
            run_saved(load_script(script), Conv(sources=Sources.for_vault(vault)), store, cid)
    whole = replay([], [ReplayConfig("x")], engine="serial", store=store_path)
    assert [r.conversation for r in whole.results] == ["chats.sqlite#a", "chats.sqlite#b"]
    assert all(r.ok and r.turns == 2 and r.source == "store" for r in whole.results)
    listing = tmp_path / "corpus.txt"
    listing.write_text("# one of them\nchats.sqlite#b\n", encoding="utf-8")
    (one,) = replay(listing, [ReplayConfig("x")], engine="serial").results
    assert one.line() == whole.results[1].line()


def test_find_corpus_skips_vault_notes_and_hidden_files(tmp_path: Path) -> None:
    chats, _ = _small_corpus(tmp_path, 2)
    write_vault(chats / "vault", {"a.md": "# A\n\ntext\n"})
    (chats / ".hidden.json").write_text("{}", encoding="utf-8")
    assert [r.id for r in find_corpus(chats)] == ["c000.json", "c001.json"]
