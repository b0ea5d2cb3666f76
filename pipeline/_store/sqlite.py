"""Conversation persistence: a small ``Store`` protocol and its SQLite default.

The store keeps everything a conversation needs to continue byte-identically after a
reload: the ``ConversationState`` of every turn (split into content-addressed snapshots,
so library entries and history entries are written once), per-turn envelope manifests
(typed segments and hashes, never rendered text), the attachments of each turn, and
memo tables for summaries and token counts. Saving a turn is one transaction.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import threading
import time
import uuid
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs
import cattrs
import xxhash

from pipeline._conversation.conversation import Conversation, ConversationState
from pipeline._errors import (
    ConflictError,
    ConversationError,
    LaminaError,
    StoreCorrupt,
    StoreError,
    StoreLocked,
    StoreSchemaTooNew,
    UnknownConversation,
)
from pipeline._model.artifacts import AttachmentSpec, TurnWarning
from pipeline._model.envelope import BuildReport, Envelope, Form
from pipeline._views.summarize import SummaryBacking, SummaryKey, SummaryResult

__all__ = [
    "SCHEMA_VERSION",
    "AttachmentRecord",
    "ConversationInfo",
    "Head",
    "LayerManifest",
    "Manifest",
    "SegmentManifest",
    "SqliteStore",
    "Store",
    "TurnRecord",
    "attachment_record",
    "back_summaries",
    "load_conversation",
    "new_conversation_id",
    "now_stamp",
    "rebuild_envelope",
    "save_turn",
    "turn_record",
]

SCHEMA_VERSION = 1

# State fields kept as one row per entry (versioned by turn) instead of inside the state blob.
_SPLIT_PARTS = ("library", "history", "usage")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")
_converter = cattrs.Converter()
# Stores written before warnings had codes hold bare sentences.
_converter.register_structure_hook(TurnWarning, lambda value, _: TurnWarning.of(value))


def new_conversation_id() -> str:
    """A fresh random id (only ever used at the edge, never inside anything hashed)."""
    return uuid.uuid4().hex


def now_stamp() -> str:
    """The wall-clock time for humans (UTC, ISO 8601); never hashed or rendered."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# --- records ---------------------------------------------------------------------------


@attrs.frozen
class Head:
    """Where a stored conversation stands: its last turn and that turn's state hash.

    A save names the head it continues (``parent``); the empty conversation is
    ``Head(0, "")``. The hash covers the whole saved state (its content-addressed parts),
    so two writers that both continue turn N from different states never look alike.
    """

    turn: int = 0
    hash: str = ""


@attrs.frozen
class ConversationInfo:
    """A conversation's header: id and the human metadata a transcript shows."""

    id: str
    created: str = ""
    model: str = ""
    tags: tuple[str, ...] = ()
    title: str = ""
    vault: str = ""


@attrs.frozen
class AttachmentRecord:
    """One attachment of a turn: its kind, a label (path, URL, key) and its script form.

    ``spec`` is the canonical JSON of the script form (``{"note": "a.md"}``), or "" when
    the attachment could not be rebuilt on import (``rebuilt`` is then False).
    """

    kind: str
    label: str
    spec: str = ""
    rebuilt: bool = True

    def data(self) -> dict[str, Any] | None:
        """The script form as a mapping, or None when it was not kept."""
        return json.loads(self.spec) if self.spec else None


@attrs.frozen
class TurnRecord:
    """What a transcript shows of one turn: texts, attachments and timestamps."""

    turn: int
    user: str
    reply: str | None = None
    attachments: tuple[AttachmentRecord, ...] = ()
    created: str = ""
    reply_created: str = ""


@attrs.frozen
class SegmentManifest:
    """A segment without its text: identity, form, hash and token count."""

    key: str
    form: Form
    source_type: str
    content_hash: str
    tokens: int
    title: str = ""
    locator: str = ""
    recoverable: bool = True
    role: str = ""


@attrs.frozen
class LayerManifest:
    name: str
    hash: str
    tokens: int
    segments: tuple[SegmentManifest, ...]


@attrs.frozen
class Manifest:
    """A turn's envelope as typed segments and hashes (what was sent, not the bytes)."""

    turn: int
    prefix_hash: str
    layers: tuple[LayerManifest, ...]
    report: BuildReport

    @classmethod
    def of(cls, envelope: Envelope) -> Manifest:
        layers = tuple(
            LayerManifest(
                str(layer.name),
                layer.hash,
                layer.tokens,
                tuple(
                    SegmentManifest(
                        s.key,
                        s.form,
                        s.source_type,
                        s.content_hash,
                        s.tokens,
                        s.title,
                        s.locator,
                        s.recoverable,
                        s.role,
                    )
                    for s in layer.segments
                ),
            )
            for layer in envelope.layers
        )
        return cls(envelope.turn, envelope.prefix_hash, layers, envelope.report)


# --- the protocol ----------------------------------------------------------------------


class Store(SummaryBacking, Protocol):
    """Where conversations live between processes; small enough for a server database.

    It is also where memoized summaries outlive the process (``SummaryBacking``)."""

    @property
    def path(self) -> str:
        """A label naming the store in errors (a file path, a URL)."""
        ...

    def create(self, info: ConversationInfo) -> None:
        """Add a conversation header; StoreError if the id is taken."""
        ...

    def conversation(self, conversation_id: str) -> ConversationInfo:
        """The header; UnknownConversation if absent."""
        ...

    def conversations(self) -> tuple[ConversationInfo, ...]: ...

    def delete(self, conversation_id: str) -> None:
        """Remove a conversation, its turns and attachments (snapshots and memos stay:
        they are content-addressed and shared); UnknownConversation if absent."""
        ...

    def save_turn(
        self,
        conversation_id: str,
        record: TurnRecord,
        state: ConversationState,
        manifest: Manifest | None = None,
        summaries: Sequence[tuple[SummaryKey, SummaryResult]] = (),
        *,
        parent: Head,
    ) -> Head:
        """Save turn ``record.turn`` atomically, with the summaries the turn made (memo
        rows, first write wins), and return the new head.

        ``parent`` is the head the save continues: the turn before for a new turn; for the
        same turn saved again (once its reply is known) the head this writer's earlier save
        of it returned, so a turn is only ever replaced from the state it was built on. If
        the stored head is not ``parent``, ``ConflictError`` (carrying the head) and nothing
        is written."""
        ...

    def head(self, conversation_id: str) -> Head:
        """The stored head (cheap: no snapshot is read); ``Head()`` before any turn."""
        ...

    def load_head(
        self, conversation_id: str, turn: int | None = None
    ) -> tuple[ConversationState, Head]:
        """``load`` and the head of that state, read in one transaction."""
        ...

    def transaction(self) -> contextlib.AbstractContextManager[None]:
        """Everything the store does inside the block is one transaction: all or nothing."""
        ...

    def turns(self, conversation_id: str) -> tuple[TurnRecord, ...]: ...

    def load(self, conversation_id: str, turn: int | None = None) -> ConversationState:
        """The state after ``turn`` (default: the last saved turn)."""
        ...

    def manifest(self, conversation_id: str, turn: int) -> Manifest | None: ...

    def find_attachment(self, kind: str, label: str) -> AttachmentRecord | None:
        """A stored attachment with a kept script form (e.g. a selection by key)."""
        ...

    def get_tokens(self, text_hash: str, tokenizer: str) -> int | None: ...

    def put_tokens(self, text_hash: str, tokenizer: str, tokens: int) -> None: ...

    def close(self) -> None: ...


# --- SQLite ----------------------------------------------------------------------------

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
MIGRATIONS: tuple[str, ...] = (_SCHEMA_V1,)


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    )


def _digest(body: bytes) -> str:
    return str(xxhash.xxh3_128_hexdigest(body))


def _head_hash(state_hash: str, parts: Mapping[str, Sequence[str]]) -> str:
    """The hash of a whole saved state: its snapshot and its parts' entry hashes in order."""
    return _digest(_canonical({"state": state_hash, "parts": {p: list(parts[p]) for p in parts}}))


def _sql(text: str) -> str | bytes:
    """A str for a TEXT column; one holding lone surrogates (a file name that is not UTF-8)
    is kept as its surrogatepass bytes, which SQLite stores as given and ``_str`` reverses."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")
    return text


def _str(value: Any) -> Any:
    return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else value


class SqliteStore:
    """The embedded default: one SQLite file in WAL mode, safe across processes.

    ``timeout`` is how long a writer waits for another process's lock before
    ``StoreLocked``. Commits use ``synchronous=NORMAL``: a killed process never loses or
    corrupts a committed turn; a power cut may lose the last one but never corrupts.
    """

    def __init__(self, path: str | Path, *, timeout: float = 10.0) -> None:
        self._path = str(path)
        self._timeout = timeout
        self._closed = False
        if Path(self._path).is_dir():
            raise StoreError(self._path, "is a folder, not a store file")
        # One connection shared by the threads that use this store, one at a time.
        self._lock = threading.RLock()
        self._depth = 0
        try:
            self._db = sqlite3.connect(
                self._path, timeout=timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StoreError(self._path, f"cannot open: {exc}") from None
        try:
            with self._errors():
                self._refuse_foreign()
                self._db.execute("PRAGMA journal_mode=WAL").fetchone()
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.execute("PRAGMA foreign_keys=ON")
                self._migrate()
        except BaseException:
            self._db.close()
            raise

    @property
    def path(self) -> str:
        return self._path

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._db.close()

    def _refuse_foreign(self) -> None:
        """Refuse another application's SQLite file by reading it only: nothing (not even
        the journal mode in its header) may change before it is known to be a store."""
        tables = {
            r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        if tables and "lamina_schema" not in tables:
            raise StoreCorrupt(self._path, "not a Lamina store (a SQLite file with other tables)")

    # -- plumbing ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as exc:
            text = str(exc).lower()
            if "locked" in text or "busy" in text:
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
    def _tx(self, write: bool) -> Iterator[sqlite3.Connection]:
        """One transaction: IMMEDIATE for writes (take the lock up front), deferred reads.

        Inside ``transaction()`` it is a savepoint of the outer transaction instead."""
        with self._lock:
            if self._closed:
                raise StoreError(self._path, "the store is closed")
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

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Everything done inside the block is one write transaction: all of it or none.

        Other writers wait (up to ``timeout``) while it is open: keep it to the writes."""
        with self._tx(write=True):
            yield

    def _migrate(self) -> None:
        with self._tx(write=True) as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if "lamina_schema" in tables:
                row = db.execute("SELECT version FROM lamina_schema").fetchone()
                if row is None or not isinstance(row[0], int):
                    raise StoreCorrupt(self._path, "the schema version row is missing")
                version: int = row[0]
            elif tables:
                raise StoreCorrupt(
                    self._path, "not a Lamina store (a SQLite file with other tables)"
                )
            else:
                db.execute("CREATE TABLE lamina_schema (version INTEGER NOT NULL)")
                db.execute("INSERT INTO lamina_schema VALUES (0)")
                version = 0
            if version > SCHEMA_VERSION:
                raise StoreSchemaTooNew(self._path, version, SCHEMA_VERSION)
            for step in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[step].split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute("UPDATE lamina_schema SET version = ?", (step + 1,))

    def _put_snapshot(self, db: sqlite3.Connection, kind: str, value: Any) -> str:
        body = _canonical(value)
        digest = _digest(body)
        # A library entry is saved again with every turn: compress only what is new.
        if db.execute("SELECT 1 FROM snapshots WHERE hash = ?", (digest,)).fetchone() is None:
            db.execute(
                "INSERT INTO snapshots (hash, kind, body) VALUES (?, ?, ?)",
                (digest, kind, zlib.compress(body, 6)),
            )
        return digest

    def _get_snapshot(self, db: sqlite3.Connection, digest: str) -> Any:
        row = db.execute("SELECT body FROM snapshots WHERE hash = ?", (digest,)).fetchone()
        if row is None:
            raise StoreCorrupt(self._path, f"snapshot {digest} is missing")
        try:
            body = zlib.decompress(row[0])
        except (zlib.error, TypeError) as exc:
            raise StoreCorrupt(self._path, f"snapshot {digest} is damaged: {exc}") from None
        if _digest(body) != digest:
            raise StoreCorrupt(self._path, f"snapshot {digest} does not match its hash")
        return json.loads(body)

    def _require(self, db: sqlite3.Connection, conversation_id: str) -> None:
        if (
            db.execute("SELECT 1 FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
            is None
        ):
            raise UnknownConversation(self._path, conversation_id)

    # -- conversations ----------------------------------------------------------------

    def create(self, info: ConversationInfo) -> None:
        if not _ID.match(info.id):
            raise StoreError(
                self._path,
                f"conversation id {info.id!r} must be 1-200 letters, digits or ._:- characters",
            )
        with self._tx(write=True) as db:
            if db.execute("SELECT 1 FROM conversations WHERE id = ?", (info.id,)).fetchone():
                raise StoreError(self._path, f"conversation {info.id!r} already exists")
            db.execute(
                "INSERT INTO conversations VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    info.id,
                    _sql(info.created),
                    _sql(info.model),
                    json.dumps(list(info.tags)),
                    _sql(info.title),
                    _sql(info.vault),
                    now_stamp(),
                ),
            )

    def _info(self, row: Sequence[Any]) -> ConversationInfo:
        texts = [_str(v) for v in row]
        return ConversationInfo(
            texts[0], texts[1], texts[2], tuple(json.loads(texts[3])), texts[4], texts[5]
        )

    def conversation(self, conversation_id: str) -> ConversationInfo:
        with self._tx(write=False) as db:
            row = db.execute(
                "SELECT id, created, model, tags, title, vault FROM conversations WHERE id = ?",
                (conversation_id,),
            ).fetchone()
        if row is None:
            raise UnknownConversation(self._path, conversation_id)
        return self._info(row)

    def conversations(self) -> tuple[ConversationInfo, ...]:
        with self._tx(write=False) as db:
            rows = db.execute(
                "SELECT id, created, model, tags, title, vault FROM conversations ORDER BY id"
            ).fetchall()
        return tuple(self._info(r) for r in rows)

    def delete(self, conversation_id: str) -> None:
        with self._tx(write=True) as db:
            self._require(db, conversation_id)
            for table in ("attachments", "entries", "turns"):
                db.execute(f"DELETE FROM {table} WHERE conversation_id = ?", (conversation_id,))
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # -- turns ------------------------------------------------------------------------

    def save_turn(
        self,
        conversation_id: str,
        record: TurnRecord,
        state: ConversationState,
        manifest: Manifest | None = None,
        summaries: Sequence[tuple[SummaryKey, SummaryResult]] = (),
        *,
        parent: Head,
    ) -> Head:
        plain = _converter.unstructure(state)
        split = {p: plain.pop(p) for p in _SPLIT_PARTS if isinstance(plain.get(p), list)}
        k = record.turn
        with self._tx(write=True) as db:
            self._require(db, conversation_id)
            head, current = self._head(db, conversation_id)
            if head != parent:
                raise ConflictError(
                    self._path, conversation_id, head.turn, head.hash, parent.turn, parent.hash
                )
            last = head.turn
            if k not in (last, last + 1) or k < 1:
                raise ConversationError(
                    f"conversation {conversation_id!r}: cannot save turn {k} after turn {last}"
                )
            created = record.created
            if k == last:  # the same turn again (e.g. once its reply is known): replace it
                # The user message happened once: its first recorded time is kept.
                created = _str(
                    db.execute(
                        "SELECT created FROM turns WHERE conversation_id = ? AND turn = ?",
                        (conversation_id, k),
                    ).fetchone()[0]
                )
                for table, column in (
                    ("entries", "since_turn"),
                    ("turns", "turn"),
                    ("attachments", "turn"),
                ):
                    db.execute(
                        f"DELETE FROM {table} WHERE conversation_id = ? AND {column} = ?",
                        (conversation_id, k),
                    )
                current = {p: self._current(db, conversation_id, p, k - 1) for p in split}
            lengths: dict[str, int] = {}
            digests: dict[str, list[str]] = {}
            for part, items in split.items():
                before = current.get(part, {})
                digests[part] = []
                for position, item in enumerate(items):
                    digest = self._put_snapshot(db, part, item)
                    digests[part].append(digest)
                    if before.get(position) != digest:
                        db.execute(
                            "INSERT INTO entries VALUES (?, ?, ?, ?, ?)",
                            (conversation_id, part, position, k, digest),
                        )
                lengths[part] = len(items)
            state_hash = self._put_snapshot(db, "state", plain)
            manifest_hash = (
                None
                if manifest is None
                else self._put_snapshot(db, "manifest", _converter.unstructure(manifest))
            )
            db.execute(
                "INSERT INTO turns VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    conversation_id,
                    k,
                    _sql(record.user),
                    None if record.reply is None else _sql(record.reply),
                    _sql(created),
                    _sql(record.reply_created),
                    state_hash,
                    manifest_hash,
                    json.dumps(lengths, sort_keys=True),
                    now_stamp(),
                ),
            )
            db.executemany(
                "INSERT INTO attachments VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (conversation_id, k, i, *map(_sql, (a.kind, a.label, a.spec)), int(a.rebuilt))
                    for i, a in enumerate(record.attachments)
                ],
            )
            db.executemany(
                "INSERT OR IGNORE INTO summaries VALUES (?, ?, ?, ?, ?)",
                [(*key, _sql(r.text), json.dumps(list(r.failures))) for key, r in summaries],
            )
        return Head(k, _head_hash(state_hash, digests))

    def _head(
        self, db: sqlite3.Connection, conversation_id: str
    ) -> tuple[Head, dict[str, dict[int, str]]]:
        """The stored head and, per part, each position's entry hash as of the head."""
        row = db.execute(
            "SELECT turn, state_hash, parts FROM turns WHERE conversation_id = ? "
            "ORDER BY turn DESC LIMIT 1",
            (conversation_id,),
        ).fetchone()
        if row is None:
            return Head(), {}
        k, state_hash, parts = row
        current = {p: self._current(db, conversation_id, p, k) for p in json.loads(parts)}
        return Head(k, self._state_hash(k, state_hash, parts, current)), current

    def _state_hash(
        self, k: int, state_hash: str, parts: str, current: Mapping[str, Mapping[int, str]]
    ) -> str:
        ordered: dict[str, list[str]] = {}
        for part, length in json.loads(parts).items():
            if sorted(current[part])[:length] != list(range(length)):
                raise StoreCorrupt(self._path, f"turn {k}: {part} entries are missing")
            ordered[part] = [current[part][i] for i in range(length)]
        return _head_hash(state_hash, ordered)

    def head(self, conversation_id: str) -> Head:
        with self._tx(write=False) as db:
            self._require(db, conversation_id)
            return self._head(db, conversation_id)[0]

    def _current(
        self, db: sqlite3.Connection, conversation_id: str, part: str, turn: int
    ) -> dict[int, str]:
        """Each position's entry hash as of ``turn`` (the latest row at or before it)."""
        rows = db.execute(
            "SELECT position, hash FROM (SELECT position, hash, ROW_NUMBER() OVER "
            "(PARTITION BY position ORDER BY since_turn DESC) AS rn FROM entries "
            "WHERE conversation_id = ? AND part = ? AND since_turn <= ?) WHERE rn = 1",
            (conversation_id, part, turn),
        ).fetchall()
        return {int(p): str(h) for p, h in rows}

    def turns(self, conversation_id: str) -> tuple[TurnRecord, ...]:
        with self._tx(write=False) as db:
            self._require(db, conversation_id)
            rows = db.execute(
                "SELECT turn, user_text, reply_text, created, reply_created FROM turns "
                "WHERE conversation_id = ? ORDER BY turn",
                (conversation_id,),
            ).fetchall()
            attached: dict[int, list[AttachmentRecord]] = {}
            for turn, kind, label, spec, rebuilt in db.execute(
                "SELECT turn, kind, label, spec, rebuilt FROM attachments "
                "WHERE conversation_id = ? ORDER BY turn, position",
                (conversation_id,),
            ):
                attached.setdefault(turn, []).append(
                    AttachmentRecord(_str(kind), _str(label), _str(spec), bool(rebuilt))
                )
        return tuple(
            TurnRecord(
                t,
                _str(user),
                _str(reply),
                tuple(attached.get(t, ())),
                _str(created),
                _str(reply_created),
            )
            for t, user, reply, created, reply_created in rows
        )

    def load(self, conversation_id: str, turn: int | None = None) -> ConversationState:
        return self.load_head(conversation_id, turn)[0]

    def load_head(
        self, conversation_id: str, turn: int | None = None
    ) -> tuple[ConversationState, Head]:
        with self._tx(write=False) as db:
            self._require(db, conversation_id)
            if turn is None:
                row = db.execute(
                    "SELECT turn, state_hash, parts FROM turns WHERE conversation_id = ? "
                    "ORDER BY turn DESC LIMIT 1",
                    (conversation_id,),
                ).fetchone()
            else:
                row = db.execute(
                    "SELECT turn, state_hash, parts FROM turns "
                    "WHERE conversation_id = ? AND turn = ?",
                    (conversation_id, turn),
                ).fetchone()
            if row is None:
                which = "any turn" if turn is None else f"turn {turn}"
                raise StoreError(
                    self._path, f"conversation {conversation_id!r} has no saved {which}"
                )
            k, state_hash, parts = row
            plain = self._get_snapshot(db, state_hash)
            current = {p: self._current(db, conversation_id, p, k) for p in json.loads(parts)}
            try:
                head = Head(k, self._state_hash(k, state_hash, parts, current))
            except StoreCorrupt:
                raise StoreCorrupt(
                    self._path, f"{conversation_id!r} turn {k}: entries are missing"
                ) from None
            for part, length in json.loads(parts).items():
                plain[part] = [self._get_snapshot(db, current[part][i]) for i in range(length)]
        try:
            return _converter.structure(plain, ConversationState), head
        except Exception as exc:  # cattrs raises many kinds; all mean the record is unusable
            raise StoreCorrupt(
                self._path, f"{conversation_id!r} turn {k}: state does not load: {exc}"
            ) from None

    def manifest(self, conversation_id: str, turn: int) -> Manifest | None:
        with self._tx(write=False) as db:
            self._require(db, conversation_id)
            row = db.execute(
                "SELECT manifest_hash FROM turns WHERE conversation_id = ? AND turn = ?",
                (conversation_id, turn),
            ).fetchone()
            if row is None or row[0] is None:
                return None
            plain = self._get_snapshot(db, row[0])
        try:
            return _converter.structure(plain, Manifest)
        except Exception as exc:
            raise StoreCorrupt(
                self._path, f"manifest of turn {turn} does not load: {exc}"
            ) from None

    def find_attachment(self, kind: str, label: str) -> AttachmentRecord | None:
        with self._tx(write=False) as db:
            row = db.execute(
                "SELECT kind, label, spec, rebuilt FROM attachments "
                "WHERE kind = ? AND label = ? AND spec != '' "
                "ORDER BY conversation_id, turn LIMIT 1",
                (_sql(kind), _sql(label)),
            ).fetchone()
        if row is None:
            return None
        return AttachmentRecord(_str(row[0]), _str(row[1]), _str(row[2]), bool(row[3]))

    # -- memo tables ------------------------------------------------------------------

    def get_summary(
        self, content_hash: str, target_tokens: int, summarizer_id: str
    ) -> SummaryResult | None:
        """The memoized summary, or None (always None once closed: a conversation that
        outlives its store stops reading it rather than failing)."""
        if self._closed:
            return None
        with self._tx(write=False) as db:
            row = db.execute(
                "SELECT text, failures FROM summaries WHERE content_hash = ? AND target_tokens = ? "
                "AND summarizer_id = ?",
                (content_hash, target_tokens, summarizer_id),
            ).fetchone()
        return None if row is None else SummaryResult(_str(row[0]), tuple(json.loads(row[1])))

    def put_summary(
        self, content_hash: str, target_tokens: int, summarizer_id: str, result: SummaryResult
    ) -> None:
        """First write wins, like ``SummaryCache``: a stored summary never changes."""
        with self._tx(write=True) as db:
            db.execute(
                "INSERT OR IGNORE INTO summaries VALUES (?, ?, ?, ?, ?)",
                (
                    content_hash,
                    target_tokens,
                    summarizer_id,
                    _sql(result.text),
                    json.dumps(list(result.failures)),
                ),
            )

    def get_tokens(self, text_hash: str, tokenizer: str) -> int | None:
        with self._tx(write=False) as db:
            row = db.execute(
                "SELECT tokens FROM token_counts WHERE text_hash = ? AND tokenizer = ?",
                (text_hash, tokenizer),
            ).fetchone()
        return None if row is None else int(row[0])

    def put_tokens(self, text_hash: str, tokenizer: str, tokens: int) -> None:
        with self._tx(write=True) as db:
            db.execute(
                "INSERT OR IGNORE INTO token_counts VALUES (?, ?, ?)",
                (text_hash, tokenizer, tokens),
            )


# --- conversation helpers ----------------------------------------------------------------

Attachment = AttachmentSpec | Mapping[str, Any]

# Script-form field names of the built-in spec classes (kind -> (field, attribute) pairs).
_SPEC_FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    "note": (("note", "path"),),
    "folder": (("folder", "path"),),
    "tag": (("tag", "tag"),),
    "url": (("url", "url"),),
    "pdf": (("pdf", "path"), ("pages", "pages")),
    "youtube": (("youtube", "video_id"), ("transcript", "transcript")),
}


def _script_form(spec: Attachment) -> dict[str, Any] | None:
    if isinstance(spec, Mapping):
        return dict(spec)
    kind = spec.kind
    if kind == "selection":
        payload = spec.payload  # type: ignore[attr-defined]
        form: dict[str, Any] = {"selection": payload.text}
        if payload.source:
            form["source"] = payload.source
        if payload.lines:
            form["lines"] = list(payload.lines)
        return form
    fields = _SPEC_FIELDS.get(kind)
    if fields is None or not all(hasattr(spec, attr) for _, attr in fields):
        return None
    form = {name: getattr(spec, attr) for name, attr in fields}
    return {k: v for k, v in form.items() if v not in (None, "") or k == kind}


def attachment_record(
    spec: Attachment, conversation: Conversation | None = None
) -> AttachmentRecord:
    """How a transcript lists an attachment: kind, a label and its script form.

    Selections are labelled by their artifact key (computed with ``conversation``'s
    sources, no I/O), every other kind by the path, URL, tag or video it names.
    """
    form = _script_form(spec)
    kind = (
        spec.kind
        if not isinstance(spec, Mapping)
        else next(
            (
                k
                for k in ("note", "folder", "tag", "url", "youtube", "pdf", "selection")
                if k in spec
            ),
            str(next(iter(spec), "")),
        )
    )
    if form is None:
        text = spec.describe()  # type: ignore[union-attr]
        return AttachmentRecord(kind, text.removeprefix(f"{kind} "), "", True)
    if kind == "selection" and conversation is not None:
        label = conversation.process(form).artifacts[0].key
    elif kind == "pdf" and form.get("pages"):
        label = f"{form['pdf']}#pages={form['pages']}"
    else:
        label = str(form.get(kind, ""))
    return AttachmentRecord(kind, label, _canonical(form).decode("utf-8", "surrogatepass"), True)


def save_turn(
    store: Store,
    conversation_id: str,
    conversation: Conversation,
    envelope: Envelope | None = None,
    attach: Sequence[Attachment | AttachmentRecord] = (),
    *,
    created: str | None = None,
    reply_created: str | None = None,
    parent: Head | None = None,
) -> TurnRecord:
    """Save the conversation's last turn (call again after ``reply()`` to add the reply).

    The save continues ``parent``, by default the head the conversation was loaded at or
    last saved (``conversation.saved_head``; the empty head for a new conversation). When
    another writer moved the conversation on, ``ConflictError`` and nothing is saved:
    load it again (``load_conversation``) and redo the turn.
    """
    if not conversation.history:
        raise ConversationError("save_turn() was called before any turn")
    record = turn_record(
        conversation, attach, created=created, reply_created=reply_created
    )
    back_summaries(conversation, store)
    summaries = conversation.summaries.unsaved()
    conversation.saved_head = store.save_turn(
        conversation_id,
        record,
        conversation.state,
        None if envelope is None else Manifest.of(envelope),
        summaries,
        parent=parent or conversation.saved_head or Head(),
    )
    conversation.summaries.mark_saved(key for key, _ in summaries)
    return record


def turn_record(
    conversation: Conversation,
    attach: Sequence[Attachment | AttachmentRecord] = (),
    *,
    created: str | None = None,
    reply_created: str | None = None,
) -> TurnRecord:
    """What a transcript keeps of the conversation's last turn (texts, attachments, times)."""
    last = conversation.history[-1]
    stamp = now_stamp()
    return TurnRecord(
        turn=last.turn,
        user=last.user,
        reply=last.assistant,
        attachments=tuple(
            a if isinstance(a, AttachmentRecord) else attachment_record(a, conversation)
            for a in attach
        ),
        created=stamp if created is None else created,
        reply_created=("" if last.assistant is None else stamp)
        if reply_created is None
        else reply_created,
    )


def back_summaries(conversation: Conversation, store: Store) -> Conversation:
    """Back the conversation's summary memo with ``store`` (unless it has a backing)."""
    if conversation.summaries.backing is None:
        conversation.summaries.backing = store
    return conversation


def load_conversation(
    store: Store,
    conversation_id: str,
    *,
    turn: int | None = None,
    **restore: Any,
) -> Conversation:
    """``Conversation.restore`` of a stored state; ``restore`` takes vault=, sources=, ...

    The saved budget comes back unless ``budget=`` is given; summaries are read from and
    saved to the store's memo, so an LLM summary renders to the same bytes after a reload.
    """
    state, head = store.load_head(conversation_id, turn)
    conversation = back_summaries(Conversation.restore(state, **restore), store)
    conversation.saved_head = head
    return conversation


def rebuild_envelope(
    store: Store, conversation_id: str, turn: int | None = None, **restore: Any
) -> Envelope | None:
    """Turn ``turn``'s envelope (default: the last) built again from the turn before it.

    A resumed chat needs the previous request to report what the cache kept; the store
    holds manifests, not texts, so the turn is replayed and checked against its manifest.
    None when it cannot be replayed identically (a note changed on disk, a spec not kept).
    """
    records = store.turns(conversation_id)
    k = turn if turn is not None else len(records)
    if not 1 <= k <= len(records):
        return None
    record = records[k - 1]
    forms = [a.data() for a in record.attachments if a.rebuilt]
    if any(form is None for form in forms):
        return None
    after = store.load(conversation_id, k)
    system = after.last_system or after.system
    # The budget the turn was built with (saved with its state), unless one is given.
    options = dict(restore)
    if options.get("budget") is None and after.budget is not None:
        options["budget"] = after.budget.budget()
    if k > 1:
        before = store.load(conversation_id, k - 1)
        conv = Conversation.restore(before, **options)
        conv.set_system(system.stable, system.mutable)
    else:
        before = ConversationState(system)
        conv = Conversation(system, tokenizer=after.tokenizer, policy=after.policy, **options)
    back_summaries(conv, store)
    earlier = dict(before.vault_changes)
    changes = {p: t for p, t in after.vault_changes if earlier.get(p) != t}
    try:
        envelope = conv.turn(
            record.user, [f for f in forms if f is not None], vault_changes=changes
        )
    except LaminaError:
        return None
    return envelope if Manifest.of(envelope) == store.manifest(conversation_id, k) else None
