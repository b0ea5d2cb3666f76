"""Conversation persistence: the ``Store`` protocol, its records and the helpers hosts call.

The store keeps everything a conversation needs to continue byte-identically after a
reload: the ``ConversationState`` of every turn (split into content-addressed snapshots,
so library entries and history entries are written once), per-turn envelope manifests
(typed segments and hashes, never rendered text), the attachments of each turn, and
memo tables for summaries and token counts. Saving a turn is one transaction. The SQL
backends (``sqlite``, ``postgres``) share their rules in ``sql``; ``open_store`` picks one.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import attrs
import xxhash

from lamina.pipeline._conversation.conversation import Conversation, ConversationState
from lamina.pipeline._errors import (
    ConversationError,
    LaminaError,
    StoreError,
)
from lamina.pipeline._hashing import content_hash as _content_hash
from lamina.pipeline._model.artifacts import AttachmentSpec, TurnWarning
from lamina.pipeline._model.envelope import (
    Batch,
    BuildReport,
    DecisionAction,
    Envelope,
    Form,
    Layer,
    LayerName,
    Segment,
)
from lamina.pipeline._model.history import Head
from lamina.pipeline._model.kinds import AttachmentKinds, NoKinds
from lamina.pipeline._model.library import LibraryEntry
from lamina.pipeline._views.summarize import SummaryBacking, SummaryKey, SummaryResult
from lamina.pipeline._views.views import full_view, reference_view

__all__ = [
    "BATCH_NOT_REBUILT",
    "SCHEMA_VERSION",
    "AttachmentRecord",
    "ConversationInfo",
    "Head",
    "LayerManifest",
    "Manifest",
    "SegmentManifest",
    "Store",
    "TurnRecord",
    "attachment_record",
    "back_summaries",
    "canonical",
    "digest",
    "head_hash",
    "load_conversation",
    "new_conversation_id",
    "now_stamp",
    "rebuild_envelope",
    "rebuild_envelopes",
    "save_turn",
    "stateless_turn",
    "turn_record",
]

SCHEMA_VERSION = 3



def new_conversation_id() -> str:
    """A fresh random id (only ever used at the edge, never inside anything hashed)."""
    return uuid.uuid4().hex


def now_stamp() -> str:
    """The wall-clock time for humans (UTC, ISO 8601); never hashed or rendered."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# --- records ---------------------------------------------------------------------------


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
    # The hash of the request the envelope is sent as when the library's growth is
    # deferred (``Envelope.batch``); "" when it is sent as built (and in older rows).
    batch_hash: str = ""

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
        batch = "" if envelope.batch is None else _batch_hash(envelope.batch)
        return cls(envelope.turn, envelope.prefix_hash, layers, envelope.report, batch)


def _batch_hash(b: Batch) -> str:
    """The hash of the request a batch sends (``Manifest.batch_hash``)."""
    return _content_hash(
        (b.settled, b.system_hash, b.library_hash, b.library_tokens, b.tokens, b.reason,
         [s.content_hash for s in (*b.turns, b.user)])
    )  # fmt: skip


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
        """The stored head (one row read; for warm workers); ``Head()`` before any turn."""
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


# --- content addresses (shared by every backend) ---------------------------------------


def canonical(value: Any) -> bytes:
    """The canonical JSON bytes of a value (sorted keys; lone surrogates kept)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    )


def digest(body: bytes) -> str:
    return str(xxhash.xxh3_128_hexdigest(body))


def head_hash(state_hash: str, parts: Mapping[str, Sequence[str]]) -> str:
    """The hash of a whole saved state: its snapshot and its parts' entry hashes in order."""
    return digest(canonical({"state": state_hash, "parts": {p: list(parts[p]) for p in parts}}))


# --- conversation helpers ----------------------------------------------------------------

Attachment = AttachmentSpec | Mapping[str, Any]

def attachment_record(
    spec: Attachment, conversation: Conversation | None = None
) -> AttachmentRecord:
    """How a transcript lists an attachment: kind, a label and its script form.

    The kind's processor (through ``conversation``'s sources) writes the spec back as its
    script form and names it: a path, URL, tag or video, a selection's artifact key. A
    spec of a kind nobody registered keeps its description and no script form.
    """
    return _record(spec, conversation.sources.kinds if conversation is not None else NoKinds())


def _record(spec: Attachment, kinds: AttachmentKinds) -> AttachmentRecord:
    if isinstance(spec, Mapping):
        form: dict[str, Any] | None = dict(spec)
        kind = kinds.kind_of(spec)
    else:
        kind = spec.kind
        form = kinds.script_form(spec)
    if form is None:
        text = spec.describe()  # type: ignore[union-attr]
        return AttachmentRecord(kind, text.removeprefix(f"{kind} "), "", True)
    label = kinds.label(kind, form)
    return AttachmentRecord(kind, label, canonical(form).decode("utf-8", "surrogatepass"), True)


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
    kinds = conversation.sources.kinds if attach else NoKinds()  # the vault listed once
    return TurnRecord(
        turn=last.turn,
        user=last.user,
        reply=last.assistant,
        attachments=tuple(
            a if isinstance(a, AttachmentRecord) else _record(a, kinds) for a in attach
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
    if head.turn and conversation.cache_meter is not None:
        # The next turn's ``cache`` compares with the request this turn sent, rebuilt as
        # it was sent when the figure is first read (None, "previous-not-rebuilt", when it
        # cannot be told, or the store was closed by then).
        def previous() -> Envelope | None:
            try:
                return rebuild_envelope(store, conversation_id, head.turn, as_sent=True, **restore)
            except StoreError:
                return None

        conversation._sent = previous
    return conversation


def stateless_turn(
    store: Store,
    conversation_id: str,
    text: str,
    attach: Sequence[Attachment] = (),
    *,
    start: Conversation | None = None,
    vault_changes: Mapping[str, str] | None = None,
    tools: Sequence[AttachmentSpec] = (),
    **restore: Any,
) -> tuple[Conversation, Envelope]:
    """One request of a server that keeps nothing between requests: load the stored state,
    build the turn and save it (state, manifest, attachments) in one call.

    ``restore`` takes ``load_conversation``'s options (sources=, renderer=, budget=, ...);
    ``start`` is the conversation a request begins from when nothing is saved yet (its
    settings: system prompt, budget, tokenizer). The returned conversation continues from
    the saved turn: ``reply()`` then ``save_turn`` adds the answer. A concurrent writer
    makes the save raise ``ConflictError`` and nothing is saved.
    """
    if store.head(conversation_id).turn == 0:
        if start is None:
            raise ConversationError(
                f"conversation {conversation_id!r} has no saved turn: pass start= "
                "(a new Conversation with its settings) for its first request"
            )
        conversation = back_summaries(start, store)
        conversation.saved_head = Head()
    else:
        conversation = load_conversation(store, conversation_id, **restore)
    # The save reads the promoted library at once: made here, not handed to a thread.
    envelope = conversation.turn(
        text, attach, vault_changes=vault_changes, tools=tools, background=False
    )
    save_turn(store, conversation_id, conversation, envelope, attach)
    return conversation, envelope


_Known = dict[tuple[str, str, str, int], Segment]
"""Rendered segments by key, form, content hash and tokens (what a stored manifest names)."""


def rebuild_envelope(
    store: Store,
    conversation_id: str,
    turn: int | None = None,
    *,
    as_sent: bool = False,
    **restore: Any,
) -> Envelope | None:
    """Turn ``turn``'s envelope (default: the last) built again from the turn before it.

    A resumed chat needs the previous request to report what the cache kept; the store
    holds manifests, not texts, so the turn is replayed and checked against its manifest.
    None when it cannot be replayed identically (a note changed on disk, a spec not kept).

    ``as_sent``: a turn not replayed identically (one an older Lamina saved, whose stored
    report or budget this version makes otherwise) is told from its stored manifest as
    ``rebuild_envelopes`` tells it, its layers byte for byte as sent; first from this
    turn's replay and the stored libraries, else from every turn's before it. Still None
    when a layer cannot be told, or the turn was a deferred request this version does not
    rebuild (``BATCH_NOT_REBUILT``): what it sent is then not known.
    """
    k = turn if turn is not None else len(store.turns(conversation_id))
    if as_sent:
        told = _tell(store, conversation_id, k, restore, {})
        if told is None and k > 1:  # a segment only an earlier turn rendered
            known: _Known = {}
            for t in range(1, k + 1):
                told = _tell(store, conversation_id, t, restore, known)
        return None if told is None or BATCH_NOT_REBUILT in told.report.warnings else told
    replay = _replay(store, conversation_id, k, restore)
    envelope = None if replay is None else replay.envelope
    if envelope is None:
        return None
    return envelope if Manifest.of(envelope) == store.manifest(conversation_id, k) else None


def rebuild_envelopes(
    store: Store, conversation_id: str, **restore: Any
) -> tuple[Envelope | None, ...]:
    """Every turn's envelope as it was sent, rebuilt turn by turn (None: a turn that
    cannot be told), for a report of a whole saved chat.

    A turn this Lamina replays identically is ``rebuild_envelope``'s. A turn an older
    Lamina saved may not be: its stored report lacks what this version records, or this
    version's budget decides the turn otherwise. Its envelope is then made of the stored
    manifest, each segment's text taken from what the replays so far rendered or the
    stored library holds (same key, form, content hash and tokens), and kept only if
    each layer's text hashes to the stored layer's hash: the layers are byte for byte
    what was sent (the framing around them, such as the library heading, is this
    version's). It carries the stored report: the decisions made when it was sent. An
    item those decisions say was pinned or re-sent beside its library entry is rendered
    as that stage marked it (``_resent``); a deferred request this version batches
    otherwise is shown as built (``_as_sent``, ``BATCH_NOT_REBUILT``).
    """
    known: _Known = {}
    return tuple(
        _tell(store, conversation_id, k, restore, known)
        for k in range(1, len(store.turns(conversation_id)) + 1)
    )


def _tell(
    store: Store, conversation_id: str, k: int, restore: Mapping[str, Any], known: _Known
) -> Envelope | None:
    """Turn ``k``'s envelope as it was sent (``rebuild_envelopes``' rule); ``known`` holds
    the segments told so far and learns this turn's."""

    def learn(segments: Iterable[Segment]) -> None:
        # The latest wins: two renders of one key, form and size may differ in a mark
        # (``library="summary"`` or ``"reference"``), and this turn's is likeliest.
        for seg in segments:
            known[(seg.key, str(seg.form), seg.content_hash, seg.tokens)] = seg

    replay = _replay(store, conversation_id, k, restore)
    envelope = None if replay is None else replay.envelope
    stored = store.manifest(conversation_id, k)
    if envelope is not None and Manifest.of(envelope) == stored:
        learn(s for layer in envelope.layers for s in layer.segments)
        return envelope
    before: dict[str, LibraryEntry] = {}
    for t in (k - 1, k):
        if t >= 1:
            library = store.load(conversation_id, t).library
            learn(Segment.of_view(e.view, e.text, e.tokens) for e in library)
            if t == k - 1:
                before = {e.key: e for e in library}
    if envelope is not None:
        learn(s for layer in envelope.layers for s in layer.segments)
    if replay is not None and stored is not None:  # what the stored decisions name
        learn(_resent(replay, stored.report, before))
    return None if stored is None else _as_sent(stored, known, envelope)


BATCH_NOT_REBUILT = TurnWarning(
    "batch-not-rebuilt",
    "",
    "sent as a deferred request (the library's growth waiting for a prefix break) that "
    "this Lamina does not rebuild: shown as built, its layers as they were sent",
)
"""The warning on a stored turn told as built because its deferred request is not known."""


def _as_sent(
    stored: Manifest, known: Mapping[tuple[str, str, str, int], Segment], replay: Envelope | None
) -> Envelope | None:
    """The envelope ``stored`` describes, of the ``known`` segments, with the stored report;
    None if a segment is not known or a layer's text does not hash to the stored hash.

    A turn sent as a batch (the library's growth deferred) takes the ``replay``'s batch if
    its hash is the stored one. The manifest holds the batch's request only as that hash,
    so where this version batches the turn otherwise the envelope is the turn as built,
    its layers as sent, and its report says so (a ``batch-not-rebuilt`` warning)."""
    batch = None if replay is None else replay.batch
    report = stored.report
    if stored.batch_hash and (batch is None or _batch_hash(batch) != stored.batch_hash):
        batch = None
        report = attrs.evolve(report, warnings=(*report.warnings, BATCH_NOT_REBUILT))
    layers: list[Layer] = []
    for layer in stored.layers:
        segments = []
        for s in layer.segments:
            seg = known.get((s.key, str(s.form), s.content_hash, s.tokens))
            if seg is None:
                return None
            segments.append(attrs.evolve(seg, title=s.title, locator=s.locator, role=s.role))
        made = Layer(LayerName(layer.name), tuple(segments), layer.tokens)
        if made.hash != layer.hash:
            return None
        layers.append(made)
    l1, l2, l3, l4, l5 = layers
    return Envelope(stored.turn, (l1, l2, l3, l4, l5), report, batch=batch)


@attrs.frozen
class _Replay:
    """A stored turn built again: the conversation after it, the turn's attachment forms
    and its envelope (None when the build failed)."""

    conversation: Conversation
    forms: tuple[Any, ...]
    envelope: Envelope | None


def _replay(
    store: Store, conversation_id: str, k: int, restore: Mapping[str, Any]
) -> _Replay | None:
    """Turn ``k`` built again from the turn before it (unchecked); None when it cannot
    be (no such turn, a spec not kept)."""
    records = store.turns(conversation_id)
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
        options.setdefault("defer_library", after.defer_library)
        conv = Conversation(system, tokenizer=after.tokenizer, policy=after.policy, **options)
    back_summaries(conv, store)
    earlier = dict(before.vault_changes)
    changes = {p: t for p, t in after.vault_changes if earlier.get(p) != t}
    given = tuple(f for f in forms if f is not None)
    try:
        envelope: Envelope | None = conv.turn(record.user, given, vault_changes=changes)
    except LaminaError:
        envelope = None
    return _Replay(conv, given, envelope)


def _resent(
    replay: _Replay, report: BuildReport, before: Mapping[str, LibraryEntry]
) -> list[Segment]:
    """This turn's items as the reference stage may have sent them: a plain reference to
    the library, and those the stored ``report`` says were sent in full beside their
    library entry, marked a pinned change ``newer`` or a re-sent one with its entry's form
    (``library``, from the library before the turn). A newer budget may send such an item
    otherwise, so no replay holds these texts."""
    actions = {
        d.target: d.action
        for d in report.decisions
        if d.action in (DecisionAction.PINNED, DecisionAction.RESENT)
    }
    conv = replay.conversation
    found: list[Segment] = []
    for form in replay.forms:
        try:
            artifacts = conv.process(form).artifacts
        except LaminaError:
            continue
        for artifact in artifacts:
            action, entry = actions.get(artifact.key), before.get(artifact.key)
            views = [reference_view(artifact)] if artifact.key in before else []
            if action is DecisionAction.PINNED:
                views.append(full_view(artifact, (("newer", "true"),)))
            elif action is DecisionAction.RESENT and entry is not None:
                views.append(full_view(artifact, (("library", str(entry.view.form)),)))
            for view in views:
                try:
                    text = conv.renderer.render(view)
                except LaminaError:
                    continue
                found.append(Segment.of_view(view, text, conv.counter.count(text)))
    return found
