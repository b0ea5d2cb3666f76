"""A batch's deferred turns and sent keys are stored as entries written once: a restored
conversation sends the same bytes, old rows (turns inline in the state blob) still load,
and the stored bytes of a batch that never settles grow linearly, not with its square."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest

from lamina import Conversation, load_conversation
from lamina.pipeline import Envelope
from lamina.pipeline._store.records import canonical, digest
from lamina.pipeline._store.sql import _converter
from lamina.pipeline.store import ConversationInfo, Store, save_turn
from lamina.renderers import openai_messages
from tests.stores import Backend


@pytest.fixture(scope="module")
def vault(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("batch-store-vault")
    for i in range(60):
        (root / f"n{i}.md").write_text(
            f"# Note {i}\n\n" + f"Note {i} records the field sync of day {i}. " * 3 + "\n",
            encoding="utf-8",
        )
    return root


def _messages(env: Envelope) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in openai_messages(env)]


def _turn(conv: Conversation, store: Store, i: int) -> Envelope:
    attach = [{"note": f"n{i % 60}.md"}]
    env = conv.turn(f"question {i}", attach)
    save_turn(store, "c", conv, env, attach)
    conv.reply(f"answer {i}")
    save_turn(store, "c", conv, env, attach)
    return env


def test_a_restored_conversation_sends_the_same_bytes(backend: Backend, vault: Path) -> None:
    """Across a long batch and a settle, the conversation restored from the store after
    every turn builds the next request byte for byte as the live one does."""
    live = Conversation("Be terse.", vault=vault, defer_library=True)
    with backend.open() as store:
        store.create(ConversationInfo("c", vault=str(vault)))
        reasons = []
        for i in range(24):
            restored = load_conversation(store, "c", vault=vault) if i else None
            if i == 15:  # the prefix breaks: the batch settles
                live.set_system(mutable="Today is Monday.")
            if restored is not None:
                assert i == 15 or restored.state == live.state
                if i == 15:
                    restored.set_system(mutable="Today is Monday.")
                again = restored.turn(f"question {i}", [{"note": f"n{i % 60}.md"}])
            env = _turn(live, store, i)
            assert env.batch is not None
            reasons.append(env.batch.reason)
            if restored is not None:
                assert _messages(again) == _messages(env) and again.batch == env.batch
        assert reasons == ["first-turn"] + [""] * 14 + ["system-changed"] + [""] * 8
        state = store.load("c")
        assert state.batch is not None and len(state.batch.turns) == 9
        assert len(state.batch.sent) == 9


def test_a_state_saved_with_its_batch_inline_still_loads(backend: Backend, vault: Path) -> None:
    """A row written before the batch parts (no such part; turns and sent keys inline in
    the state blob) loads as it was saved, and the next save continues it."""
    conv = Conversation("Be terse.", vault=vault, defer_library=True)
    with backend.open() as store:
        store.create(ConversationInfo("c", vault=str(vault)))
        for i in range(3):
            _turn(conv, store, i)
        state = conv.state
        assert state.batch is not None and len(state.batch.turns) == 3
        plain = _converter.unstructure(state)
        for part in ("library", "history", "usage"):
            del plain[part]
        body = canonical(plain)
        old = digest(body)
        backend.execute(
            "INSERT INTO snapshots VALUES (?, 'state', ?)", (old, zlib.compress(body, 6))
        )
        (parts,) = backend.rows("SELECT parts FROM turns WHERE turn = 3")[0]
        lengths = {p: n for p, n in json.loads(parts).items() if not p.startswith("batch_")}
        backend.execute(
            "UPDATE turns SET state_hash = ?, parts = ?, head_hash = '' WHERE turn = 3",
            (old, json.dumps(lengths, sort_keys=True)),
        )
        backend.execute("DELETE FROM entries WHERE part IN ('batch_turns', 'batch_sent')")
    with backend.open() as store:
        assert store.load("c") == state
        restored = load_conversation(store, "c", vault=vault)
        again = restored.turn("question 3", [{"note": "n3.md"}])
        env = conv.turn("question 3", [{"note": "n3.md"}])
        assert _messages(again) == _messages(env)
        save_turn(store, "c", restored, again, [{"note": "n3.md"}])
        assert store.load("c") == restored.state
        assert len(backend.rows("SELECT * FROM entries WHERE part = 'batch_turns'")) == 4


def test_a_batch_that_never_settles_grows_the_store_linearly(
    backend: Backend, vault: Path
) -> None:
    """The bytes of state and entry snapshots each turn adds stay flat as the batch grows
    (they grew with its length when the batch was inline in every turn's state blob).
    The turn's manifest and its segment chunks are left out (test_store_manifests.py)."""
    conv = Conversation("Be terse.", vault=vault, defer_library=True)
    added: dict[int, int] = {}
    query = (
        "SELECT SUM(LENGTH(body)) FROM snapshots "
        "WHERE kind NOT IN ('manifest', 'report', 'segments', 'chunks')"
    )
    with backend.open() as store:
        store.create(ConversationInfo("c", vault=str(vault)))
        before = 0
        for i in range(1, 41):
            env = _turn(conv, store, i)
            assert env.batch is not None and env.batch.reason == ("first-turn" if i == 1 else "")
            total = int(backend.rows(query)[0][0])
            added[i] = total - before
            before = total
        turns = {p: n for p, n in backend.rows("SELECT part, COUNT(*) FROM entries GROUP BY part")}
    # Each turn adds one deferred turn, rewrites the one before with its reply, one key.
    assert turns["batch_turns"] == 2 * 40 - 1 and turns["batch_sent"] == 40
    assert added[40] < 1.3 * added[10]
    assert added[40] < 1.3 * added[20]
