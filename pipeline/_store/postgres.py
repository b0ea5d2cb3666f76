"""The server store: PostgreSQL through psycopg 3 and a connection pool (extra ``postgres``).

Tables live in their own schema (``lamina``), so a store can share a database with the
host application. A save is one transaction that first locks its conversation's row
(``SELECT ... FOR UPDATE``): writers of one conversation take turns, writers of different
conversations do not wait for each other, and the conflict rule of ``SqlStore`` then reads
a head nobody can move. Snapshots are content-addressed and written once
(``ON CONFLICT DO NOTHING``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import re
import threading
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from lamina.pipeline._errors import StoreCorrupt, StoreError, StoreLocked, StoreUnreachable
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

if TYPE_CHECKING:
    import psycopg
    import psycopg_pool

__all__ = [
    "MIGRATIONS",
    "SCHEMA",
    "PostgresStore",
    "is_postgres_url",
    "mask_secrets",
    "mask_url",
]

SCHEMA = "lamina"

_SCHEMA_V1 = """
CREATE TABLE snapshots (
    hash TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    body BYTEA NOT NULL
);
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
);
CREATE TABLE entries (
    conversation_id TEXT NOT NULL,
    part TEXT NOT NULL,
    position INTEGER NOT NULL,
    since_turn INTEGER NOT NULL,
    hash TEXT NOT NULL REFERENCES snapshots(hash),
    PRIMARY KEY (conversation_id, part, position, since_turn)
);
CREATE TABLE attachments (
    conversation_id TEXT NOT NULL,
    turn INTEGER NOT NULL,
    position INTEGER NOT NULL,
    kind TEXT NOT NULL,
    label TEXT NOT NULL,
    spec TEXT NOT NULL,
    rebuilt INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, turn, position)
);
CREATE INDEX attachments_by_label ON attachments(kind, label);
CREATE TABLE summaries (
    content_hash TEXT NOT NULL,
    target_tokens BIGINT NOT NULL,
    summarizer_id TEXT NOT NULL,
    text TEXT NOT NULL,
    failures TEXT NOT NULL,
    PRIMARY KEY (content_hash, target_tokens, summarizer_id)
);
CREATE TABLE token_counts (
    text_hash TEXT NOT NULL,
    tokenizer TEXT NOT NULL,
    tokens BIGINT NOT NULL,
    PRIMARY KEY (text_hash, tokenizer)
);
"""

# MIGRATIONS[v] takes a store at schema version v to v + 1 (0 is an empty schema).
MIGRATIONS: tuple[str, ...] = (_SCHEMA_V1, HEAD_COLUMN, TURN_VERSION_COLUMN)

# Taken while the schema is created or migrated, so two first openers do not collide.
_MIGRATION_LOCK = 0x6C616D696E61
# A text PostgreSQL cannot hold (NUL, lone surrogates) is kept as this mark + its JSON.
_ESCAPED = "\ufdd0"
# A password in a URL's query: its value runs to the next ``&keyword=`` of libpq's
# connection keywords (a raw ``&`` inside a password, ``password=ab&c=d``, stays masked),
# case-insensitive like a person writes it.
_KEYWORDS = (
    "host", "hostaddr", "port", "dbname", "user", "password", "passfile", "channel_binding",
    "connect_timeout", "client_encoding", "options", "application_name",
    "fallback_application_name", "keepalives", "keepalives_idle", "keepalives_interval",
    "keepalives_count", "tcp_user_timeout", "replication", "gssencmode", "sslmode", "requiressl",
    "sslcompression", "sslcert", "sslkey", "sslpassword", "sslcertmode", "sslrootcert", "sslcrl",
    "sslcrldir", "sslsni", "sslnegotiation", "requirepeer", "ssl_min_protocol_version",
    "ssl_max_protocol_version", "min_protocol_version", "max_protocol_version", "krbsrvname",
    "gsslib", "gssdelegation", "service", "target_session_attrs", "load_balance_hosts",
    "require_auth",
)
_QUERY_SECRET = re.compile(
    r"((?:^|[?&])(?:ssl)?password=)(.*?)(?=&(?:" + "|".join(_KEYWORDS) + r")=|$)", re.I | re.S
)
# ``password=...`` in a driver's message (a conninfo string): to a space, quote or ``&``.
_SAID_SECRET = re.compile(r"(\b(?:ssl)?password\s*=\s*)('[^']*'|[^\s&\"]*)", re.I)
# user:password@ in any URL a message quotes (up to the last @ of the word).
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)\S*@")


def _secrets(url: str) -> tuple[str, ...]:
    """Every secret ``url`` holds, as written and percent-decoded and -encoded: the
    password between the user's ``:`` and the authority's last ``@``, and the values of
    ``password=`` and ``sslpassword=`` parameters. Longest first."""
    found: list[str] = []
    rest = url.partition("://")[2]
    userinfo, at, _ = rest.rpartition("@")
    if at and ":" in userinfo:
        found.append(userinfo.partition(":")[2])
    found += [m.group(2) for m in _QUERY_SECRET.finditer(url.partition("?")[2])]
    forms = {
        form
        for secret in found
        for form in (
            secret,
            urllib.parse.unquote(secret),
            urllib.parse.quote(secret, safe=""),
            urllib.parse.quote(urllib.parse.unquote(secret), safe=""),
        )
        if form
    }
    return tuple(sorted(forms, key=lambda f: (-len(f), f)))


def mask_url(url: str) -> str:
    """``url`` as messages name it: ``user:***@`` for the password, ``password=***``."""
    scheme, sep, rest = url.partition("://")
    if sep:
        userinfo, at, after = rest.rpartition("@")
        if at and ":" in userinfo:
            rest = f"{userinfo.partition(':')[0]}:***@{after}"
        url = f"{scheme}{sep}{rest}"
    base, q, query = url.partition("?")
    return base + q + _QUERY_SECRET.sub(r"\1***", query) if q else url


def mask_secrets(text: str, secrets: Sequence[str]) -> str:
    """``text`` (a driver's message) with every run of 3 or more characters that occurs in
    a secret, every URL password and every ``password=`` value replaced by ``***``: a
    driver quotes pieces of a URL it cannot parse, not only whole passwords."""
    out: list[str] = []
    i = 0
    while i < len(text):
        run = 0
        for secret in secrets:
            n = run + 1
            while i + n <= len(text) and text[i : i + n] in secret:
                run = n
                n += 1
        if run >= 3:
            out.append("***")
            i += run
        else:
            out.append(text[i])
            i += 1
    masked = _USERINFO.sub(r"\1***@", "".join(out))
    return _SAID_SECRET.sub(r"\1***", masked)


def is_postgres_url(value: str) -> bool:
    """Whether a ``--store`` value names a PostgreSQL server rather than a SQLite file."""
    return value.startswith(("postgresql://", "postgres://"))


@functools.lru_cache(maxsize=256)
def _placeholders(sql: str) -> str:
    return sql.replace("?", "%s")


class _PgDb:
    """A psycopg connection seen through the shared queries' ``?`` placeholders."""

    __slots__ = ("_conn",)

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Any:
        return self._conn.execute(_placeholders(sql), parameters)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], /) -> Any:
        batch = list(rows)
        if batch:
            with self._conn.cursor() as cursor:
                cursor.executemany(_placeholders(sql), batch)


class PostgresStore(SqlStore):
    """The ``Store`` protocol on a PostgreSQL server (``postgresql://`` URL).

    ``timeout`` bounds connecting, waiting for a pooled connection and waiting for another
    writer's lock (then ``StoreUnreachable`` or ``StoreLocked``); ``max_connections`` is
    the pool's size. Open one per process and share it between threads.
    """

    _lock_row = " FOR UPDATE"
    _binary = ' COLLATE "C"'
    _migrations = MIGRATIONS

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        max_connections: int = 4,
        read_only: bool = False,
    ) -> None:
        self._label = mask_url(url)
        self._secrets = _secrets(url)
        self._timeout = timeout
        self.read_only = read_only
        self.entry_cache = EntryCache()
        try:
            import psycopg
            import psycopg_pool
        except ImportError:
            raise StoreError(
                self._label, "PostgreSQL needs the postgres extra: pip install 'lamina[postgres]'"
            ) from None
        self._psycopg = psycopg
        self._local = threading.local()
        settings: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": max(1, math.ceil(timeout)),
            "options": f"-c search_path={SCHEMA} -c lock_timeout={max(1, int(timeout * 1000))}"
            + (" -c default_transaction_read_only=on" if read_only else ""),
        }
        # The first connection is made directly, so its failure says the server's words.
        with self._errors():
            try:
                first = psycopg.connect(url, **settings)
            except psycopg.ProgrammingError as exc:  # a malformed URL
                raise StoreError(
                    self._label, f"not a usable URL: {self._said(exc)}"
                ) from None
            except UnicodeDecodeError:  # a percent-escape that is not UTF-8
                raise StoreError(self._label, "not a usable URL: not UTF-8") from None
            with first:
                if read_only:
                    self._check_schema(first)
                else:
                    self._migrate(first)
            self._pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
                url,
                kwargs=settings,
                min_size=1,
                max_size=max(1, max_connections),
                timeout=timeout,
                open=True,
            )
        self._closed = False

    def close(self) -> None:
        self._closed = True
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.close()

    # -- plumbing ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        errors = self._psycopg.errors
        try:
            yield
        except errors.LockNotAvailable:
            raise StoreLocked(
                self._label, f"another writer holds the lock (waited {self._timeout:g} s)"
            ) from None
        except (errors.UndefinedTable, errors.UndefinedColumn) as exc:
            raise StoreCorrupt(
                self._label, f"tables are missing or damaged: {self._said(exc)}"
            ) from None
        except self._psycopg.OperationalError as exc:
            raise StoreUnreachable(self._label, self._said(exc)) from None
        except self._psycopg.Error as exc:
            raise StoreError(self._label, self._said(exc)) from None

    def _said(self, exc: BaseException) -> str:
        """The driver's first line, its secrets masked (it may quote the URL)."""
        return mask_secrets(_first_line(exc), self._secrets)

    @contextlib.contextmanager
    def _tx(self, write: bool) -> Iterator[Db]:
        """One transaction on a pooled connection held by this thread until it ends.

        Inside ``transaction()`` it is a savepoint of the outer transaction instead. Reads
        see one snapshot (REPEATABLE READ); writes lock what they change."""
        if self._closed:
            raise StoreError(self._label, "the store is closed")
        if write and self.read_only:
            raise StoreError(self._label, "opened read-only: nothing can be saved")
        held: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        with self._errors():
            if held is not None:
                held.execute("SAVEPOINT lamina_inner")
                try:
                    yield _PgDb(held)
                except BaseException:
                    held.execute("ROLLBACK TO SAVEPOINT lamina_inner")
                    held.execute("RELEASE SAVEPOINT lamina_inner")
                    raise
                held.execute("RELEASE SAVEPOINT lamina_inner")
                return
            with self._pool.connection() as conn:
                conn.execute("BEGIN" if write else "BEGIN ISOLATION LEVEL REPEATABLE READ")
                self._local.conn = conn
                try:
                    yield _PgDb(conn)
                except BaseException:
                    if not conn.closed:
                        conn.execute("ROLLBACK")
                    raise
                finally:
                    self._local.conn = None
                conn.execute("COMMIT")

    def _check_schema(self, conn: psycopg.Connection[Any]) -> None:
        """A read-only open: the schema must hold Lamina's tables at its stored version,
    one this Lamina reads as it is (``check_readable``); nothing is migrated."""
        db = _PgDb(conn)
        found = self._columns(db)
        if "lamina_schema" not in found:
            raise StoreCorrupt(self._label, f"schema {SCHEMA!r} holds no Lamina store")
        row = db.execute("SELECT version FROM lamina_schema").fetchone()
        version = check_version(self._label, None if row is None else row[0])
        check_tables(self._label, found, self._migrations, version)
        self._version = check_readable(self._label, version)

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        db = _PgDb(conn)
        conn.execute("BEGIN")
        try:
            db.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
            tables = {
                r[0]
                for r in db.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = ?",
                    (SCHEMA,),
                )
            }
            if "lamina_schema" in tables:
                row = db.execute("SELECT version FROM lamina_schema").fetchone()
                version = None if row is None else row[0]
            elif tables:
                raise StoreCorrupt(
                    self._label, f"schema {SCHEMA!r} holds other tables: not a Lamina store"
                )
            else:
                db.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
                db.execute("CREATE TABLE lamina_schema (version INTEGER NOT NULL)")
                db.execute("INSERT INTO lamina_schema VALUES (0)")
                version = 0
            self._upgrade(db, version)
        except BaseException:
            if not conn.closed:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _columns(self, db: Db) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        rows = db.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = ?",
            (SCHEMA,),
        )
        for table, column in rows:
            found.setdefault(table, set()).add(column)
        return found

    def _text(self, text: str) -> Any:
        """PostgreSQL's TEXT holds no NUL and only valid UTF-8: such a text is escaped."""
        if "\x00" in text or text.startswith(_ESCAPED):
            return _ESCAPED + json.dumps(text)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return _ESCAPED + json.dumps(text)
        return text

    def _untext(self, value: Any) -> Any:
        if isinstance(value, str) and value.startswith(_ESCAPED):
            return json.loads(value[len(_ESCAPED) :])
        return value


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
