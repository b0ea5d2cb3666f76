"""Schema versions across a rolling upgrade, on a real SQLite file and a real PostgreSQL:
a store written with a state's batch as entries is version 3 and says so on every turn
row; a reader refuses what a newer Lamina wrote with ``StoreSchemaTooNew`` naming the
store, the turn and both versions (at open, and on a store it opened before the newer
Lamina migrated it); a stored record holding fields or parts this Lamina lacks is
``StoreUnknownFields``, never silently dropped; a version-2 store still reads read-only
and migrates."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import attrs
import pytest

from lamina import Conversation
from lamina.pipeline._conversation.batch import BatchState, DeferredTurn
from lamina.pipeline._store import sql
from lamina.pipeline._store.records import SCHEMA_VERSION, canonical, digest
from lamina.pipeline._store.sql import _converter
from lamina.pipeline.errors import StoreSchemaTooNew, StoreUnknownFields
from lamina.pipeline.store import ConversationInfo, Store, save_turn
from tests.stores import Backend


def _batched(vault: Path, store: Store, turns: int = 3) -> Conversation:
    """A conversation whose library growth is deferred: its state holds a batch (kept
    as ``batch_turns`` and ``batch_sent`` entries)."""
    store.create(ConversationInfo("c", vault=str(vault)))
    conv = Conversation("Be terse.", vault=vault, defer_library=True)
    for i in range(1, turns + 1):
        attach = [{"note": "project-spec.md"}] if i == 1 else [{"selection": f"s{i}"}]
        env = conv.turn(f"question {i}", attach)
        save_turn(store, "c", conv, env, attach)
        conv.reply(f"answer {i}")
        save_turn(store, "c", conv, env, attach)
    assert conv.state.batch is not None and len(conv.state.batch.turns) == turns
    return conv


def _store_instead(backend: Backend, kind: str, plain: Any) -> str:
    """Put ``plain`` in the store as a snapshot and return its hash (no Lamina code)."""
    body = canonical(plain)
    h = digest(body)
    backend.execute(
        "INSERT INTO snapshots VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
        (h, kind, zlib.compress(body, 6)),
    )
    return h


def _snapshot(backend: Backend, h: str) -> Any:
    (body,) = backend.rows("SELECT body FROM snapshots WHERE hash = ?", (h,))[0]
    return json.loads(zlib.decompress(bytes(body)))


def test_a_batched_save_records_version_3_on_the_store_and_each_turn(
    backend: Backend, vault: Path
) -> None:
    with backend.open() as store:
        _batched(vault, store)
    assert SCHEMA_VERSION == 3
    assert backend.rows("SELECT version FROM lamina_schema") == [(3,)]
    assert backend.rows("SELECT turn, schema_version FROM turns ORDER BY turn") == [
        (1, 3),
        (2, 3),
        (3, 3),
    ]
    parts = {r[0] for r in backend.rows("SELECT DISTINCT part FROM entries")}
    assert {"batch_turns", "batch_sent"} <= parts


def test_a_reader_of_the_previous_version_refuses_the_store_at_open(
    backend: Backend, vault: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Lamina of schema version 2 (its open's check, which is this one's) refuses a
    store this version wrote with the typed error, not a corrupt state on first load."""
    with backend.open() as store:
        _batched(vault, store)
    monkeypatch.setattr(sql, "SCHEMA_VERSION", 2)
    for read_only in (False, True):
        with pytest.raises(StoreSchemaTooNew) as info:
            backend.open(read_only=read_only)
        assert (info.value.path, info.value.found, info.value.supported) == (backend.label, 3, 2)
        assert str(info.value) == (
            f"store {backend.label}: schema version 3 is newer than this Lamina supports (2); "
            "upgrade Lamina"
        )


def test_an_open_reader_refuses_the_turns_a_newer_lamina_wrote(
    backend: Backend, vault: Path
) -> None:
    """Two servers share one database: this one opened the store, then a newer Lamina
    migrated it (version 4) and saved turn 3. The turn's own version is checked on every
    read: turn 3 (state, manifest) is refused naming the turn; turns this version wrote
    still read; a new open is refused too."""
    with backend.open() as store:
        conv = _batched(vault, store)
    with backend.open() as reader:  # opened before the upgrade
        backend.execute("UPDATE lamina_schema SET version = 4")
        backend.execute("UPDATE turns SET schema_version = 4 WHERE turn = 3")
        for read in (lambda: reader.load("c"), lambda: reader.manifest("c", 3)):
            with pytest.raises(StoreSchemaTooNew) as info:
                read()
            found = (info.value.found, info.value.supported, info.value.conversation_id)
            assert found == (4, 3, "c") and info.value.turn == 3
            assert str(info.value) == (
                f"store {backend.label}: conversation 'c' turn 3: schema version 4 is newer "
                "than this Lamina supports (3); upgrade Lamina"
            )
        earlier = reader.load("c", 2)
        assert earlier.batch is not None and conv.state.batch is not None
        assert [t.query for t in earlier.batch.turns] == ["question 1", "question 2"]
        assert earlier.batch.turns[0] == conv.state.batch.turns[0]
    with pytest.raises(StoreSchemaTooNew) as opened:
        backend.open(read_only=True)
    assert (opened.value.found, opened.value.turn) == (4, None)


def test_a_version_2_store_reads_read_only_and_migrates_to_3(
    backend: Backend, vault: Path
) -> None:
    """A store the previous Lamina left (batch parts, no ``turns.schema_version``) reads
    as it is read-only, without changing it, and a write open migrates it: its turns
    record 0 (saved before versions were recorded), new turns 3."""
    with backend.open() as store:
        conv = _batched(vault, store)
        head = store.head("c")
    backend.execute("ALTER TABLE turns DROP COLUMN schema_version")
    backend.execute("UPDATE lamina_schema SET version = 2")
    before = backend.dump()
    with backend.open(read_only=True) as store:
        assert store.schema_version == 2
        assert store.load_head("c") == (conv.state, head)
        assert store.manifest("c", 3) is not None
    assert backend.dump() == before
    with backend.open() as store:
        assert store.schema_version == 3
        assert store.load("c") == conv.state
        env = conv.turn("question 4", [])
        save_turn(store, "c", conv, env, [])
        assert store.load("c") == conv.state
    assert backend.rows("SELECT turn, schema_version FROM turns ORDER BY turn") == [
        (1, 0),
        (2, 0),
        (3, 0),
        (4, 3),
    ]


def test_a_state_field_this_lamina_lacks_is_refused_not_dropped(
    backend: Backend, vault: Path
) -> None:
    """A newer Lamina's state blob holds ``BatchState.future`` (inline, as a new small
    field is): reading it is ``StoreUnknownFields`` naming the field, not a state that
    loses it on the next save."""
    with backend.open() as store:
        _batched(vault, store)
    (state_hash,) = backend.rows("SELECT state_hash FROM turns WHERE turn = 3")[0]
    plain = _snapshot(backend, state_hash)
    plain["batch"]["future"] = [1, 2]
    newer = _store_instead(backend, "state", plain)
    backend.execute("UPDATE turns SET state_hash = ?, head_hash = '' WHERE turn = 3", (newer,))
    with backend.open() as store:
        with pytest.raises(StoreUnknownFields) as info:
            store.load("c")
        assert isinstance(info.value, StoreSchemaTooNew)
        assert info.value.fields == ("BatchState.future",)
        assert (info.value.conversation_id, info.value.turn, info.value.found) == ("c", 3, 3)
        assert str(info.value) == (
            f"store {backend.label}: conversation 'c' turn 3 holds fields this Lamina does "
            "not know (BatchState.future): a newer Lamina wrote it and reading on would "
            "drop them; upgrade Lamina"
        )
        assert store.load("c", 2).batch is not None


def test_an_entry_field_or_a_part_this_lamina_lacks_is_refused(
    backend: Backend, vault: Path
) -> None:
    """The same for a field of an entry kept as its own row (a deferred turn), a part
    this Lamina does not know, and a manifest field."""
    with backend.open() as store:
        _batched(vault, store)
    (h,) = backend.rows(
        "SELECT hash FROM entries WHERE part = 'batch_turns' AND position = 2 AND since_turn = 3"
    )[0]
    plain = _snapshot(backend, h)
    newer = _store_instead(backend, "batch_turns", {**plain, "weight": 1})
    backend.execute("UPDATE entries SET hash = ? WHERE hash = ?", (newer, h))
    (manifest_hash,) = backend.rows("SELECT manifest_hash FROM turns WHERE turn = 2")[0]
    manifest = _snapshot(backend, manifest_hash)
    newer_manifest = _store_instead(backend, "manifest", {**manifest, "cost": 0})
    backend.execute("UPDATE turns SET manifest_hash = ? WHERE turn = 2", (newer_manifest,))
    with backend.open() as store:
        with pytest.raises(StoreUnknownFields) as info:
            store.load("c")
        assert info.value.fields == ("DeferredTurn.weight",)
        with pytest.raises(StoreUnknownFields) as info:
            store.manifest("c", 2)
        assert (info.value.fields, info.value.turn) == (("Manifest.cost",), 2)
    (parts,) = backend.rows("SELECT parts FROM turns WHERE turn = 2")[0]
    backend.execute(
        "UPDATE turns SET parts = ?, head_hash = '' WHERE turn = 2",
        (json.dumps({**json.loads(parts), "recall_index": 0}, sort_keys=True),),
    )
    with backend.open() as store:
        with pytest.raises(StoreUnknownFields) as info:
            store.load("c", 2)
        assert (info.value.fields, info.value.turn) == (("part recall_index",), 2)


@pytest.mark.parametrize(
    "field", [f.name for f in attrs.fields(BatchState) if f.default is not attrs.NOTHING]
)
def test_a_batch_saved_before_a_field_existed_takes_its_default(field: str) -> None:
    """Every defaulted field of ``BatchState`` (a field added later, e.g. ``restored``):
    a stored batch without it structures to the field's default, the rest as stored."""
    batch = BatchState(
        settled=4,
        library_tokens=120,
        library_hash="lh",
        history=2,
        turns=(DeferredTurn(5, "q5", ("b",), 12, "r5"),),
        sent=(("note", "a.md"),),
    )
    plain = _converter.unstructure(batch)
    del plain[field]
    default: Any = attrs.fields_dict(BatchState)[field].default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        default = default.factory()
    expected: dict[str, Any] = {field: default}
    assert _converter.structure(plain, BatchState) == attrs.evolve(batch, **expected)
