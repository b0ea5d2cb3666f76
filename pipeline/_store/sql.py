"""What every SQL store shares: the rules, written once; each backend brings its SQL edges.

``SqlStore`` holds the conflict rule (a save names its parent head), the snapshot encoding
(canonical JSON, zlib, xxh3-128, checked on read), the schema version check and migration
loop, and every query both databases understand. A backend (``SqliteStore``,
``PostgresStore``) supplies connections and transactions, how a text is kept, its DDL,
its error mapping and the clause that locks a conversation row.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, Self, TypeVar

import attrs
import cattrs
import xxhash
from cattrs.gen import make_dict_structure_fn

from lamina.pipeline._conversation.batch import DeferredTurn
from lamina.pipeline._conversation.conversation import ConversationState
from lamina.pipeline._conversation.usage import TurnUsage
from lamina.pipeline._errors import (
    ConflictError,
    ConversationError,
    StoreCorrupt,
    StoreError,
    StoreForeignTable,
    StoreNeedsMigration,
    StoreSchemaTooNew,
    StoreUnknownFields,
    UnknownConversation,
)
from lamina.pipeline._model.artifacts import TurnWarning
from lamina.pipeline._model.envelope import Decision
from lamina.pipeline._model.history import HistoryEntry
from lamina.pipeline._model.library import LibraryEntry
from lamina.pipeline._store.legacy import legacy_action
from lamina.pipeline._store.records import (
    SCHEMA_VERSION,
    AttachmentRecord,
    ConversationInfo,
    Head,
    Manifest,
    SegmentManifest,
    TurnRecord,
    canonical,
    digest,
    head_hash,
    now_stamp,
)
from lamina.pipeline._turn.budget import BudgetSettings
from lamina.pipeline._views.summarize import SummaryKey, SummaryResult

__all__ = [
    "HEAD_COLUMN",
    "READS_FROM",
    "TURN_VERSION_COLUMN",
    "Cursor",
    "Db",
    "EntryCache",
    "SqlStore",
    "check_readable",
    "check_tables",
    "check_version",
    "lamina_tables",
]

# Schema version 2, the same in every backend: each turn row keeps the head hash it
# made, so ``head()`` is one indexed row read. Rows saved before it hold "" (computed).
HEAD_COLUMN = "ALTER TABLE turns ADD COLUMN head_hash TEXT NOT NULL DEFAULT ''"
HEAD_VERSION = 2

# Schema version 3 stores a state's batch turns and sent keys as entries (``_BATCH_PARTS``),
# which a reader of version 2 cannot load; and each turn row records the schema version of
# the Lamina that wrote it, checked by every read of the row: a process that opened the
# store before a newer Lamina migrated it refuses that one's turns with
# ``StoreSchemaTooNew`` (naming the turn) instead of misreading them. Rows saved before
# hold 0. A migration keeps the previous version's inserts valid (a new column has a
# default), so such a process can still write while the upgrade rolls.
TURN_VERSION_COLUMN = "ALTER TABLE turns ADD COLUMN schema_version INTEGER NOT NULL DEFAULT 0"
TURN_VERSION = 3

# The oldest schema version every read here handles as it is stored, so a read-only open
# (export, report, replay) reads it without migrating: version 2 only added
# ``turns.head_hash``, which ``head()`` computes where it is absent. A migration whose
# reads are not compatible raises this to its own version.
READS_FROM = 1

# Snapshots read per query (well under SQLite's and PostgreSQL's parameter limits).
_BATCH = 500
# State fields kept as one row per entry (versioned by turn) instead of inside the state blob.
_SPLIT_PARTS = ("library", "history", "usage")
# The state's batch fields kept as entries too (part -> ``BatchState`` field): a batch
# that does not settle holds every turn since it did (``turns``) and every key those sent
# (``sent``, only appended to), so inline in each turn's state blob they would grow the
# store with the square of the batch's length. A state without a batch keeps none; a row
# saved before these parts holds them inline in its blob.
_BATCH_PARTS = {"batch_turns": "turns", "batch_sent": "sent"}
# The type of one entry of each split part, and of a state snapshot.
_PART_TYPES: dict[str, type] = {
    # The state without its split parts (they are kept as entries).
    "state": ConversationState,
    "library": LibraryEntry,
    "history": HistoryEntry,
    "usage": TurnUsage,
    "batch_turns": DeferredTurn,
    "batch_sent": tuple[str, str],
}
# What else is decoded through the ``EntryCache``: a chunk of a manifest layer's segments.
_DECODED: dict[str, type] = {
    **_PART_TYPES,
    "segments": tuple[SegmentManifest, ...],
    "chunks": tuple[str, ...],
}
# A manifest's layers keep their segments in a two-level tree of content-addressed
# snapshots: chunks of segments (kind "segments"), chunks of those chunks' hashes (kind
# "chunks"), and the layer the hashes of the latter (``index``). Each turn's manifest lists
# every library entry and history message, so inline it grew the store with the square of
# the chat's length; now a turn writes the few nodes that changed. A chunk ends after an
# item whose key (a segment's key, a chunk's hash) hashes to 0 modulo ``_CHUNK_SPLIT``, or
# at ``_CHUNK_MAX`` items: boundaries follow the content, not positions, so appending
# rewrites the last node of each level and dropping the oldest history the first. Nodes
# stay small (a SQLite row over ~1 KB spills into an overflow page of its own).
_CHUNK_SPLIT = 8
_CHUNK_MAX = 32
# What a read takes from a store before it refuses it as corrupt (``StoreCorrupt``), so
# hostile bytes cost bounded memory and time: a snapshot inflates to at most
# ``MAX_SNAPSHOT_BYTES`` (the largest a test builds is a few MB: a whole PDF's text in one
# library entry); a manifest expands to at most ``MAX_MANIFEST_SEGMENTS`` segments (a
# 1,600-note folder turn lists about 2,000) through nodes of at most ``_CHUNK_MAX`` items;
# a turn row counts at most the entry rows the conversation holds.
MAX_SNAPSHOT_BYTES = 64 << 20
MAX_MANIFEST_SEGMENTS = 200_000
_T = TypeVar("_T")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")
# A stored key no field takes is refused (``StoreUnknownFields``), never dropped: a record
# written by a newer Lamina would lose it on the next save. A field missing from an older
# record takes its default.
_converter = cattrs.Converter(forbid_extra_keys=True)
# Stores written before warnings had codes hold bare sentences.
_converter.register_structure_hook(TurnWarning, lambda value, _: TurnWarning.of(value))
# Decisions saved before they were typed have no ``action``: it is told from the rest of
# the record (``legacy_action``). Any other key is still checked (unknown ones refused).
_decision = make_dict_structure_fn(Decision, _converter, _cattrs_forbid_extra_keys=True)


def _structure_decision(value: Any, _: Any) -> Decision:
    if isinstance(value, Mapping) and "action" not in value:
        value = {**value, "action": str(legacy_action(value))}
    return _decision(value, Decision)


_converter.register_structure_hook(Decision, _structure_decision)
# Budgets saved before recall was on by default have no ``recall``: they were made with
# recall off, or with a ``recall_share`` (on when above 0); each keeps what it had (a
# missing field would take the new default).
_budget_settings = make_dict_structure_fn(
    BudgetSettings, _converter, _cattrs_forbid_extra_keys=True
)


_DROPPED_FIELDS = ("policy", "plan", "stub_share", "history_step", "reply_tokens", "summary_tokens")
"""Budget settings no longer kept: the cut cascade's (``policy``, ``plan``, ``stub_share``)
and the three the objective replaced (``history_step``: the history suffix's cut points
follow the headroom; ``reply_tokens``: nothing shortens a reply; ``summary_tokens``: two
of the policy's preview sections). A budget saved with them is read without them."""


def _structure_budget(value: Any, _: Any) -> BudgetSettings:
    if isinstance(value, Mapping):
        value = {k: v for k, v in value.items() if k not in _DROPPED_FIELDS}
        if "recall" not in value:
            value["recall"] = float(value.pop("recall_share", 0.0) or 0.0) > 0
    return _budget_settings(value, BudgetSettings)


_converter.register_structure_hook(BudgetSettings, _structure_budget)


class Cursor(Protocol):
    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Db(Protocol):
    """The slice of a DB-API connection the shared queries use (``?`` placeholders)."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Any: ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], /) -> Any: ...


def check_version(label: str, version: object) -> int:
    """The stored schema version, refused when missing or newer than this Lamina knows."""
    if not isinstance(version, int):
        raise StoreCorrupt(label, "the schema version row is missing")
    if version > SCHEMA_VERSION:
        raise StoreSchemaTooNew(label, version, SCHEMA_VERSION)
    return version


def check_readable(label: str, version: int) -> int:
    """``version`` (already checked not newer) if a read-only open can read it as stored;
    older is ``StoreNeedsMigration``, since only a write may migrate."""
    if version < READS_FROM:
        raise StoreNeedsMigration(label, version, SCHEMA_VERSION)
    return version


def _unknown_fields(exc: BaseException) -> list[str]:
    """Every ``Class.field`` a cattrs error (a tree of groups) refused as unknown."""
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return [f"{exc.cl.__name__}.{name}" for name in exc.extra_fields]
    found: list[str] = []
    for inner in getattr(exc, "exceptions", ()):
        found += _unknown_fields(inner)
    return found


_CREATE = re.compile(r"^\s*CREATE TABLE (\w+) \((.*)\)[^)]*$", re.S)
_ADD = re.compile(r"^\s*ALTER TABLE (\w+) ADD COLUMN (\w+)\b")
_CONSTRAINTS = frozenset({"PRIMARY", "FOREIGN", "UNIQUE", "CHECK", "CONSTRAINT"})


def _top_level(body: str) -> list[str]:
    """``body``'s comma-separated items outside parentheses."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(body[start:i])
            start = i + 1
    items.append(body[start:])
    return [item.strip() for item in items if item.strip()]


def lamina_tables(migrations: Sequence[str], version: int) -> dict[str, frozenset[str]]:
    """Lamina's tables and their columns at schema ``version``, read from the migrations'
    own DDL (``CREATE TABLE`` and ``ALTER TABLE ... ADD COLUMN``), so the check below can
    never drift from what the migrations make."""
    tables: dict[str, set[str]] = {"lamina_schema": {"version"}}
    for ddl in migrations[:version]:
        for statement in ddl.split(";"):
            if made := _CREATE.match(statement):
                tables[made.group(1)] = {
                    item.split()[0]
                    for item in _top_level(made.group(2))
                    if item.split()[0].upper() not in _CONSTRAINTS
                }
            elif added := _ADD.match(statement):
                tables[added.group(1)].add(added.group(2))
    return {name: frozenset(columns) for name, columns in tables.items()}


def check_tables(
    label: str, found: Mapping[str, Iterable[str]], migrations: Sequence[str], version: int
) -> None:
    """Refuse a store whose tables are not exactly Lamina's at ``version`` (``found``: each
    table's columns), and one where a table the later migrations create already exists,
    before a migration could alter or fill another application's table."""
    expected = lamina_tables(migrations, version)
    for table in sorted(expected):
        columns = set(found.get(table, ()))
        if table in found and columns != expected[table]:
            raise StoreForeignTable(
                label,
                table,
                f"table {table!r} is not Lamina's (columns {', '.join(sorted(columns))}; "
                f"Lamina's: {', '.join(sorted(expected[table]))}): nothing was changed",
            )
    missing = sorted(set(expected) - set(found))
    if missing:
        raise StoreCorrupt(label, f"table {missing[0]!r} is missing: not a Lamina store")
    later = lamina_tables(migrations, len(migrations))
    for table in sorted(set(later) - set(expected)):
        if table in found:
            raise StoreForeignTable(
                label,
                table,
                f"table {table!r} exists but schema version {version} has none: "
                "another application's? nothing was changed",
            )


def _chunked(manifest: Manifest, snapshots: _Snapshots) -> dict[str, Any]:
    """``manifest`` as stored: each layer's segments added to ``snapshots`` as a tree of
    chunks (see ``_CHUNK_SPLIT``), the layer keeping its top level's hashes (``index``),
    and the build report as a snapshot of its own (``report_hash``)."""
    bare = tuple(attrs.evolve(layer, segments=()) for layer in manifest.layers)
    plain: dict[str, Any] = _converter.unstructure(attrs.evolve(manifest, layers=bare))
    # The build report on its own: with it, the manifest's row would pass ~1 KB.
    plain["report_hash"] = snapshots.add("report", plain.pop("report"))
    for stored, layer in zip(plain["layers"], manifest.layers, strict=True):
        del stored["segments"]
        leaves = [
            snapshots.add("segments", _converter.unstructure(chunk, tuple[SegmentManifest, ...]))
            for chunk in _chunks(layer.segments, lambda s: s.key)
        ]
        stored["index"] = [
            snapshots.add("chunks", list(chunk)) for chunk in _chunks(leaves, lambda h: h)
        ]
    return plain


def _joined(state: ConversationState, split: dict[str, Any]) -> ConversationState:
    """The state a snapshot and its parts' entries make. The batch's fields come from
    their parts where the row has them; a row saved before them keeps its blob's."""
    fields = {f: split.pop(p) for p, f in _BATCH_PARTS.items() if p in split}
    if fields and state.batch is not None:
        split["batch"] = attrs.evolve(state.batch, **fields)
    return attrs.evolve(state, **split)


def _chunks(items: Sequence[_T], key: Callable[[_T], str]) -> list[tuple[_T, ...]]:
    """``items`` cut after each item whose ``key`` says so (see ``_CHUNK_SPLIT``)."""
    out: list[tuple[_T, ...]] = []
    run: list[_T] = []
    for item in items:
        run.append(item)
        said = key(item).encode("utf-8", "surrogatepass")  # a file name may not be UTF-8
        if len(run) >= _CHUNK_MAX or xxhash.xxh3_64_intdigest(said) % _CHUNK_SPLIT == 0:
            out.append(tuple(run))
            run = []
    if run:
        out.append(tuple(run))
    return out


class _Malformed(ValueError):
    """A stored value of the wrong shape; the read that met it says where (one line)."""


def _parsed(wanted: str, body: bytes) -> Any:
    """A snapshot's JSON, or ``_Malformed`` (nested past what Python parses, too)."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise _Malformed(f"snapshot {wanted} is not JSON: {type(exc).__name__}") from None


def _check_node(wanted: str, part: str, value: Any) -> None:
    """A manifest node as ``_chunked`` writes them: at most ``_CHUNK_MAX`` items, each a
    snapshot hash (``chunks``) or a segment (``segments``); cattrs alone would make a
    string of anything asked to be one."""
    if part == "chunks":
        ok = all(type(h) is str and len(h) == 32 for h in value)
    elif part == "segments":
        ok = all(isinstance(item, SegmentManifest) for item in value)
    else:
        return
    if not (ok and 0 < len(value) <= _CHUNK_MAX):
        raise _Malformed(f"{part} node {wanted} is not one of {_CHUNK_MAX} or fewer items")


def _within(count: int, what: str) -> None:
    """Refuse a manifest past ``MAX_MANIFEST_SEGMENTS`` before it is expanded further."""
    if count > MAX_MANIFEST_SEGMENTS:
        raise _Malformed(f"{what} {count:,} items, past {MAX_MANIFEST_SEGMENTS:,}")


def _lengths(raw: Any) -> dict[str, int]:
    """A turn row's ``parts``: each split part's entry count, a non-negative integer."""
    try:
        lengths = json.loads(raw)
    except (ValueError, TypeError, RecursionError):
        raise _Malformed("parts is not JSON") from None
    if not isinstance(lengths, dict):
        raise _Malformed(f"parts is a {type(lengths).__name__}, not an object")
    for part, n in lengths.items():
        if type(n) is not int or n < 0:
            raise _Malformed(f"part {part}: the count {n!r} is not a non-negative integer")
    return lengths


class _Snapshots:
    """The snapshots a save writes, encoded before anything is written (hash -> kind and
    canonical JSON); each is compressed only if the store may lack it (``rows``)."""

    __slots__ = ("plain",)

    def __init__(self) -> None:
        self.plain: dict[str, tuple[str, bytes]] = {}

    def add(self, kind: str, value: Any) -> str:
        body = canonical(value)
        digest_ = digest(body)
        self.plain.setdefault(digest_, (kind, body))
        return digest_

    def rows(self, held: Container[str]) -> dict[str, tuple[str, bytes]]:
        """The stored rows (hash -> kind, zlib body) of those not in ``held``."""
        return {
            h: (kind, zlib.compress(body, 6))
            for h, (kind, body) in self.plain.items()
            if h not in held
        }


# How many (str, str) entry addresses an ``EntryCache`` keeps.
_PAIRS = 1 << 16


def _pair(value: Any) -> bool:
    return (
        type(value) is tuple
        and len(value) == 2
        and type(value[0]) is str
        and type(value[1]) is str
    )


class EntryCache:
    """Decoded state entries by content address, bounded by their stored size (LRU), and
    the content address of each entry value a save encoded (by identity, held weakly).

    A snapshot's hash names its bytes forever, so an entry decoded once (unzipped, checked,
    parsed, structured) is the same frozen value on every later load: a stateless server
    that restores a conversation per request reads and decodes only entries it has not
    seen (``decoded`` counts those), not the whole library and history each time. A save
    encodes (unstructures, canonical-JSON, hashes) only values it has not encoded before
    (``encoded`` counts those): an unchanged entry is the same object turn after turn.
    """

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self.hits = 0
        self.decoded = 0
        self.encoded = 0
        self._items: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._addresses: dict[int, tuple[weakref.ref[Any], str]] = {}
        # Addresses of (str, str) entries (a batch's sent keys), by value, most recent kept.
        self._pairs: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, digest_: str) -> Any | None:
        with self._lock:
            found = self._items.get(digest_)
            if found is None:
                return None
            self._items.move_to_end(digest_)
            self.hits += 1
            return found[0]

    def put(self, digest_: str, value: Any, size: int) -> None:
        with self._lock:
            self.decoded += 1
            if size > self.max_bytes or digest_ in self._items:
                return
            self._items[digest_] = (value, size)
            self.size += size
            while self.size > self.max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self.size -= dropped

    def address(self, value: Any) -> str | None:
        """The content address a save computed for this very object, or None.

        Keyed by identity, never by equality (``1 == 1.0 == True`` encode differently);
        frozen values never change, so the address stays exact while the object lives."""
        if _pair(value):
            with self._lock:
                return self._pairs.get(value)
        found = self._addresses.get(id(value))
        if found is None or found[0]() is not value:
            return None
        return found[1]

    def count_encoded(self, count: int) -> None:
        with self._lock:
            self.encoded += count

    def remember(self, value: Any, digest_: str) -> None:
        """Keep ``value``'s content address (a save encoded it, or a load checked that it
        encodes to the bytes it was decoded from) while the value lives."""
        if _pair(value):  # no weak references, but two strings compare exactly
            with self._lock:
                self._pairs[value] = digest_
                self._pairs.move_to_end(value)
                if len(self._pairs) > _PAIRS:
                    self._pairs.popitem(last=False)
            return
        key = id(value)
        items = self._addresses

        # Runs when the value is collected, maybe inside another call: it takes no lock.
        # Losing a memo only costs an encode; a kept one is always checked by identity.
        def forget(ref: weakref.ref[Any]) -> None:
            if items.get(key, (None,))[0] is ref:
                items.pop(key, None)

        with contextlib.suppress(TypeError):  # a value without weak references: never kept
            items[key] = (weakref.ref(value, forget), digest_)


class SqlStore:
    """The ``Store`` protocol over any SQL database that a backend subclass connects."""

    # Appended to the read of the conversation row a save starts with (PostgreSQL locks it).
    _lock_row = ""
    # Makes text comparisons and orderings code-point order (PostgreSQL's may follow a locale).
    _binary = ""
    # The DDL that takes schema version v to v + 1 (index v; 0 is an empty database).
    _migrations: tuple[str, ...] = ()
    _label = ""
    # The schema version the open store is at: SCHEMA_VERSION once a write open migrated
    # it, the stored one (READS_FROM or later) for a read-only open.
    _version = SCHEMA_VERSION
    # Decoded entries shared by this store's loads (each backend's constructor makes one).
    entry_cache: EntryCache

    @property
    def path(self) -> str:
        return self._label

    @property
    def schema_version(self) -> int:
        """The schema version as opened: this Lamina's after an open for writing (which
        migrates), the stored one after a read-only open (which never does)."""
        return self._version

    # -- what a backend supplies ----------------------------------------------------

    def _tx(self, write: bool) -> contextlib.AbstractContextManager[Db]:
        """One transaction (a savepoint inside ``transaction()``); writes may lock."""
        raise NotImplementedError

    def _text(self, text: str) -> Any:
        """A str as the database keeps it in a TEXT column."""
        return text

    def _untext(self, value: Any) -> Any:
        """``_text`` reversed (None stays None)."""
        return value

    def close(self) -> None:
        raise NotImplementedError

    # -- shared -----------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Everything done inside the block is one write transaction: all of it or none.

        Other writers of the same conversation wait while it is open: keep it to the writes."""
        with self._tx(write=True):
            yield

    def _columns(self, db: Db) -> dict[str, set[str]]:
        """Every table in the store's namespace with its column names."""
        raise NotImplementedError

    def _upgrade(self, db: Db, version: object) -> None:
        """Check the stored ``version`` and that every table is Lamina's as of it, then
        migrate to ``SCHEMA_VERSION`` (a foreign table is refused before any change)."""
        current = check_version(self._label, version)
        check_tables(self._label, self._columns(db), self._migrations, current)
        for step in range(current, SCHEMA_VERSION):
            for statement in self._migrations[step].split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute("UPDATE lamina_schema SET version = ?", (step + 1,))

    def _put_snapshots(self, db: Db, rows: Mapping[str, tuple[str, bytes]]) -> None:
        """Write each snapshot (hash -> kind, body) once, in hash order: two transactions
        that share snapshots then wait for each other at most, never deadlock."""
        db.executemany(
            "INSERT INTO snapshots (hash, kind, body) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
            [(h, *rows[h]) for h in sorted(rows)],
        )

    def _get_snapshot(self, db: Db, wanted: str) -> Any:
        return self._get_snapshots(db, [wanted])[wanted]

    def _get_snapshots(self, db: Db, wanted: Sequence[str]) -> dict[str, Any]:
        """Each wanted snapshot's value, read in a few queries (not one per snapshot)."""
        unique = sorted(set(wanted))
        bodies: dict[str, Any] = {}
        for start in range(0, len(unique), _BATCH):
            chunk = unique[start : start + _BATCH]
            marks = ", ".join("?" * len(chunk))
            for h, body in db.execute(
                f"SELECT hash, body FROM snapshots WHERE hash IN ({marks})", chunk
            ):
                bodies[h] = body
        return {h: self._decode(h, bodies.get(h)) for h in unique}

    def _entries(self, db: Db, wanted: Mapping[str, str]) -> dict[str, Any]:
        """Each wanted entry (hash -> its part) structured, from the store's ``EntryCache``
        where decoded before; only the others' bodies are read and decoded."""
        cache = self.entry_cache
        out: dict[str, Any] = {}
        missing: list[str] = []
        for h, part in wanted.items():
            found = cache.get(f"{part} {h}")  # one snapshot may be asked for as two kinds
            if found is None:
                missing.append(h)
            else:
                out[h] = found
        unique = sorted(set(missing))
        for start in range(0, len(unique), _BATCH):
            chunk = unique[start : start + _BATCH]
            marks = ", ".join("?" * len(chunk))
            bodies = dict(
                db.execute(f"SELECT hash, body FROM snapshots WHERE hash IN ({marks})", chunk)
            )
            for h in chunk:
                body = self._unzip(h, bodies.get(h))
                part = wanted[h]
                type_ = _DECODED[part]
                value: Any = _converter.structure(_parsed(h, body), type_)
                _check_node(h, part, value)
                cache.put(f"{part} {h}", value, len(bytes(bodies[h])))
                # A save then reuses the address, if the value encodes to these very bytes
                # (an entry written by an older Lamina may not: it is encoded anew).
                if part in _PART_TYPES and part != "state" and canonical(
                    _converter.unstructure(value, type_)
                ) == body:
                    cache.remember(value, h)
                out[h] = value
        return out

    def _decode(self, wanted: str, stored: Any) -> Any:
        try:
            return _parsed(wanted, self._unzip(wanted, stored))
        except _Malformed as exc:
            raise StoreCorrupt(self._label, str(exc)) from None

    def _unzip(self, wanted: str, stored: Any) -> bytes:
        """A stored body's canonical JSON, checked against its hash; inflated no further
        than ``MAX_SNAPSHOT_BYTES``."""
        if stored is None:
            raise StoreCorrupt(self._label, f"snapshot {wanted} is missing")
        try:
            inflate = zlib.decompressobj()
            body = inflate.decompress(bytes(stored), MAX_SNAPSHOT_BYTES)
        except (zlib.error, TypeError) as exc:
            raise StoreCorrupt(self._label, f"snapshot {wanted} is damaged: {exc}") from None
        if inflate.unconsumed_tail:
            raise StoreCorrupt(
                self._label, f"snapshot {wanted} inflates past {MAX_SNAPSHOT_BYTES:,} bytes"
            )
        if not inflate.eof:
            raise StoreCorrupt(self._label, f"snapshot {wanted} is damaged: truncated")
        if digest(body) != wanted:
            raise StoreCorrupt(self._label, f"snapshot {wanted} does not match its hash")
        return body

    def _require(self, db: Db, conversation_id: str, lock: bool = False) -> None:
        query = "SELECT 1 FROM conversations WHERE id = ?" + (self._lock_row if lock else "")
        if db.execute(query, (conversation_id,)).fetchone() is None:
            raise UnknownConversation(self._label, conversation_id)

    # -- conversations ----------------------------------------------------------------

    def create(self, info: ConversationInfo) -> None:
        if not _ID.match(info.id):
            raise StoreError(
                self._label,
                f"conversation id {info.id!r} must be 1-200 letters, digits or ._:- characters",
            )
        with self._tx(write=True) as db:
            if db.execute("SELECT 1 FROM conversations WHERE id = ?", (info.id,)).fetchone():
                raise StoreError(self._label, f"conversation {info.id!r} already exists")
            db.execute(
                "INSERT INTO conversations VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    info.id,
                    self._text(info.created),
                    self._text(info.model),
                    json.dumps(list(info.tags)),
                    self._text(info.title),
                    self._text(info.vault),
                    now_stamp(),
                ),
            )

    def delete(self, conversation_id: str) -> None:
        with self._tx(write=True) as db:
            self._require(db, conversation_id, lock=True)
            for table in ("attachments", "entries", "turns"):
                db.execute(f"DELETE FROM {table} WHERE conversation_id = ?", (conversation_id,))
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    def _info(self, row: Sequence[Any]) -> ConversationInfo:
        texts = [self._untext(v) for v in row]
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
            raise UnknownConversation(self._label, conversation_id)
        return self._info(row)

    def conversations(self) -> tuple[ConversationInfo, ...]:
        with self._tx(write=False) as db:
            rows = db.execute(
                "SELECT id, created, model, tags, title, vault FROM conversations "
                f"ORDER BY id{self._binary}"
            ).fetchall()
        return tuple(self._info(r) for r in rows)

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
        # The state blob without the parts kept as entries (each encoded on its own below).
        batch = state.batch
        plain = _converter.unstructure(
            attrs.evolve(
                state,
                library=(),
                history=(),
                usage=(),
                batch=None if batch is None else attrs.evolve(batch, turns=(), sent=()),
            )
        )
        for part in _SPLIT_PARTS:
            del plain[part]
        split: dict[str, Sequence[Any]] = {p: getattr(state, p) for p in _SPLIT_PARTS}
        for part, field in _BATCH_PARTS.items():
            split[part] = () if batch is None else getattr(batch, field)
        snapshots = _Snapshots()
        digests, known = self._entry_hashes(split, snapshots)
        state_hash = snapshots.add("state", plain)
        manifest_hash = None
        if manifest is not None:
            manifest_hash = snapshots.add("manifest", _chunked(manifest, snapshots))
        k = record.turn
        with self._tx(write=True) as db:
            # The row lock (where the backend has one) makes the head read below final.
            self._require(db, conversation_id, lock=True)
            head, current = self._head(db, conversation_id)
            if head != parent:
                raise ConflictError(
                    self._label, conversation_id, head.turn, head.hash, parent.turn, parent.hash
                )
            last = head.turn
            if k not in (last, last + 1) or k < 1:
                raise ConversationError(
                    f"conversation {conversation_id!r}: cannot save turn {k} after turn {last}"
                )
            created = record.created
            if k == last:  # the same turn again (e.g. once its reply is known): replace it
                # The user message happened once: its first recorded time is kept.
                created = self._untext(
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
                current = self._current(db, conversation_id, split, k - 1)
            # Every entry of the head is stored; rows the store has are not compressed.
            held = {h for positions in current.values() for h in positions.values()}
            stored = self._stored(db, known, held, snapshots)
            lengths: dict[str, int] = {}
            changed: list[tuple[str, str, int, int, str]] = []
            for part, items in split.items():
                before = current.get(part, {})
                changed.extend(
                    (conversation_id, part, position, k, h)
                    for position, h in enumerate(digests[part])
                    if before.get(position) != h
                )
                lengths[part] = len(items)
            self._put_snapshots(db, snapshots.rows(stored))
            db.executemany("INSERT INTO entries VALUES (?, ?, ?, ?, ?)", changed)
            new_head = Head(k, head_hash(state_hash, digests))
            db.execute(
                "INSERT INTO turns (conversation_id, turn, user_text, reply_text, created, "
                "reply_created, state_hash, manifest_hash, parts, saved_at, head_hash, "
                "schema_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    conversation_id,
                    k,
                    self._text(record.user),
                    None if record.reply is None else self._text(record.reply),
                    self._text(created),
                    self._text(record.reply_created),
                    state_hash,
                    manifest_hash,
                    json.dumps(lengths, sort_keys=True),
                    now_stamp(),
                    new_head.hash,
                    SCHEMA_VERSION,
                ),
            )
            db.executemany(
                "INSERT INTO attachments VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        conversation_id,
                        k,
                        i,
                        *map(self._text, (a.kind, a.label, a.spec)),
                        int(a.rebuilt),
                    )
                    for i, a in enumerate(record.attachments)
                ],
            )
            db.executemany(
                "INSERT INTO summaries VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                sorted(
                    (*key, self._text(r.text), json.dumps(list(r.failures)))
                    for key, r in dict(summaries).items()
                ),
            )
        return new_head

    def _entry_hashes(
        self, split: Mapping[str, Sequence[Any]], snapshots: _Snapshots
    ) -> tuple[dict[str, list[str]], dict[str, tuple[str, Any]]]:
        """Each entry's content address, encoding only values no save encoded before.

        The newly encoded go into ``snapshots``; the rest come back as ``known`` (hash ->
        part, value): their rows exist unless this store never held them (see below)."""
        cache = self.entry_cache
        digests: dict[str, list[str]] = {}
        known: dict[str, tuple[str, Any]] = {}
        encoded = 0
        for part, items in split.items():
            hashes = digests[part] = []
            for item in items:
                h = cache.address(item)
                if h is None:
                    h = snapshots.add(part, _converter.unstructure(item, _PART_TYPES[part]))
                    cache.remember(item, h)
                    encoded += 1
                else:
                    known.setdefault(h, (part, item))
                hashes.append(h)
        cache.count_encoded(encoded)
        return digests, known

    def _stored(
        self,
        db: Db,
        known: Mapping[str, tuple[str, Any]],
        held: set[str],
        snapshots: _Snapshots,
    ) -> set[str]:
        """The snapshots this save needs that the store already has (``held``: the head's
        entries, plus those found by hash). A remembered entry the store lacks (its save
        was rolled back) is encoded again: the rows a save writes never depend on what
        this process did before."""
        unsure = sorted(h for h in (*known, *snapshots.plain) if h not in held)
        stored = set(held)
        for start in range(0, len(unsure), _BATCH):
            chunk = unsure[start : start + _BATCH]
            marks = ", ".join("?" * len(chunk))
            stored.update(
                str(row[0])
                for row in db.execute(f"SELECT hash FROM snapshots WHERE hash IN ({marks})", chunk)
            )
        for h in unsure:
            if h not in stored and h not in snapshots.plain:
                part, item = known[h]
                if snapshots.add(part, _converter.unstructure(item, _PART_TYPES[part])) != h:
                    raise StoreError(self._label, f"entry {h} no longer encodes to its hash")
        return stored

    def _head(self, db: Db, conversation_id: str) -> tuple[Head, dict[str, dict[int, str]]]:
        """The stored head and, per part, each position's entry hash as of the head."""
        row = db.execute(
            "SELECT turn, state_hash, parts FROM turns WHERE conversation_id = ? "
            "ORDER BY turn DESC LIMIT 1",
            (conversation_id,),
        ).fetchone()
        if row is None:
            return Head(), {}
        k, state_hash, parts = row
        lengths = self._lengths(conversation_id, k, parts)
        current = self._current(db, conversation_id, lengths, k)
        return Head(k, self._state_hash(conversation_id, k, state_hash, lengths, current)), current

    def _lengths(self, conversation_id: str, turn: int, raw: Any) -> dict[str, int]:
        try:
            return _lengths(raw)
        except _Malformed as exc:
            raise StoreCorrupt(self._label, f"{conversation_id!r} turn {turn}: {exc}") from None

    def _state_hash(
        self,
        conversation_id: str,
        k: int,
        state_hash: str,
        lengths: Mapping[str, int],
        current: Mapping[str, Mapping[int, str]],
    ) -> str:
        ordered: dict[str, list[str]] = {}
        for part, length in lengths.items():
            # counted against the rows first: a hostile count builds nothing
            held = current[part]
            if length > len(held) or sorted(held)[:length] != list(range(length)):
                raise StoreCorrupt(
                    self._label, f"{conversation_id!r} turn {k}: part {part}: entries are missing"
                )
            ordered[part] = [held[i] for i in range(length)]
        return head_hash(state_hash, ordered)

    def head(self, conversation_id: str) -> Head:
        """One row read: the last turn and the head hash its save recorded."""
        with self._tx(write=False) as db:
            if self._version < HEAD_VERSION:  # read-only, as stored: no head_hash column
                self._require(db, conversation_id)
                return self._head(db, conversation_id)[0]
            row = db.execute(
                "SELECT turn, head_hash FROM turns WHERE conversation_id = ? "
                "ORDER BY turn DESC LIMIT 1",
                (conversation_id,),
            ).fetchone()
            if row is None:
                self._require(db, conversation_id)
                return Head()
            if row[1]:
                return Head(int(row[0]), str(row[1]))
            return self._head(db, conversation_id)[0]  # saved before schema version 2

    def _current(
        self, db: Db, conversation_id: str, parts: Iterable[str], turn: int
    ) -> dict[str, dict[int, str]]:
        """Per part, each position's entry hash as of ``turn`` (the latest row at or before
        it), read in one scan of the conversation's entry rows in key order."""
        current: dict[str, dict[int, str]] = {p: {} for p in parts}
        rows = db.execute(
            "SELECT part, position, hash FROM entries WHERE conversation_id = ? "
            "AND since_turn <= ? ORDER BY part, position, since_turn",
            (conversation_id, turn),
        ).fetchall()
        for part, position, h in rows:  # a later row of a position overwrites an earlier one
            found = current.get(str(part))
            if found is not None:
                found[int(position)] = str(h)
        return current

    def turns(self, conversation_id: str) -> tuple[TurnRecord, ...]:
        text = self._untext
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
                    AttachmentRecord(text(kind), text(label), text(spec), bool(rebuilt))
                )
        return tuple(
            TurnRecord(
                t,
                text(user),
                text(reply),
                tuple(attached.get(t, ())),
                text(created),
                text(reply_created),
            )
            for t, user, reply, created, reply_created in rows
        )

    def _written(self) -> str:
        """The turn rows' column of their writer's schema version (0: saved before it, or a
        store opened read-only at a version without the column)."""
        return "schema_version" if self._version >= TURN_VERSION else "0"

    def _check_turn(self, conversation_id: str, turn: int, written: int) -> None:
        """Refuse a turn a newer Lamina wrote (this process opened the store before that
        Lamina migrated it, or reads while servers of both versions share it)."""
        if written > SCHEMA_VERSION:
            raise StoreSchemaTooNew(
                self._label, written, SCHEMA_VERSION, conversation_id, turn
            )

    def _unreadable(
        self, exc: Exception, conversation_id: str, turn: int, written: int, what: str
    ) -> StoreError:
        """The error for a stored record that does not structure: ``StoreUnknownFields``
        when it holds fields this Lamina lacks, else ``StoreCorrupt``."""
        unknown = _unknown_fields(exc)
        if unknown:
            return StoreUnknownFields(
                self._label, sorted(set(unknown)), written, SCHEMA_VERSION, conversation_id, turn
            )
        if isinstance(exc, StoreCorrupt):  # met by a read that knew no conversation or turn
            reason = str(exc).removeprefix(f"store {self._label}: ")
        else:
            reason = (str(exc).strip().splitlines() or [""])[0] or type(exc).__name__
        return StoreCorrupt(
            self._label, f"{conversation_id!r} turn {turn}: {what} does not load: {reason}"
        )

    def load(self, conversation_id: str, turn: int | None = None) -> ConversationState:
        return self.load_head(conversation_id, turn)[0]

    def load_head(
        self, conversation_id: str, turn: int | None = None
    ) -> tuple[ConversationState, Head]:
        with self._tx(write=False) as db:
            # A turn row names an existing conversation (the schema's reference).
            columns = f"turn, state_hash, parts, {self._written()}"
            if turn is None:
                row = db.execute(
                    f"SELECT {columns} FROM turns WHERE conversation_id = ? "
                    "ORDER BY turn DESC LIMIT 1",
                    (conversation_id,),
                ).fetchone()
            else:
                row = db.execute(
                    f"SELECT {columns} FROM turns WHERE conversation_id = ? AND turn = ?",
                    (conversation_id, turn),
                ).fetchone()
            if row is None:
                self._require(db, conversation_id)
                which = "any turn" if turn is None else f"turn {turn}"
                raise StoreError(
                    self._label, f"conversation {conversation_id!r} has no saved {which}"
                )
            k, state_hash, parts, written = row
            self._check_turn(conversation_id, k, written)
            lengths = self._lengths(conversation_id, k, parts)
            current = self._current(db, conversation_id, lengths, k)
            head = Head(k, self._state_hash(conversation_id, k, state_hash, lengths, current))
            unknown = sorted(p for p in lengths if p not in _PART_TYPES or p == "state")
            if unknown:  # a newer Lamina's part: its entries would be dropped
                raise StoreUnknownFields(
                    self._label,
                    [f"part {p}" for p in unknown],
                    written,
                    SCHEMA_VERSION,
                    conversation_id,
                    k,
                )
            try:
                wanted = {current[p][i]: p for p, n in lengths.items() for i in range(n)}
                found = self._entries(db, {state_hash: "state", **wanted})
                split: dict[str, Any] = {
                    part: tuple(found[current[part][i]] for i in range(length))
                    for part, length in lengths.items()
                }
                state = _joined(found[state_hash], split)
            except Exception as exc:  # cattrs raises many kinds; all mean it is unusable
                raise self._unreadable(exc, conversation_id, k, written, "state") from None
        return state, head

    def manifest(self, conversation_id: str, turn: int) -> Manifest | None:
        with self._tx(write=False) as db:
            self._require(db, conversation_id)
            row = db.execute(
                f"SELECT manifest_hash, {self._written()} FROM turns "
                "WHERE conversation_id = ? AND turn = ?",
                (conversation_id, turn),
            ).fetchone()
            if row is None or row[0] is None:
                return None
            self._check_turn(conversation_id, turn, row[1])
            try:
                plain = self._get_snapshot(db, row[0])
                if "report_hash" in plain:
                    plain["report"] = self._get_snapshot(db, plain.pop("report_hash"))
                index: list[list[str] | None] = []
                for layer in plain["layers"]:
                    index.append(layer.pop("index", None))
                    if index[-1] is not None:
                        layer.setdefault("segments", [])
                tops = [h for top in index if top for h in top]
                _within(len(tops), "the index lists")
                nodes = self._entries(db, {h: "chunks" for h in tops})
                _within(sum(len(nodes[h]) for h in tops), "its chunks list")
                leaves = [
                    None if top is None else [h for node in top for h in nodes[node]]
                    for top in index
                ]
                found = self._entries(db, {h: "segments" for hs in leaves if hs for h in hs})
                _within(sum(len(found[h]) for hs in leaves if hs for h in hs), "it lists")
                manifest: Manifest = _converter.structure(plain, Manifest)
                # A layer saved before chunks keeps its segments inline.
                layers = tuple(
                    layer
                    if hashes is None
                    else attrs.evolve(layer, segments=tuple(s for h in hashes for s in found[h]))
                    for layer, hashes in zip(manifest.layers, leaves, strict=True)
                )
            except Exception as exc:
                raise self._unreadable(exc, conversation_id, turn, row[1], "manifest") from None
        return attrs.evolve(manifest, layers=layers)

    def find_attachment(self, kind: str, label: str) -> AttachmentRecord | None:
        with self._tx(write=False) as db:
            row = db.execute(
                "SELECT kind, label, spec, rebuilt FROM attachments "
                "WHERE kind = ? AND label = ? AND spec != '' "
                f"ORDER BY conversation_id{self._binary}, turn LIMIT 1",
                (self._text(kind), self._text(label)),
            ).fetchone()
        if row is None:
            return None
        text = self._untext
        return AttachmentRecord(text(row[0]), text(row[1]), text(row[2]), bool(row[3]))

    # -- memo tables ------------------------------------------------------------------

    _closed = False

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
        if row is None:
            return None
        return SummaryResult(self._untext(row[0]), tuple(json.loads(row[1])))

    def put_summary(
        self, content_hash: str, target_tokens: int, summarizer_id: str, result: SummaryResult
    ) -> None:
        """First write wins, like ``SummaryCache``: a stored summary never changes."""
        with self._tx(write=True) as db:
            db.execute(
                "INSERT INTO summaries VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (
                    content_hash,
                    target_tokens,
                    summarizer_id,
                    self._text(result.text),
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
                "INSERT INTO token_counts VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                (text_hash, tokenizer, tokens),
            )
