"""The L2 library: one entry per key, first-seen order, append-mostly."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import attrs
import xxhash

from lamina.pipeline._errors import ArgumentError
from lamina.pipeline._hashing import feed, hash_joined
from lamina.pipeline._model.envelope import (
    BLOCK_SEP,
    Form,
    Layer,
    LayerName,
    Segment,
    View,
    library_parts,
)
from lamina.pipeline._tokens.counter import TokenCounter, starts_piece

__all__ = ["Library", "LibraryEntry", "LibraryPrefix"]


@attrs.frozen
class LibraryEntry:
    """An artifact as L2 carries it: its carry-forward view and that view's text.

    ``whole`` is the view the entry was promoted with, kept once a budget cut it (None
    while it is in that form), so a later turn with room can give it back (a cut is a
    state, not a fate)."""

    view: View
    text: str
    tokens: int
    turn: int
    full_tokens: int = 0
    """Tokens of the artifact's full block when it entered the library (0: not known), so
    an index line can give the size in full of an entry cut to a stub."""
    whole: View | None = None
    folded: tuple[LibraryEntry, ...] = ()
    """On a library index (stubs collapsed past their share): the entries it lists, each
    with its ``whole`` form, so a later turn with room can unfold them again."""

    @property
    def key(self) -> str:
        return self.view.key

    @property
    def content_hash(self) -> str:
        return self.view.content_hash

    @property
    def form(self) -> Form:
        return self.view.form

    @property
    def whole_view(self) -> View:
        """The view the entry was promoted with: ``whole`` once a budget cut it, else its
        view (what a restore gives back)."""
        return self.view if self.whole is None else self.whole

    @property
    def cut(self) -> bool:
        """Whether a budget cut this entry below the form it was promoted with."""
        return self.whole is not None

    def segment(self) -> Segment:
        return Segment.of_view(self.view, self.text, self.tokens)


@attrs.define
class _System:
    """A system message text (L1 blocks, the library heading, L2) and its running hash."""

    head: tuple[str, ...]
    text: str
    hasher: xxhash.xxh3_128
    # Entries appended since ``text`` was made: joined on first use, so a library whose
    # next turn replaces an entry never copies the text for nothing.
    pending: tuple[str, ...] = ()


@attrs.define
class _Rendered:
    """The L2 layer of a library, kept so that appending extends it instead of redoing it."""

    layer: Layer
    hasher: xxhash.xxh3_128
    counter_name: str
    system: _System | None = None


@attrs.frozen
class Library:
    """Immutable, ordered entries; ``append`` and ``replace`` return new libraries.

    A plain value: its rendered layer and system message are kept, between turns, by the
    conversation's ``LibraryPrefix``, not in here.
    """

    entries: tuple[LibraryEntry, ...] = ()
    _index: dict[str, int] = attrs.field(
        init=False,
        repr=False,
        eq=False,
        default=attrs.Factory(lambda self: _index_of(self.entries), takes_self=True),
    )

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def __iter__(self) -> Iterator[LibraryEntry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key: str) -> LibraryEntry | None:
        i = self._index.get(key)
        return None if i is None else self.entries[i]

    def keys(self) -> tuple[str, ...]:
        return tuple(e.key for e in self.entries)

    def append(self, entry: LibraryEntry) -> Library:
        """A library with ``entry`` last."""
        if entry.key in self._index:
            raise ArgumentError("entry", f"{entry.key} is already in the library")
        return Library((*self.entries, entry))

    def extend(self, entries: Sequence[LibraryEntry]) -> Library:
        """A library with ``entries`` last, in order: ``append`` one by one, whose index is
        made once (appending 1,600 entries one at a time rebuilt it 1,600 times)."""
        index = dict(self._index)
        for entry in entries:
            if entry.key in index:
                raise ArgumentError("entry", f"{entry.key} is already in the library")
            index[entry.key] = len(index)
        out = Library.__new__(Library)
        object.__setattr__(out, "entries", (*self.entries, *entries))
        object.__setattr__(out, "_index", index)
        return out

    def unfold(self, key: str, entries: Sequence[LibraryEntry]) -> Library:
        """The entry ``key`` replaced in place by ``entries`` (an index unfolded)."""
        i = self._index[key]
        return Library((*self.entries[:i], *entries, *self.entries[i + 1 :]))

    def replace(self, entry: LibraryEntry) -> Library:
        """Replace the entry with the same key in place (its position is kept)."""
        i = self._index[entry.key]
        out = Library.__new__(Library)
        # Same keys at the same positions: the index is shared, not rebuilt (a budget cut
        # replaces entries one by one in libraries of thousands).
        object.__setattr__(out, "entries", (*self.entries[:i], entry, *self.entries[i + 1 :]))
        object.__setattr__(out, "_index", self._index)
        return out

    def layer(self, counter: TokenCounter) -> Layer:
        """The L2 layer (segments, text, hash, exact tokens), made afresh; a conversation
        gets it from its ``LibraryPrefix``, which extends the last one instead."""
        return LibraryPrefix().layer(self, counter)


def _index_of(entries: tuple[LibraryEntry, ...]) -> dict[str, int]:
    index = {e.key: i for i, e in enumerate(entries)}
    if len(index) != len(entries):
        raise ArgumentError("entries", "a library holds one entry per key")
    return index


@attrs.define
class LibraryPrefix:
    """A conversation's rendered L2 layer and system message (text, xxh3 state, exact
    count), kept between turns so the next library extends them instead of redoing them.

    Mutable on purpose, one per conversation (``TurnContext.prefix``). Every answer is for
    the library asked about: one that extends the kept entries is appended to them, one with
    the same length is corrected by the blocks that differ (the budget's cuts), any other is
    rendered afresh; so a prefix shared or out of date is slower, never wrong.
    """

    _entries: tuple[LibraryEntry, ...] = ()
    _rendered: _Rendered | None = None

    def _kept(self, counter: TokenCounter) -> _Rendered | None:
        done = self._rendered
        return done if done is not None and done.counter_name == counter.name else None

    def _extends(self, library: Library) -> bool:
        n = len(self._entries)
        return len(library.entries) >= n and library.entries[:n] == self._entries

    def layer(self, library: Library, counter: TokenCounter) -> Layer:
        """The L2 layer of ``library`` (segments, hash, exact tokens; text on first use)."""
        done = self._kept(counter)
        if done is not None and self._extends(library):
            done = _extend_many(done, library.entries[len(self._entries) :], counter)
        else:
            segments, tokens = self.measure(library, counter)
            hasher = hash_joined(xxhash.xxh3_128(), (s.text for s in segments), BLOCK_SEP)
            # The joined text is left out (Layer.text): the system message has it.
            layer = Layer(LayerName.L2, segments, tokens, None, hasher.hexdigest())
            done = _Rendered(layer, hasher, counter.name)
        self._entries, self._rendered = library.entries, done
        return done.layer

    def measure(self, library: Library, counter: TokenCounter) -> tuple[tuple[Segment, ...], int]:
        """The L2 segments of ``library`` and their exact joined count, without making a
        text or hash when the kept layer can be corrected for the blocks that differ."""
        done = self._kept(counter)
        if done is not None and self._extends(library):
            layer = self.layer(library, counter)
            return layer.segments, layer.tokens
        if done is not None and len(library.entries) == len(self._entries):
            layer = done.layer
            found: _Measured | None = _Measured(
                layer.segments, layer.tokens, counter.name, _all_additive(layer)
            )
            for i, (old, new) in enumerate(zip(self._entries, library.entries, strict=True)):
                if found is not None and old is not new and old != new:
                    found = _replaced(found, i, new, counter)
            if found is not None:
                return found.segments, found.tokens
        segments = tuple(e.segment() for e in library.entries)
        return segments, counter.count_joined([s.text for s in segments])

    def system_text(
        self, library: Library, counter: TokenCounter, head: tuple[str, ...]
    ) -> tuple[str, str]:
        """The system message text, ``head`` blocks (L1) then ``library``, and its hash.

        Kept with the rendered layer: an appended entry extends the hash and the text is
        extended on first use (one copy), so a warm turn does not join and hash it again.
        """
        self.layer(library, counter)
        done = self._rendered
        assert done is not None
        head = tuple(t for t in head if t)
        if done.system is None or done.system.head != head:
            text = BLOCK_SEP.join((*head, *library_parts(s.text for s in done.layer.segments)))
            hasher = xxhash.xxh3_128()
            feed(hasher, text)
            done.system = _System(head, text, hasher)
        system = done.system
        if system.pending:
            text = "".join((system.text, *(BLOCK_SEP + t for t in system.pending)))
            system = done.system = _System(head, text, system.hasher)
        return system.text, system.hasher.hexdigest()


@attrs.frozen
class _Measured:
    """An L2 layer's segments and exact joined count, without text or hash."""

    segments: tuple[Segment, ...]
    tokens: int
    counter_name: str
    additive: bool  # every block but the first starts a new piece (count_joined's rule)


def _all_additive(layer: Layer) -> bool:
    return all(starts_piece(s.text) for s in layer.segments[1:])


def _replaced(
    base: _Measured, i: int, entry: LibraryEntry, counter: TokenCounter
) -> _Measured | None:
    """``base`` with block ``i`` replaced by ``entry``: the count moves by the difference of
    the two blocks' contributions when the join stays additive; else None (count anew)."""
    old = base.segments[i]
    segments = (*base.segments[:i], entry.segment(), *base.segments[i + 1 :])
    if not (base.additive and old.text and entry.text and (i == 0 or starts_piece(entry.text))):
        return None
    if i == len(segments) - 1:
        tokens = base.tokens - counter.count(old.text) + counter.count(entry.text)
    else:
        tokens = base.tokens - counter.count_with_sep(old.text) + counter.count_with_sep(entry.text)
    return _Measured(segments, tokens, counter.name, True)


def _any_text(segments: Sequence[Segment]) -> bool:
    """Whether any of ``segments`` has text: a block after them follows a separator (an
    entry kept unsent has none, and the system message has no library heading yet)."""
    return any(s.text for s in segments)


def _feed_block(hasher: xxhash.xxh3_128, text: str, *, after: bool) -> None:
    """Feed one block as ``hash_joined`` joins them: none when empty, a separator first
    when a block stands ``after`` another."""
    if text:
        feed(hasher, BLOCK_SEP + text if after else text)


def _first(entry: LibraryEntry, counter: TokenCounter) -> _Rendered:
    """The layer of a library holding ``entry`` alone."""
    hasher = xxhash.xxh3_128()
    feed(hasher, entry.text)
    layer = Layer(LayerName.L2, (entry.segment(),), entry.tokens, entry.text, hasher.hexdigest())
    return _Rendered(layer, hasher, counter.name)


def _extend_many(
    done: _Rendered, entries: Sequence[LibraryEntry], counter: TokenCounter
) -> _Rendered:
    """``done`` with ``entries`` appended: the counts and hashes extended, with the
    segments, hashers and pending texts made once (a promotion appends 1,600 entries:
    one at a time copied the segments 1,600 times)."""
    if entries and not done.layer.segments:
        done, entries = _first(entries[0], counter), entries[1:]
    if not entries:
        return done
    segments = list(done.layer.segments)
    tokens = done.layer.tokens
    hasher = done.hasher.copy()
    started = after = _any_text(segments)
    for entry in entries:
        _feed_block(hasher, entry.text, after=after)
        after = after or bool(entry.text)
        last = segments[-1].text
        if not (last and starts_piece(entry.text) and (len(segments) == 1 or starts_piece(last))):
            tokens = counter.count_joined([s.text for s in segments] + [entry.text])
        else:
            tokens = tokens - counter.count(last) + counter.count_with_sep(last) + entry.tokens
        segments.append(entry.segment())
    layer = Layer(LayerName.L2, tuple(segments), tokens, None, hasher.hexdigest())
    # No library heading yet: the system message is made anew (its heading comes with the
    # first entry that has text).
    system = done.system if started else None
    texts = [e.text for e in entries if e.text]
    if system is not None and texts:
        system_hasher = system.hasher.copy()
        for text in texts:
            feed(system_hasher, BLOCK_SEP + text)
        system = _System(system.head, system.text, system_hasher, (*system.pending, *texts))
    return _Rendered(layer, hasher, counter.name, system)
