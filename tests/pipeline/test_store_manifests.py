"""A turn's manifest is stored as a tree of content-addressed chunks of its layers'
segments: it reads back equal, a manifest saved inline before still reads, and the bytes
a turn adds stay flat while the library and history grow (inline, each turn's manifest
listed all of them, so the store grew with the square of the chat's length)."""

from __future__ import annotations

import statistics
import zlib
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from lamina import Conversation
from lamina.pipeline import Envelope
from lamina.pipeline._store.records import canonical, digest
from lamina.pipeline._store.sql import _chunks, _converter
from lamina.pipeline.store import ConversationInfo, Manifest, Store, save_turn
from tests.stores import Backend

_KINDS = "('manifest', 'report', 'segments', 'chunks')"


def _chat(vault: Path, store: Store, turns: int) -> list[Envelope]:
    """Each turn attaches a note and a new selection: the library and history grow."""
    store.create(ConversationInfo("c", vault=str(vault)))
    conv = Conversation("Be terse.", vault=vault)
    notes = ("project-spec.md", "docs/api-docs.md", "docs/auth.md")
    envs = []
    for i in range(1, turns + 1):
        attach = [{"note": notes[i % 3]}, {"selection": f"picked line {i}", "source": "x.md"}]
        env = conv.turn(f"question {i}", attach)
        save_turn(store, "c", conv, env, attach)
        conv.reply(f"answer {i}")
        save_turn(store, "c", conv, env, attach)
        envs.append(env)
    return envs


def test_every_turns_manifest_reads_back_equal(backend: Backend, vault: Path) -> None:
    with backend.open() as store:
        envs = _chat(vault, store, 12)
        for env in envs:
            assert store.manifest("c", env.turn) == Manifest.of(env)
    with backend.open(read_only=True) as store:  # decoded anew, not from the save's cache
        assert store.manifest("c", 12) == Manifest.of(envs[-1])
    assert backend.rows("SELECT COUNT(*) FROM snapshots WHERE kind = 'segments'")[0][0] > 12


def test_a_manifest_saved_inline_still_reads(backend: Backend, vault: Path) -> None:
    """A row written before the chunks holds its layers' segments in the manifest itself."""
    with backend.open() as store:
        envs = _chat(vault, store, 3)
    body = canonical(_converter.unstructure(Manifest.of(envs[1])))
    h = digest(body)
    backend.execute("INSERT INTO snapshots VALUES (?, 'manifest', ?)", (h, zlib.compress(body, 6)))
    backend.execute("UPDATE turns SET manifest_hash = ? WHERE turn = 2", (h,))
    with backend.open(read_only=True) as store:
        assert store.manifest("c", 2) == Manifest.of(envs[1])
        assert store.manifest("c", 3) == Manifest.of(envs[2])


def test_the_manifest_bytes_a_turn_adds_stay_flat(backend: Backend, vault: Path) -> None:
    """Stored bytes of manifests and their chunks per turn, turns 41-50 against 11-20,
    beside the same turns' manifests compressed inline (the format before) in this run."""
    added: dict[int, int] = {}
    inline: dict[int, int] = {}
    query = f"SELECT COALESCE(SUM(LENGTH(body)), 0) FROM snapshots WHERE kind IN {_KINDS}"
    with backend.open() as store:
        store.create(ConversationInfo("c", vault=str(vault)))
        conv = Conversation("Be terse.", vault=vault)
        before = 0
        for i in range(1, 51):
            attach = [{"selection": f"picked line {i}", "source": "x.md"}]
            env = conv.turn(f"question {i}", attach)
            conv.reply(f"answer {i}")
            save_turn(store, "c", conv, env, attach)
            total = int(backend.rows(query)[0][0])
            added[i], before = total - before, total
            plain = _converter.unstructure(Manifest.of(env))
            inline[i] = len(zlib.compress(canonical(plain), 6))
    late, early = range(41, 51), range(11, 21)
    ratio = statistics.mean(added[i] for i in late) / statistics.mean(added[i] for i in early)
    before_ratio = statistics.mean(inline[i] for i in late) / statistics.mean(
        inline[i] for i in early
    )
    assert before_ratio > 2.0  # inline: each turn's manifest grows with the chat
    assert ratio < 1.3
    assert statistics.mean(added[i] for i in late) < statistics.mean(inline[i] for i in late) / 2


@given(st.lists(st.text(min_size=1, max_size=6), max_size=200), st.integers(0, 20))
def test_chunks_cover_the_items_in_order_and_an_append_keeps_the_earlier_chunks(
    keys: list[str], more: int
) -> None:
    chunks = _chunks(keys, lambda k: k)
    assert [k for chunk in chunks for k in chunk] == keys
    assert all(1 <= len(chunk) <= 32 for chunk in chunks)
    longer = _chunks([*keys, *(f"extra {i}" for i in range(more))], lambda k: k)
    assert longer[: max(0, len(chunks) - 1)] == chunks[:-1]


def test_dropping_the_oldest_history_rewrites_only_the_first_chunk() -> None:
    keys = [f"history:{t}:{role}" for t in range(1, 200) for role in ("user", "assistant")]
    chunks = _chunks(keys, lambda k: k)
    shorter = _chunks(keys[6:], lambda k: k)
    assert len(chunks) > 20
    assert sum(chunk not in chunks for chunk in shorter) <= 1
