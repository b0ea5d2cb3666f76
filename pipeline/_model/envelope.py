"""The envelope: five typed layers of segments, their hashes, and the message texts."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import attrs

from lamina.pipeline._hashing import joined_hash, text_hash
from lamina.pipeline._model.artifacts import TurnWarning

__all__ = [
    "LIBRARY_HEADING",
    "NOT_SENT",
    "NOT_SENT_INTRO",
    "QUERY_LABEL",
    "REFERENCES_INTRO",
    "Batch",
    "Blocks",
    "BudgetReport",
    "BuildReport",
    "CachedPrefix",
    "Decision",
    "DecisionAction",
    "DecisionForm",
    "DecisionLayer",
    "Envelope",
    "Form",
    "Layer",
    "LayerName",
    "Segment",
    "View",
    "arrange_user",
    "join_blocks",
    "library_parts",
]

LIBRARY_HEADING = (
    "# Context Library\n"
    "Context the user attached in earlier turns, one entry per key, oldest first. "
    'Entries marked form="preview" or form="excerpt" are shortened, form="summary" holds '
    'selected sentences only, and an entry marked evicted="true" or a line of an index '
    "names an item whose text is not here: ask for an entry by its key or path to get its "
    "full text again. Blocks marked recalled in the user message are earlier context "
    "brought back for that message only."
)
REFERENCES_INTRO = (
    "Context attached to this message (find it in the Context Library in the system prompt):"
)
NOT_SENT_INTRO = (
    "Also attached to this message but not sent for lack of room "
    "(ask for one by its key or path and the host can send it in a later turn):"
)
# The mark of a reference to an item that was not sent and is not in the library.
NOT_SENT = "not-sent"
QUERY_LABEL = "---\n[User query]:\n"
BLOCK_SEP = "\n\n"
# Source type of tool results (pipeline._model.tools): first in the user message, never in L1/L2.
TOOL_SOURCE = "tool"


class Form(enum.StrEnum):
    """How much of an artifact a segment shows."""

    FULL = "full"
    PREVIEW = "preview"
    SUMMARY = "summary"
    EXCERPT = "excerpt"
    REFERENCE = "reference"
    TEXT = "text"


class LayerName(enum.StrEnum):
    L1 = "L1"
    L2 = "L2"
    L3 = "L3"
    L4 = "L4"
    L5 = "L5"


@attrs.frozen
class View:
    """A typed view of an artifact in one form, before it is rendered to text."""

    key: str
    source_type: str
    form: Form
    title: str
    locator: str
    recoverable: bool
    content_hash: str
    attributes: tuple[tuple[str, str], ...] = ()
    body: str = ""
    marks: tuple[tuple[str, str], ...] = ()


@attrs.frozen
class Segment:
    """One block of a layer: identity, form, content hash, rendered text and its tokens."""

    key: str
    form: Form
    source_type: str
    content_hash: str
    text: str
    tokens: int
    title: str = ""
    locator: str = ""
    recoverable: bool = True
    role: str = ""
    # The view's extra XML attributes (e.g. ``path``), so a layout can re-render the
    # segment as a reference without its artifact.
    attributes: tuple[tuple[str, str], ...] = ()
    # A reference to an item neither sent nor in the library (marked ``NOT_SENT``).
    unsent: bool = False

    @classmethod
    def of_view(cls, view: View, text: str, tokens: int) -> Segment:
        """The segment of a context view, given its rendered text and that text's tokens."""
        return cls(
            key=view.key,
            form=view.form,
            source_type=view.source_type,
            content_hash=view.content_hash,
            text=text,
            tokens=tokens,
            title=view.title,
            locator=view.locator,
            recoverable=view.recoverable,
            attributes=view.attributes,
            unsent=any(name == NOT_SENT for name, _ in view.marks),
        )


def join_blocks(texts: Iterable[str]) -> str:
    """Blocks joined by a blank line, empty ones skipped (the one layout rule)."""
    return BLOCK_SEP.join(t for t in texts if t)


@attrs.frozen
class Layer:
    """One of the five layers: its segments, joined text, hash and exact token count."""

    name: LayerName
    segments: tuple[Segment, ...]
    tokens: int
    # A caller that keeps the hash incrementally (the L2 library) leaves the joined text out:
    # a warm turn then never copies the whole library unless someone reads ``text``.
    _text: str | None = attrs.field(default=None, alias="text", eq=False, repr=False)
    hash: str = attrs.field(
        default=attrs.Factory(
            lambda self: (
                text_hash(self._text)
                if self._text is not None
                else joined_hash((s.text for s in self.segments), BLOCK_SEP)
            ),
            takes_self=True,
        )
    )

    @property
    def text(self) -> str:
        """The segments' texts joined by a blank line (the bytes the hash is over); joined on
        each use when the layer was made without it (nothing is stored in the frozen value)."""
        return join_blocks(s.text for s in self.segments) if self._text is None else self._text

    def keys(self) -> tuple[str, ...]:
        return tuple(s.key for s in self.segments)

    def get(self, key: str) -> Segment | None:
        return next((s for s in self.segments if s.key == key), None)


class DecisionAction(enum.StrEnum):
    """What a decision did, from a closed set: code matches on it; the reason is for people."""

    PINNED = "pinned"
    """Changed content sent in full beside its L2 entry, which stays as it was."""
    REFRESHED = "refreshed"
    """Changed content replaced its L2 entry in place."""
    REFERENCED = "referenced"
    """Sent as a reference to what L2 already holds."""
    RESENT = "resent"
    """Sent in full again: L2 holds only a shortened form."""
    OVERLAPPING = "overlapping"
    """A retrieval chunk sent although its source is in L2 (shortened or with other text)."""
    DROPPED = "dropped"
    """Not sent: a duplicate, or already in this turn."""
    PAGES_CUT = "pages-cut"
    """Only the pages not sent before are sent."""
    SYSTEM_CHANGED = "system-changed"
    """The host changed the system prompt."""
    RESTORED = "restored"
    """L1's mutable part sent whole again after a turn's budget had shortened it."""
    HISTORY_CUT = "history-cut"
    """The oldest history turns dropped (the cut point moved)."""
    SHORTENED = "shortened"
    """An old long reply shortened."""
    COMPACTED = "compacted"
    """A shorter recoverable form (preview, summary, or a smaller preview)."""
    EVICTED = "evicted"
    """A library entry reduced to a stub that keeps key, title and locator."""
    NOT_SENT = "not-sent"
    """This turn's item sent as a reference saying it was not sent for lack of room."""
    EXCERPTED = "excerpted"
    """A non-recoverable text cut to a marked head-and-tail excerpt."""
    INDEXED = "indexed"
    """A folder or tag group collapsed into one index."""
    STUBBED = "stubbed"
    """A tool result in an agent loop stubbed (name and arguments kept)."""
    RECALLED = "recalled"
    """Dropped history or a cut library entry sent again in this turn's user message, as
    a turn-scoped block, because the query matches it."""
    HANDOFF = "handoff"
    """An agent loop went on with another agent's instructions (a handoff): L1's mutable
    part is the new agent's from that request of the turn on."""
    INSTRUCTIONS_CHANGED = "instructions-changed"
    """The instructions a framework sends itself beside Lamina's system message (pydantic-ai's
    ``@agent.instructions``) differ from the previous request's: the prefix breaks after
    the system message, though the envelope is unchanged."""


class DecisionForm(enum.StrEnum):
    """A decision's before and after: the view forms (``Form``) and what only a cut makes."""

    FULL = "full"
    PREVIEW = "preview"
    SUMMARY = "summary"
    EXCERPT = "excerpt"
    REFERENCE = "reference"
    TEXT = "text"
    DROPPED = "dropped"
    CUT = "cut"
    EVICTED = "evicted"
    ITEMS = "items"
    INDEX = "index"
    STUB = "stub"


class DecisionLayer(enum.StrEnum):
    """Where a decision acts: a layer of the envelope, or an agent loop's steps."""

    L1 = "L1"
    L2 = "L2"
    L3 = "L3"
    L4 = "L4"
    L5 = "L5"
    LOOP = "loop"


@attrs.frozen
class Decision:
    """One recorded choice about an artifact or history turn (form before -> after).

    ``action`` says what was done, for code; ``reason`` says why, for people: no reader
    parses it. Forms and layers are converted to their closed enums when built."""

    stage: str
    target: str
    from_form: DecisionForm = attrs.field(converter=DecisionForm)
    to_form: DecisionForm = attrs.field(converter=DecisionForm)
    reason: str
    tokens_saved: int = 0
    layer: DecisionLayer = attrs.field(default=DecisionLayer.L3, converter=DecisionLayer)
    action: DecisionAction = attrs.field(kw_only=True, converter=DecisionAction)


@attrs.frozen
class BudgetReport:
    """How the whole payload was fitted: window, reserve, use, headroom and the cuts."""

    window: int
    reserve_output: int
    limit: int
    used: int
    effective: int
    before: tuple[tuple[str, int], ...]
    after: tuple[tuple[str, int], ...]
    decisions: tuple[Decision, ...] = ()
    # The budget's plan (shares, floors, slack, restores) as (name, value) pairs, with the
    # floors in tokens for this limit: how the window was to be shared.
    plan: tuple[tuple[str, str], ...] = ()
    # The request as sent (``Envelope.as_sent``: a batched request's deferred context
    # included), in the budget's count; ``used`` is the envelope as built, which the
    # fitting reads. None where the conversation did not count what it sent.
    sent: int | None = None

    @property
    def headroom(self) -> int:
        return self.limit - self.effective


@attrs.frozen
class BuildReport:
    """What a build did: attached keys, decisions, warnings, counters and the budget."""

    turn: int
    attached: tuple[str, ...] = ()
    decisions: tuple[Decision, ...] = ()
    warnings: tuple[TurnWarning, ...] = ()
    stats: tuple[tuple[str, int], ...] = ()
    budget: BudgetReport | None = None
    # Measurements, not results: they differ between runs, so they take no part in equality
    # and appear in the JSON trace only when asked for (``--timings``).
    timings: tuple[tuple[str, float], ...] = attrs.field(default=(), eq=False)
    meters: tuple[tuple[str, int], ...] = attrs.field(default=(), eq=False)

    def stat(self, name: str) -> int:
        return dict(self.stats).get(name, 0)


@attrs.frozen
class Batch:
    """The request an envelope is sent as while the library's growth waits for the next
    prefix break (``Conversation(defer_library=True)``).

    The system message holds L1 and the first ``settled`` L2 entries (the library the last
    settled request held: between breaks L2 only grows by appending, so they are a prefix
    of it, ``library_tokens`` their exact joined count); the history carries each deferred
    turn's user message as it was sent (``turns``: its context included, keyed as the L4
    segment it stands for); the user message is ``user``: this turn's context as
    append-only sends it (full blocks the first time, references to what was sent earlier
    or sits in the settled library) and the query. So each request extends the one before
    it byte for byte. ``tokens`` is the request's exact count as the conversation counts it;
    ``reason`` says why this request settled (the envelope as built; ``turns`` empty), ""
    when it extends the one before."""

    settled: int
    library_tokens: int
    turns: tuple[Segment, ...]
    user: Segment
    tokens: int
    reason: str = ""
    # The settled system message's hash and its L2 entries' (the layer hash), and the
    # message itself: derived from L1 and the settled entries, kept so that rendering and
    # counting the request never join or hash the library again.
    system_hash: str = ""
    library_hash: str = ""
    system: str = attrs.field(default="", eq=False, repr=False)
    # Cut library entries this request sends whole again in its user message (restore by
    # appending): the system message keeps their cut forms.
    restored: tuple[Segment, ...] = ()

    def as_built(self, entries: int) -> bool:
        """Whether the request is the envelope as built (``entries``: its L2 entries)."""
        return not self.turns and not self.restored and self.settled == entries


@attrs.frozen
class CachedPrefix:
    """How much of a request repeats the request before it byte for byte (what a
    provider's prompt cache can serve), both as sent: ``tokens`` of the request's
    ``total``, in the request's own count; ``reason`` the break's code
    (``docs/CACHE.md``; None when the request extends the one before) and ``sentence``
    what it means for people ("" when there is nothing to say)."""

    tokens: int
    total: int
    reason: str | None
    sentence: str = ""


@attrs.define(eq=False)
class _Later:
    """A ``CachedPrefix`` made on its first read, once: comparing a request with the one
    before renders and counts both, which a host that never reads ``Envelope.cache`` should
    not pay for. Two threads reading at once may both make it; the value is the same."""

    make: Callable[[], CachedPrefix] | None
    value: CachedPrefix | None = None

    def get(self) -> CachedPrefix:
        value = self.value
        if value is None:
            make = self.make
            if make is None:  # another thread made it (``value`` is set before ``make`` goes)
                value = self.value
            else:
                value = make()
                self.value, self.make = value, None
        assert value is not None
        return value


def _later(value: CachedPrefix | Callable[[], CachedPrefix] | _Later | None) -> (
    CachedPrefix | _Later | None
):
    return _Later(value) if callable(value) and not isinstance(value, _Later) else value


@attrs.frozen
class Envelope:
    """L1..L5 as typed segments, with the texts the request messages are made of.

    ``system_text`` (L1, then the library heading and L2) and ``user_text`` (references,
    new context, the query) are the only place message content is assembled, so hashes,
    token budgets and every provider request agree byte for byte.
    """

    turn: int
    layers: tuple[Layer, Layer, Layer, Layer, Layer]
    report: BuildReport
    # Derived from the layers; init fields only so that ``attrs.evolve`` (e.g. to add
    # timings to the report) copies them instead of assembling the texts again.
    system_text: str = attrs.field(
        default=attrs.Factory(
            lambda self: join_blocks(system_parts(self.layers[0], self.layers[1])), takes_self=True
        )
    )
    user_text: str = attrs.field(
        default=attrs.Factory(
            lambda self: join_blocks(user_parts(self.layers[2], self.layers[4])), takes_self=True
        )
    )
    prefix_hash: str = attrs.field(
        default=attrs.Factory(lambda self: text_hash(self.system_text), takes_self=True)
    )
    # How the request is sent when the library's growth is deferred (None: as built).
    batch: Batch | None = attrs.field(default=None, kw_only=True)
    # The cached prefix against the request before (``lamina.Conversation`` fills it in,
    # made when first read: ``cache``; None from the core's ``Conversation``, which renders
    # no request to compare). Given as the value or a function that makes it.
    _cache: CachedPrefix | _Later | None = attrs.field(
        default=None, kw_only=True, eq=False, repr=False, converter=_later, alias="cache"
    )

    @property
    def cache(self) -> CachedPrefix | None:
        """How much of this request repeats the one before, as sent (``CachedPrefix``)."""
        c = self._cache
        return c.get() if isinstance(c, _Later) else c

    def as_sent(self) -> Envelope:
        """The request as sent, as an envelope of its messages: L1 and the settled L2, no
        L3, L4 with each deferred turn's user message as it was sent, L5 the user message
        whole. The envelope itself when nothing is deferred. Every renderer and count of a
        single envelope starts from it, so what is counted is what is sent."""
        b = self.batch
        if b is None or b.as_built(len(self.l2.segments)):
            return self
        l2 = Layer(
            LayerName.L2, self.l2.segments[: b.settled], b.library_tokens, hash=b.library_hash
        )
        deferred = {s.key: s for s in b.turns}
        history = tuple(deferred.get(s.key, s) for s in self.l4.segments)
        l4 = Layer(LayerName.L4, history, sum(s.tokens for s in history))
        l3 = Layer(LayerName.L3, (), 0)
        l5 = Layer(LayerName.L5, (b.user,), b.user.tokens, hash=b.user.content_hash)
        layers = (self.l1, l2, l3, l4, l5)
        head = join_blocks(s.text for s in self.l1.segments)
        kept = b.system.startswith(head) and (
            len(b.system) == len(head)
            or b.system.startswith(BLOCK_SEP + LIBRARY_HEADING, len(head))
        )
        if not (kept and b.system_hash):  # L1 changed since the batch settled (a handoff)
            return Envelope(self.turn, layers, self.report, user_text=b.user.text, batch=None)
        return Envelope(self.turn, layers, self.report, b.system, b.user.text, b.system_hash)

    def layer(self, name: LayerName | str) -> Layer:
        return self.layers[int(str(name)[1]) - 1]

    @property
    def l1(self) -> Layer:
        return self.layers[0]

    @property
    def l2(self) -> Layer:
        return self.layers[1]

    @property
    def l3(self) -> Layer:
        return self.layers[2]

    @property
    def l4(self) -> Layer:
        return self.layers[3]

    @property
    def l5(self) -> Layer:
        return self.layers[4]

    @property
    def query(self) -> str:
        return join_blocks(s.text for s in self.l5.segments)

    def history(self) -> tuple[tuple[str, str], ...]:
        """L4 as (role, text) pairs, oldest first."""
        return tuple((s.role, s.text) for s in self.l4.segments)


class Blocks(Protocol):
    """Anything with a layer's segments: a ``Layer`` or a draft's measured layer."""

    @property
    def segments(self) -> tuple[Segment, ...]: ...


def library_parts(texts: Iterable[str]) -> list[str]:
    """The library's blocks in the system message: its heading, then its entries' texts;
    none without an entry that has text (an entry kept unsent has none)."""
    sent = [t for t in texts if t]
    return [LIBRARY_HEADING, *sent] if sent else []


def system_parts(l1: Blocks, l2: Blocks) -> list[str]:
    """The system message's blocks: L1 segments, then the library heading and L2 entries."""
    head = [s.text for s in l1.segments if s.text]
    return [*head, *library_parts(s.text for s in l2.segments)]


def user_parts(l3: Blocks, l5: Blocks) -> list[str]:
    """The user message's blocks: tool results, references, new context, the labelled query."""
    return [text for text, _ in user_blocks(l3, l5)]


def user_blocks(l3: Blocks, l5: Blocks) -> list[tuple[str, Segment | None]]:
    """``user_parts`` with the segment each block is the text of (None for the joined
    reference lists and a labelled query), so a measure can use the segments' counts."""
    tools = [(s.text, s) for s in l3.segments if s.source_type == TOOL_SOURCE]
    rest = [s for s in l3.segments if s.source_type != TOOL_SOURCE]
    refs = [s.text for s in rest if s.form is Form.REFERENCE and not s.unsent]
    unsent = [s.text for s in rest if s.form is Form.REFERENCE and s.unsent]
    full = [(s.text, s) for s in rest if s.form is not Form.REFERENCE]
    texts = [s for s in l5.segments if s.text]
    query = (join_blocks(s.text for s in l5.segments), texts[0] if len(texts) == 1 else None)
    return arrange_user(tools, refs, unsent, full, query)


UserBlock = tuple[str, "Segment | None"]


def arrange_user(
    tools: Sequence[UserBlock],
    refs: Sequence[str],
    unsent: Sequence[str],
    full: Sequence[UserBlock],
    query: UserBlock,
    *,
    refs_intro: str = REFERENCES_INTRO,
) -> list[UserBlock]:
    """The one order of a user message, whatever the layout: tool results, the references
    (under ``refs_intro``), what the budget did not send, the other context blocks in L3
    order (retrieval chunks among them), then the query, labelled when anything precedes it."""
    parts: list[UserBlock] = [*tools]
    if refs:
        parts.append((refs_intro + "\n" + "\n".join(refs), None))
    if unsent:
        parts.append((NOT_SENT_INTRO + "\n" + "\n".join(unsent), None))
    parts.extend(full)
    parts.append((QUERY_LABEL + query[0], None) if parts else query)
    return [(text, segment) for text, segment in parts if text]
