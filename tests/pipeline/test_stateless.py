"""Stateless requests: load + turn + save in one call, decoding only unseen entries."""

from __future__ import annotations

from pathlib import Path

import pytest

from lamina import Conversation, stateless_turn
from lamina.pipeline import Pipeline
from lamina.pipeline.errors import ConversationError
from lamina.pipeline.store import ConversationInfo, SqliteStore


def test_stateless_requests_match_the_uninterrupted_conversation(vault: Path) -> None:
    with SqliteStore(vault.parent / "s.db") as store:
        store.create(ConversationInfo("c1"))
        with pytest.raises(ConversationError, match="start="):
            stateless_turn(store, "c1", "hello", vault=vault)
        live = Conversation("Be terse.", vault=vault)
        start = Conversation("Be terse.", vault=vault)
        attach = [{"note": "project-spec.md"}]
        for i in range(3):
            expected = live.turn(f"question {i}", attach)
            live.reply(f"answer {i}")
            conv, got = stateless_turn(
                store, "c1", f"question {i}", attach, start=start, vault=vault
            )
            assert got.prefix_hash == expected.prefix_hash
            assert [s.text for s in got.l3.segments] == [s.text for s in expected.l3.segments]
            conv.reply(f"answer {i}")
            from lamina import save_turn

            save_turn(store, "c1", conv)
        assert store.head("c1").turn == 3


def test_a_second_load_decodes_only_entries_it_has_not_seen(vault: Path) -> None:
    with SqliteStore(vault.parent / "s.db") as store:
        store.create(ConversationInfo("c1"))
        start = Conversation("Be terse.", vault=vault)
        stateless_turn(store, "c1", "one", [{"note": "project-spec.md"}], start=start, vault=vault)
        fresh = SqliteStore(vault.parent / "s.db")
        try:
            fresh.load("c1")
            first = fresh.entry_cache.decoded
            assert first >= 2  # a library entry and a history entry
            assert fresh.load("c1") == store.load("c1")
            assert fresh.entry_cache.decoded == first
            assert fresh.entry_cache.hits >= first
        finally:
            fresh.close()


def test_conversations_share_the_default_pipeline(vault: Path) -> None:
    built = []
    original = Pipeline.__init__

    def counting(self: Pipeline, stages: object) -> None:
        built.append(1)
        original(self, stages)  # type: ignore[arg-type]

    Pipeline.default()
    Pipeline.__init__ = counting  # type: ignore[method-assign]
    try:
        a = Conversation("x", vault=vault)
        b = Conversation.restore(a.state, vault=vault)
    finally:
        Pipeline.__init__ = original  # type: ignore[method-assign]
    assert built == []
    assert a.pipeline is b.pipeline is Pipeline.default()
