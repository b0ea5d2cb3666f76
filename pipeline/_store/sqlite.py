"""The embedded default store: one SQLite file in WAL mode, safe across processes."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lamina.pipeline._errors import StoreCorrupt, StoreError, StoreLocked
from lamina.pipeline._store.sql import (
    HEAD_COLUMN,
    TURN_VERSION_COLUMN,
    Db,
    EntryCache,
    SqlStore,
    check_readable,
    check_tables,
    check_version,
)

__all__ = ["MIGRATIONS", "SqliteStore"]

_SCHEMA_V1 = """
CREATE TABLE snapshots (
    hash TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    body BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE conversations (
    id TEXT PRIMARY KEY,
    created TEXT NOT NULL,
    model TEXT NOT NULL,
    tags TEXT NOT NULL,
    title TEXT NOT NULL,
    vault TEXT NOT NULL,
    saved_at TEXT NOT NULL
);
CREATE TABLE turns (
    conversation_id TEXT NOT NULL REFERENCES conversations(id),
    turn INTEGER NOT NULL,
    user_text TEXT NOT NULL,
    reply_text TEXT,
    created TEXT NOT NULL,
    reply_created TEXT NOT NULL,
    state_hash TEXT NOT NULL REFERENCES snapshots(hash),
    manifest_hash TEXT REFERENCES snapshots(hash),
    parts TEXT NOT NULL,
    saved_at TEXT NOT NULL,
    PRIMARY KEY (conversation_id, turn)
) WITHOUT ROWID;
CREATE TABLE entries (
    conversation_id TEXT NOT NULL,
    part TEXT NOT NULL,
    position INTEGER NOT NULL,
    since_turn INTEGER NOT NULL,
    hash TEXT NOT NULL REFERENCES snapshots(hash),
    PRIMARY KEY (conversation_id, part, position, since_turn)
) WITHOUT ROWID;
CREATE TABLE attachments (
    conversation_id TEXT NOT NULL,
    turn INTEGER NOT NULL,
    position INTEGER NOT NULL,
    kind TEXT NOT NULL,
    label TEXT NOT NULL,
    spec TEXT NOT NULL,
    rebuilt INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, turn, position)
) WITHOUT ROWID;
CREATE INDEX attachments_by_label ON attachments(kind, label);
CREATE TABLE summaries (
    content_hash TEXT NOT NULL,
    target_tokens INTEGER NOT NULL,
    summarizer_id TEXT NOT NULL,
    text TEXT NOT NULL,
    failures TEXT NOT NULL,
    PRIMARY KEY (content_hash, target_tokens, summarizer_id)
) WITHOUT ROWID;
CREATE TABLE token_counts (
    text_hash TEXT NOT NULL,
    tokenizer TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    PRIMARY KEY (text_hash, tokenizer)
) WITHOUT ROWID;
"""

# MIGRATIONS[v] takes a store at schema version v to v + 1 (0 is an empty file).
MIGRATIONS: tuple[str, ...] = (_SCHEMA_V1, HEAD_COLUMN, TURN_VERSION_COLUMN)


class SqliteStore(SqlStore):
    """The embedded default: one SQLite file in WAL mode, safe across processes.

    ``timeout`` is how long a writer waits for another process's lock before
    ``StoreLocked``. Commits use ``synchronous=NORMAL``: a killed process never loses or
    corrupts a committed turn; a power cut may lose the last one but never corrupts.
    """

    _migrations = MIGRATIONS

    def __init__(
        self, path: str | Path, *, timeout: float = 10.0, read_only: bool = False
    ) -> None:
        self._path = self._label = str(path)
        self._timeout = timeout
        self._closed = False
        self.read_only = read_only
        self.entry_cache = EntryCache()
        if Path(self._path).is_dir():
            raise StoreError(self._path, "is a folder, not a store file")
        # One connection shared by the threads that use this store, one at a time.
        self._lock = threading.RLock()
        self._depth = 0
        # A read-only reader of a WAL file makes its -wal and -shm side files when absent
        # and, unable to write, cannot remove them on close (see ``close``).
        self._tidy = read_only and not any(
            Path(self._path + side).exists() for side in ("-wal", "-shm")
        )
        try:
            if read_only:
                # SQLite's own read-only mode: no table, journal or header byte can change.
                uri = "file:" + urllib.parse.quote(os.fsencode(Path(self._path).absolute()))
                self._db = sqlite3.connect(
                    uri + "?mode=ro",
                    uri=True,
                    timeout=timeout,
                    isolation_level=None,
                    check_same_thread=False,
                )
            else:
                self._db = sqlite3.connect(
                    self._path, timeout=timeout, isolation_level=None, check_same_thread=False
                )
        except sqlite3.Error as exc:
            raise StoreError(self._path, f"cannot open: {exc}") from None
        try:
            with self._errors():
                version = self._refuse_foreign()
                if read_only:
                    if version is None:
                        raise StoreCorrupt(self._path, "not a Lamina store (it has no tables)")
                    self._version = check_readable(self._path, version)
                    return
                self._wal()
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.execute("PRAGMA foreign_keys=ON")
                self._migrate()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._db.close()
            if self._tidy:
                self._remove_side_files()

    def _remove_side_files(self) -> None:
        """Leave the folder as a read-only open found it: the -wal and -shm side files it
        made are removed the way SQLite removes them, by one more connection that reads
        and closes. SQLite deletes them only if it is the file's last connection (under
        its own lock, so another process's are never touched), after checkpointing a WAL
        this reader left empty; the store file's bytes stay as they were. Best effort: a
        file this process may not write keeps them."""
        with contextlib.suppress(sqlite3.Error):
            uri = "file:" + urllib.parse.quote(os.fsencode(Path(self._path).absolute()))
            db = sqlite3.connect(uri + "?mode=rw", uri=True, timeout=0)
            try:
                db.execute("SELECT count(*) FROM sqlite_master").fetchone()
            finally:
                db.close()

    def _wal(self) -> None:
        """Put the file in WAL mode. The switch reads the file, then writes its header:
        while another connection holds the write lock (a second process opening a new
        store, mid-switch or mid-migration), SQLite answers busy at once instead of
        calling its busy handler, which a reader waiting for a writer could deadlock. So
        the wait is here: retry, sleeping a little longer each time, until the timeout."""
        deadline = time.monotonic() + self._timeout
        pause = 0.001
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL").fetchone()
                return
            except sqlite3.OperationalError as exc:
                if not _busy(exc) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(2 * pause, 0.05)

    def _refuse_foreign(self) -> int | None:
        """Refuse another application's SQLite file by reading it only: nothing (not even
        the journal mode in its header) may change before it is known to be a store whose
        every table is Lamina's. Returns its schema version (None: no tables yet)."""
        found = self._columns(self._db)
        if not found:
            return None
        if "lamina_schema" not in found:
            raise StoreCorrupt(self._path, "not a Lamina store (a SQLite file with other tables)")
        row = self._db.execute("SELECT version FROM lamina_schema").fetchone()
        version = check_version(self._path, None if row is None else row[0])
        check_tables(self._path, found, self._migrations, version)
        return version

    # -- plumbing ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as exc:
            text = str(exc).lower()
            if _busy(exc):
                raise StoreLocked(
                    self._path, f"another process holds the lock (waited {self._timeout:g} s)"
                ) from None
            if "no such table" in text or "no such column" in text:
                raise StoreCorrupt(self._path, f"tables are missing or damaged: {exc}") from None
            raise StoreError(self._path, str(exc)) from None
        except sqlite3.ProgrammingError as exc:
            raise StoreError(self._path, f"cannot be used: {exc}") from None
        except sqlite3.DatabaseError as exc:
            raise StoreCorrupt(self._path, f"not a SQLite database or damaged: {exc}") from None

    @contextlib.contextmanager
    def _tx(self, write: bool) -> Iterator[Db]:
        """One transaction: IMMEDIATE for writes (take the lock up front), deferred reads.

        Inside ``transaction()`` it is a savepoint of the outer transaction instead."""
        with self._lock:
            if self._closed:
                raise StoreError(self._path, "the store is closed")
            if write and self.read_only:
                raise StoreError(self._path, "opened read-only: nothing can be saved")
            nested = self._depth > 0
            with self._errors():
                if nested:
                    self._db.execute("SAVEPOINT inner")
                else:
                    self._db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                self._depth += 1
                try:
                    yield self._db
                except BaseException:
                    if self._db.in_transaction:
                        if nested:
                            self._db.execute("ROLLBACK TO inner")
                            self._db.execute("RELEASE inner")
                        else:
                            self._db.execute("ROLLBACK")
                    raise
                finally:
                    self._depth -= 1
                self._db.execute("RELEASE inner" if nested else "COMMIT")

    def _migrate(self) -> None:
        with self._tx(write=True) as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if "lamina_schema" in tables:
                row = db.execute("SELECT version FROM lamina_schema").fetchone()
                version = None if row is None else row[0]
            elif tables:
                raise StoreCorrupt(
                    self._path, "not a Lamina store (a SQLite file with other tables)"
                )
            else:
                db.execute("CREATE TABLE lamina_schema (version INTEGER NOT NULL)")
                db.execute("INSERT INTO lamina_schema VALUES (0)")
                version = 0
            self._upgrade(db, version)

    def _columns(self, db: Db) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        rows = db.execute(
            "SELECT m.name, p.name FROM sqlite_master AS m, pragma_table_info(m.name) AS p "
            "WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite%'"
        )
        for table, column in rows:
            found.setdefault(table, set()).add(column)
        return found

    def _text(self, text: str) -> Any:
        """A str for a TEXT column; one holding lone surrogates (a file name that is not
        UTF-8) is kept as its surrogatepass bytes, which SQLite stores as given."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return text.encode("utf-8", "surrogatepass")
        return text

    def _untext(self, value: Any) -> Any:
        return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else value


def _busy(exc: sqlite3.OperationalError) -> bool:
    """Another connection holds the lock (SQLite's "database is locked")."""
    text = str(exc).lower()
    return "locked" in text or "busy" in text
