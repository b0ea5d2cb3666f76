"""PostgresStore's own edges: the server, its schema, its row lock, and choosing by URL."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from lamina import Conversation, load_conversation
from lamina._cli import main
from lamina.pipeline._store.records import SCHEMA_VERSION
from lamina.pipeline.errors import ConflictError, StoreCorrupt, StoreLocked, StoreUnreachable
from lamina.pipeline.store import (
    ConversationInfo,
    PostgresStore,
    SqliteStore,
    open_store,
    save_turn,
)
from tests.stores import Backend, PgServer


@pytest.fixture
def pg(pg_server: PgServer, tmp_path: Path) -> Backend:
    return Backend("postgres", pg_server.create_database())


def test_the_store_value_chooses_the_backend(pg: Backend, tmp_path: Path) -> None:
    with open_store(pg.value) as store:
        assert isinstance(store, PostgresStore)
    with open_store(str(tmp_path / "s.db")) as store:
        assert isinstance(store, SqliteStore)


def test_a_new_database_gets_the_schema_in_its_own_namespace(pg: Backend) -> None:
    open_store(pg.value).close()
    assert pg.rows("SELECT version FROM lamina_schema") == [(SCHEMA_VERSION,)]
    assert pg.rows("SELECT current_schemas(false)")[0][0] == ["lamina"]


def test_version_zero_schema_is_migrated(pg: Backend) -> None:
    pg.execute("CREATE SCHEMA lamina")
    pg.execute("CREATE TABLE lamina_schema (version INTEGER NOT NULL)")
    pg.execute("INSERT INTO lamina_schema VALUES (0)")
    with open_store(pg.value) as store:
        assert store.conversations() == ()
    assert pg.rows("SELECT version FROM lamina_schema") == [(SCHEMA_VERSION,)]


def test_a_foreign_lamina_schema_is_refused_and_left_alone(pg: Backend) -> None:
    pg.execute("CREATE SCHEMA lamina")
    pg.execute("CREATE TABLE users (id INTEGER)")
    with pytest.raises(StoreCorrupt, match="not a Lamina store"):
        open_store(pg.value)
    assert pg.rows("SELECT table_name FROM information_schema.tables "
                   "WHERE table_schema = 'lamina'") == [("users",)]  # fmt: skip


def test_an_unreachable_server_is_a_typed_error_naming_the_url(tmp_path: Path) -> None:
    url = f"postgresql://someone:secret@/db?host={tmp_path}"
    with pytest.raises(StoreUnreachable) as info:
        PostgresStore(url, timeout=1)
    assert "cannot reach the database server" in str(info.value)
    assert "secret" not in str(info.value) and "someone:***@" in str(info.value)


def test_cli_names_an_unreachable_server_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"postgresql:///db?host={tmp_path}"
    assert main(["export", url, "--conversation", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("lamina: error: store postgresql:///db")


def test_a_missing_database_is_unreachable_too(pg_server: PgServer) -> None:
    with pytest.raises(StoreUnreachable, match="does not exist"):
        PostgresStore(pg_server.url("no_such_db"), timeout=1)


def _started(store: PostgresStore, cid: str, vault: Path) -> Conversation:
    store.create(ConversationInfo(cid))
    conv = Conversation("Be terse.", vault=vault)
    conv.turn(f"first of {cid}")
    save_turn(store, cid, conv)
    return conv


def test_a_writer_waits_for_the_conversation_row_lock(pg: Backend, vault: Path) -> None:
    """While one save holds a conversation, another writer of it times out (StoreLocked);
    once the first commits, the second learns it lost (ConflictError)."""
    with open_store(pg.value) as a, open_store(pg.value, timeout=0.3) as b:
        assert isinstance(a, PostgresStore)
        _started(a, "c", vault)
        first = load_conversation(a, "c", vault=vault)
        second = load_conversation(b, "c", vault=vault)
        first.turn("from a")
        second.turn("from b")
        outcome: list[BaseException] = []
        with a.transaction():
            save_turn(a, "c", first)
            waiter = threading.Thread(target=lambda: _try(b, second, outcome))
            waiter.start()
            waiter.join(timeout=30)
        assert len(outcome) == 1 and isinstance(outcome[0], StoreLocked)
        with pytest.raises(ConflictError) as info:
            save_turn(b, "c", second)
        assert (info.value.head_turn, info.value.head_hash) == (2, a.head("c").hash)


def _try(store: PostgresStore | SqliteStore, conv: Conversation, out: list[BaseException]) -> None:
    try:
        save_turn(store, "c", conv)
    except BaseException as exc:  # the test inspects what the thread raised
        out.append(exc)


def test_writers_of_different_conversations_do_not_wait(pg: Backend, vault: Path) -> None:
    with open_store(pg.value) as a, open_store(pg.value, timeout=0.3) as b:
        assert isinstance(a, PostgresStore) and isinstance(b, PostgresStore)
        one = _started(a, "one", vault)
        two = _started(b, "two", vault)
        one.turn("more for one")
        two.turn("more for two")
        with a.transaction():
            save_turn(a, "one", one)
            save_turn(b, "two", two)  # not blocked by the lock on "one"
        assert [r.turn for r in b.turns("one")] == [1, 2]
        assert [r.turn for r in b.turns("two")] == [1, 2]


def test_a_migration_never_alters_another_applications_table(pg: Backend) -> None:
    """Schema ``lamina`` holds ``lamina_schema`` at version 1 and another application's
    ``turns``: opening names the foreign table and changes nothing (the v2 migration
    would add a column to ``turns``)."""
    pg.execute("CREATE SCHEMA lamina")
    pg.execute("CREATE TABLE lamina_schema (version INTEGER NOT NULL)")
    pg.execute("INSERT INTO lamina_schema VALUES (1)")
    pg.execute("CREATE TABLE turns (id INTEGER PRIMARY KEY, body TEXT)")
    with pytest.raises(StoreCorrupt, match="table 'turns' is not Lamina's") as info:
        open_store(pg.value)
    assert info.value.table == "turns"
    assert pg.rows(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = 'lamina' AND table_name = 'turns' ORDER BY column_name"
    ) == [("body",), ("id",)]
    assert pg.rows("SELECT version FROM lamina_schema") == [(1,)]
