"""The store's save path: only new entries are encoded, and the rows stay those of a full encode."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lamina import Conversation, load_conversation
from lamina.pipeline import ConversationState
from lamina.pipeline._store.records import canonical, digest
from lamina.pipeline._store.sql import EntryCache, SqlStore, _converter
from lamina.pipeline.sources import TurnWarning
from lamina.pipeline.store import ConversationInfo, Head, SqliteStore, Store, save_turn
from lamina.pipeline.tokens import TurnUsage, Usage
from tests.stores import Backend

STAMP = {"created": "2026-01-01T00:00:00Z", "reply_created": "2026-01-01T00:00:01Z"}


class FullEncode(EntryCache):
    """An entry cache that remembers no content address: every save encodes every entry
    (what every save did before addresses were remembered)."""

    def address(self, value: Any) -> str | None:
        return None


def _old_rows(state: ConversationState) -> dict[str, tuple[str, bytes]]:
    """The snapshot rows of a state as the full encode wrote them: the whole state
    unstructured at once, its split parts (and its batch's turns and sent keys) popped
    and each entry encoded."""
    plain = _converter.unstructure(state)
    batch = plain["batch"] or {}
    items = {p: plain.pop(p) for p in ("library", "history", "usage")}
    items |= {f"batch_{f}": batch.pop(f, []) for f in ("turns", "sent")}
    if batch:
        batch["turns"] = batch["sent"] = []
    rows: dict[str, tuple[str, bytes]] = {}
    for part, values in items.items():
        for item in values:
            body = canonical(item)
            rows.setdefault(digest(body), (part, zlib.compress(body, 6)))
    body = canonical(plain)
    rows.setdefault(digest(body), ("state", zlib.compress(body, 6)))
    return rows


def _snapshots(backend: Backend) -> dict[str, tuple[str, bytes]]:
    return {str(h): (str(k), bytes(b)) for h, k, b in backend.rows("SELECT * FROM snapshots")}


def _play(store: Store, reference: Store, vault: Path) -> list[ConversationState]:
    """Three turns that add, re-attach and replace library entries, record usage and save
    each turn twice (before and after its reply), then a turn on the conversation loaded
    from ``store``: each save goes to both stores (the same envelope: its report's
    timings differ from build to build)."""
    heads = {id(store): Head(), id(reference): Head()}

    def save(conv: Conversation, env: Any, attach: list[dict[str, str]]) -> None:
        for each in (store, reference):
            save_turn(each, "c1", conv, env, attach, parent=heads[id(each)], **STAMP)
            heads[id(each)] = conv.saved_head

    for each in (store, reference):
        each.create(ConversationInfo("c1", "2026-01-01T00:00:00Z"))
    conv = Conversation("Be terse.", vault=vault)
    attaches: list[list[dict[str, str]]] = [
        [{"note": "project-spec.md"}, {"note": "docs/api-docs.md"}],
        [{"note": "docs/auth.md"}, {"selection": "picked", "source": "a.md"}],
        [{"note": "project-spec.md"}],
    ]
    states = []
    for i, attach in enumerate(attaches, 1):
        env = conv.turn(f"question {i}", attach)
        save(conv, env, attach)
        conv.reply(f"answer {i}")
        conv.record_usage(TurnUsage(i, "openai", "gpt-4.1", 100 * i, 0, Usage(100 * i + 1)))
        save(conv, env, attach)
        states.append(conv.state)
    for number in (4, 5):
        again = load_conversation(store, "c1", vault=vault)
        heads[id(store)] = again.saved_head or Head()
        attach = [{"note": "docs/api-docs.md"}]
        save(again, again.turn(f"question {number}", attach), attach)
        states.append(again.state)
    return states


def test_saves_write_the_rows_of_a_full_encode(
    backend: Backend, new_backend: Callable[[str], Backend], vault: Path
) -> None:
    full = new_backend(backend.name)
    with backend.open() as store, full.open() as reference:
        assert isinstance(store, SqlStore) and isinstance(reference, SqlStore)
        reference.entry_cache = FullEncode()
        states = _play(store, reference, vault)
        assert 0 < store.entry_cache.encoded < reference.entry_cache.encoded
    for each in (backend, full):
        each.execute("UPDATE conversations SET saved_at = ''")
        each.execute("UPDATE turns SET saved_at = ''")
    assert backend.dump() == full.dump()
    stored = _snapshots(backend)
    for state in states:
        for h, row in _old_rows(state).items():
            assert stored[h] == row


def test_a_save_encodes_only_entries_it_has_not_encoded(tmp_path: Path, vault: Path) -> None:
    with SqliteStore(tmp_path / "s.db") as store:
        store.create(ConversationInfo("c1"))
        # Without a batch: its turns and sent keys are entries too (counted elsewhere).
        conv = Conversation("Be terse.", vault=vault, defer_library=False)
        attach = [{"note": "project-spec.md"}, {"note": "docs/api-docs.md"}]
        env = conv.turn("one", attach)
        save_turn(store, "c1", conv, env, attach)
        first = conv.state
        assert store.entry_cache.encoded == len(first.library) + len(first.history) == 3
        conv.reply("answer")
        env = conv.turn("two", [{"note": "docs/auth.md"}])
        before = store.entry_cache.encoded
        save_turn(store, "c1", conv, env, [{"note": "docs/auth.md"}])
        old = {id(e) for e in (*first.library, *first.history)}
        state = conv.state
        new = [e for e in (*state.library, *state.history) if id(e) not in old]
        # The reply made history entry 1 anew; turn 2 adds its history entry and one note.
        assert len(new) == 3
        assert store.entry_cache.encoded - before == len(new)
        # A request on the reloaded conversation encodes the loaded entries once, then
        # only what each turn adds.
        for number in (3, 4):
            loaded = load_conversation(store, "c1", vault=vault)
            env = loaded.turn(f"question {number}")
            before = store.entry_cache.encoded
            save_turn(store, "c1", loaded, env)
            if number == 4:
                assert store.entry_cache.encoded - before == 1  # its history entry
        assert len(store.load("c1").history) == 4


def test_a_rolled_back_save_is_written_again_in_full(tmp_path: Path, vault: Path) -> None:
    """Addresses remembered from a save that was rolled back still get their rows."""
    with SqliteStore(tmp_path / "s.db") as store:
        store.create(ConversationInfo("c1"))
        conv = Conversation("Be terse.", vault=vault)
        attach = [{"note": "project-spec.md"}]
        env = conv.turn("one", attach)
        with pytest.raises(RuntimeError), store.transaction():
            save_turn(store, "c1", conv, env, attach)
            raise RuntimeError("the host gave up")
        assert store.head("c1") == Head()
        # A library and a history entry, the batch's turn and its one sent key.
        assert store.entry_cache.encoded == 4
        save_turn(store, "c1", conv, env, attach, parent=Head())
        assert store.entry_cache.encoded == 4  # nothing encoded twice, yet all rows written
        fresh = SqliteStore(tmp_path / "s.db")
        try:
            assert fresh.load("c1") == conv.state
        finally:
            fresh.close()


def test_a_load_decodes_the_state_snapshot_once(tmp_path: Path, vault: Path) -> None:
    with SqliteStore(tmp_path / "s.db") as store:
        store.create(ConversationInfo("c1"))
        conv = Conversation("Be terse.", vault=vault)
        env = conv.turn("one", [{"note": "project-spec.md"}])
        save_turn(store, "c1", conv, env)
    with SqliteStore(tmp_path / "s.db") as fresh:
        assert fresh.load("c1") == conv.state
        decoded = fresh.entry_cache.decoded
        # The state snapshot, a library and a history entry, the batch's turn and sent key.
        assert decoded == 5
        assert fresh.load("c1") == conv.state
        assert fresh.entry_cache.decoded == decoded


def test_an_entry_stored_in_an_older_form_is_encoded_anew(tmp_path: Path, vault: Path) -> None:
    """A body that does not re-encode to itself (a warning kept as a bare sentence) gives no
    remembered address: the next save writes the entry's current form, like a full encode."""
    path = tmp_path / "s.db"
    with SqliteStore(path) as store:
        store.create(ConversationInfo("c1"))
        conv = Conversation("Be terse.", vault=vault)
        env = conv.turn("one")
        conv.record_usage(
            TurnUsage(1, "openai", "gpt-4.1", 10, 0, Usage(11), warning=TurnWarning.of("odd"))
        )
        save_turn(store, "c1", conv, env)
    usage = conv.state.usage[0]
    plain = _converter.unstructure(usage, TurnUsage)
    plain["warning"] = "odd"  # how stores written before warnings had codes kept it
    body = canonical(plain)
    old = digest(body)
    with SqliteStore(path) as store:
        backend = Backend("sqlite", str(path))
        backend.execute(
            "INSERT INTO snapshots VALUES (?, 'usage', ?)", (old, zlib.compress(body, 6))
        )
        backend.execute("UPDATE entries SET hash = ? WHERE part = 'usage'", (old,))
        loaded = load_conversation(store, "c1", vault=vault)
        assert loaded.usage == (usage,)
        assert store.entry_cache.address(loaded.usage[0]) is None
        assert store.entry_cache.address(loaded.history[0]) is not None
        save_turn(store, "c1", loaded, loaded.turn("two"))
        # The usage entry, turn 2's history entry and its turn of the batch.
        assert store.entry_cache.encoded == 3
    new = digest(canonical(plain | {"warning": _converter.unstructure(usage.warning)}))
    assert backend.rows("SELECT hash FROM entries WHERE part = 'usage' AND since_turn = 2") == [
        (new,)
    ]
