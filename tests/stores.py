"""Both store backends for tests: a throwaway PostgreSQL cluster and a per-test store.

The cluster (``benchmarks.pgcluster``) is made with the machine's ``initdb`` (as the
``postgres`` user when the tests run as root), listens only on a Unix socket in its own
temp folder, runs with ``fsync=off`` and is stopped at the end of the session. In CI
(``CI=true``) a missing PostgreSQL is a failure, elsewhere a skip that says why.
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import os
import sqlite3
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from benchmarks.pgcluster import Cluster, Unavailable, throwaway_cluster
from lamina.pipeline.store import PostgresStore, SqliteStore, open_store

BACKENDS = ("sqlite", "postgres")
_TABLES = ("lamina_schema", "conversations", "turns", "entries", "snapshots", "attachments",
           "summaries", "token_counts")  # fmt: skip
_numbers = itertools.count()


@attrs.frozen
class PgServer:
    """The session's cluster; each test asks it for a fresh database."""

    cluster: Cluster

    def url(self, database: str) -> str:
        return self.cluster.url(database)

    def create_database(self) -> str:
        return self.cluster.create_database(f"t{os.getpid()}_{next(_numbers)}")


@contextlib.contextmanager
def pg_cluster() -> Iterator[PgServer]:
    """Start a cluster for the session; in CI a missing PostgreSQL fails, else skips."""
    try:
        with throwaway_cluster() as cluster:
            yield PgServer(cluster)
    except Unavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(str(exc))
        pytest.skip(str(exc))


@attrs.frozen
class Backend:
    """One store for one test: its ``--store`` value, and raw SQL on it for damage tests."""

    name: str
    value: str

    def open(self, **options: Any) -> SqliteStore | PostgresStore:
        return open_store(self.value, **options)

    @property
    def label(self) -> str:
        """How errors name the store (the path, the URL without a password)."""
        return self.value

    def rows(self, sql: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run ``sql`` (``?`` placeholders) on the store's tables, outside the store."""
        if self.name == "sqlite":
            db = sqlite3.connect(self.value)
            try:
                cursor = db.execute(sql, parameters)
                found = [tuple(r) for r in cursor.fetchall()] if cursor.description else []
                db.commit()
            finally:
                db.close()
            return found
        import psycopg

        with psycopg.connect(self.value, autocommit=True, options="-c search_path=lamina") as c:
            cur = c.execute(sql.replace("?", "%s"), parameters)
            return [tuple(r) for r in cur.fetchall()] if cur.description else []

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> None:
        self.rows(sql, parameters)

    def dump(self) -> list[list[str]]:
        """Every row of every table, in a stable order: equal dumps, equal stores."""
        tables = []
        for table in _TABLES:
            rows = self.rows(f"SELECT * FROM {table}")
            tables.append(sorted(repr(tuple(bytes(v) if isinstance(v, memoryview) else v
                                            for v in r)) for r in rows))  # fmt: skip
        return tables


def make_backend(name: str, folder: Path, server: PgServer | None) -> Backend:
    if name == "sqlite":
        return Backend(name, str(folder / "s.db"))
    assert server is not None
    return Backend(name, server.create_database())


# Stores older Lamina versions wrote (``tests/data/legacy-stores``, described in
# tests/data/README.md).
LEGACY = Path(__file__).resolve().parent / "data" / "legacy-stores"
COMMITS = ("04fd623", "4f04b07", "a7b9f6f")
# Parents before children, for the foreign keys.
_COPIED = ("snapshots", "conversations", "turns", "entries", "attachments", "summaries",
           "token_counts")  # fmt: skip


def legacy_store(commit: str, backend: Backend) -> str:
    """The store ``commit`` wrote, at ``backend`` (schema version 2, every row as written:
    PostgreSQL gets the SQLite file's rows in a version-2 schema); returns the id of its
    one conversation."""
    body = gzip.decompress((LEGACY / f"{commit}.sqlite.gz").read_bytes())
    if backend.name == "sqlite":
        Path(backend.value).write_bytes(body)
        return str(backend.rows("SELECT id FROM conversations")[0][0])
    import psycopg

    with backend.open():
        pass  # this Lamina's tables, then back to what version 2 had
    backend.execute("ALTER TABLE turns DROP COLUMN schema_version")
    backend.execute("UPDATE lamina_schema SET version = 2")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "old.sqlite"
        path.write_bytes(body)
        db = sqlite3.connect(path)
        try:
            with psycopg.connect(backend.value, options="-c search_path=lamina") as pg:
                for table in _COPIED:
                    cursor = db.execute(f"SELECT * FROM {table}")
                    names = ", ".join(d[0] for d in cursor.description)
                    marks = ", ".join(["%s"] * len(cursor.description))
                    with pg.cursor() as out:
                        out.executemany(
                            f"INSERT INTO {table} ({names}) VALUES ({marks})", cursor.fetchall()
                        )
            (cid,) = db.execute("SELECT id FROM conversations").fetchone()
        finally:
            db.close()
    return str(cid)
