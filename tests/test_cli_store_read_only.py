"""Commands that only read a store (export, report) open it read-only: a store is never
written nor migrated by being looked at, on SQLite (its bytes) and PostgreSQL (its rows)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lamina.pipeline.errors import StoreError, StoreNeedsMigration
from lamina.pipeline.store import open_store
from tests.cli import lamina_here
from tests.stores import Backend
from tests.test_cli import script  # noqa: F401 (the fixture)


def _saved(backend: Backend, script: Path) -> None:  # noqa: F811
    ran = lamina_here("run", str(script), "--store", backend.value, "--conversation", "c1")
    assert ran.returncode == 0, ran.stderr


def _to_version_2(backend: Backend) -> None:
    """The store as a Lamina of schema version 2 left it: no ``turns.schema_version``."""
    backend.execute("ALTER TABLE turns DROP COLUMN schema_version")
    backend.execute("UPDATE lamina_schema SET version = 2")


def _to_version_1(backend: Backend) -> None:
    """The store as a Lamina of schema version 1 left it: no ``turns.head_hash`` either."""
    _to_version_2(backend)
    backend.execute("ALTER TABLE turns DROP COLUMN head_hash")
    backend.execute("UPDATE lamina_schema SET version = 1")


def _state(backend: Backend, folder: Path) -> object:
    """Everything a read could change: every row, and for SQLite the file's bytes and
    its side files (no -wal or -shm left behind)."""
    if backend.name == "postgres":
        return backend.dump()
    store = Path(backend.value)
    siblings = sorted(p.name for p in folder.iterdir() if p.name.startswith(store.name))
    return store.read_bytes(), siblings


def _looked_at(backend: Backend, folder: Path) -> tuple[str, bytes]:
    """What export and report --store give (the report page without its output path)."""
    exported = lamina_here("export", backend.value, "--conversation", "c1")
    assert exported.returncode == 0, exported.stderr
    page = folder / "report.html"
    reported = lamina_here(
        "report", "--store", backend.value, "--conversation", "c1", "--out", str(page)
    )
    assert reported.returncode == 0, reported.stderr
    assert reported.stdout.endswith("(2 turns)\n")
    body = page.read_bytes()
    page.unlink()
    return exported.stdout, body


def test_export_and_report_leave_the_store_unchanged(
    backend: Backend, script: Path, tmp_path: Path  # noqa: F811
) -> None:
    _saved(backend, script)
    before = _state(backend, tmp_path)
    text, _ = _looked_at(backend, tmp_path)
    assert text.startswith("---\n") and "Summarize this" in text
    assert _state(backend, tmp_path) == before


def test_a_version_1_store_is_read_as_it_is_and_stays_version_1(
    backend: Backend, script: Path, tmp_path: Path  # noqa: F811
) -> None:
    """Version 2 only added turns.head_hash: export and report read a version-1 store as
    stored, give what they gave before, and leave it at version 1, byte for byte."""
    _saved(backend, script)
    current = _looked_at(backend, tmp_path)
    with open_store(backend.value) as store:
        head = store.head("c1")
    _to_version_1(backend)
    before = _state(backend, tmp_path)
    assert _looked_at(backend, tmp_path) == current
    assert _state(backend, tmp_path) == before
    assert backend.rows("SELECT version FROM lamina_schema") == [(1,)]
    with open_store(backend.value, read_only=True) as store:
        assert store.schema_version == 1
        assert store.head("c1") == head  # computed: there is no recorded head to read
    assert _state(backend, tmp_path) == before


def test_a_store_too_old_to_read_names_the_command_that_migrates_it(
    backend: Backend, tmp_path: Path
) -> None:
    """A store older than what reads handle is refused, unchanged, with a typed error
    naming the store and `lamina migrate`; that command migrates it and says so."""
    if backend.name == "postgres":
        backend.execute("CREATE SCHEMA lamina")
    else:
        Path(backend.value).touch()
    backend.execute("CREATE TABLE lamina_schema (version INTEGER NOT NULL)")
    backend.execute("INSERT INTO lamina_schema VALUES (0)")
    before = _state(backend, tmp_path) if backend.name == "sqlite" else None
    with pytest.raises(StoreNeedsMigration) as info:
        open_store(backend.value, read_only=True)
    assert (info.value.found, info.value.supported, info.value.path) == (0, 3, backend.label)
    out = lamina_here("export", backend.value, "--conversation", "c1")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert f"store {backend.label}: schema version 0 must be migrated" in out.stderr
    assert f"run `lamina migrate {backend.label}` first" in out.stderr
    if before is not None:
        assert _state(backend, tmp_path) == before
    assert backend.rows("SELECT version FROM lamina_schema") == [(0,)]
    migrated = lamina_here("migrate", backend.value)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout == f"store {backend.label}: schema version 3 (was 0)\n"
    assert backend.rows("SELECT version FROM lamina_schema") == [(3,)]
    again = lamina_here("migrate", backend.value)
    assert again.stdout == f"store {backend.label}: schema version 3 (already current)\n"


def test_migrate_takes_a_version_1_store_to_version_3_with_recorded_heads_computed(
    backend: Backend, script: Path  # noqa: F811
) -> None:
    _saved(backend, script)
    with open_store(backend.value) as store:
        head = store.head("c1")
    _to_version_1(backend)
    out = lamina_here("migrate", backend.value)
    assert out.stdout == f"store {backend.label}: schema version 3 (was 1)\n"
    with open_store(backend.value, read_only=True) as store:
        assert store.schema_version == 3 and store.head("c1") == head


def test_a_read_only_open_is_refused_writes_by_the_database_itself(backend: Backend) -> None:
    """Not only Lamina's own check: SQLite's mode=ro and PostgreSQL's read-only session
    refuse even SQL that bypasses the store's write path."""
    open_store(backend.value).close()
    refused = {"sqlite": "readonly database", "postgres": "read-only transaction"}
    with (
        open_store(backend.value, read_only=True) as store,
        pytest.raises(StoreError, match=refused[backend.name]),
        store._tx(write=False) as db,
    ):
        db.execute("CREATE TABLE intruder (a INTEGER)")
    tables = {
        "sqlite": "SELECT name FROM sqlite_master WHERE type = 'table'",
        "postgres": "SELECT table_name FROM information_schema.tables",
    }
    named = {row[0] for row in backend.rows(tables[backend.name])}
    assert "conversations" in named and "intruder" not in named
