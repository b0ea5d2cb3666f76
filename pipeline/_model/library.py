"""The L2 library: one entry per key, first-seen order, append-mostly."""

from __future__ import annotations

from collections.abc import Iterator

import attrs
import xxhash

from pipeline._hashing import feed, hash_joined
from pipeline._model.envelope import (
    BLOCK_SEP,
    LIBRARY_HEADING,
    Form,
    Layer,
    LayerName,
    Segment,
    View,
)
from pipeline._tokens.counter import TokenCounter, starts_piece

__all__ = ["Library", "LibraryEntry"]


@attrs.frozen
class LibraryEntry:
    """An artifact as L2 carries it: its carry-forward view and that view's text."""

    view: View
    text: str
    tokens: int
    turn: int

    @property
    def key(self) -> str:
        return self.view.key

    @property
    def content_hash(self) -> str:
        return self.view.content_hash

    @property
    def form(self) -> Form:
        return self.view.form

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
    """Immutable, ordered entries; ``append`` and ``replace`` return new libraries."""

    entries: tuple[LibraryEntry, ...] = ()
    _index: dict[str, int] = attrs.field(init=False, repr=False, eq=False)
    _rendered: _Rendered | None = attrs.field(default=None, repr=False, eq=False, alias="_rendered")
    # After ``replace``: the segments and exact count, without the text or hash (the
    # budget stage re-measures after each cut; only the final envelope needs the hash).
    _measured: _Measured | None = attrs.field(default=None, repr=False, eq=False, alias="_measured")

    def __attrs_post_init__(self) -> None:
        index = {e.key: i for i, e in enumerate(self.entries)}
        if len(index) != len(self.entries):
            raise ValueError("a library holds one entry per key")
        object.__setattr__(self, "_index", index)

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

    def append(self, entry: LibraryEntry, counter: TokenCounter | None = None) -> Library:
        """A library with ``entry`` last; its L2 layer is extended when it was rendered."""
        if entry.key in self._index:
            raise ValueError(f"{entry.key} is already in the library")
        grown = Library((*self.entries, entry))
        done = self._rendered
        if done is not None and counter is not None and done.counter_name == counter.name:
            object.__setattr__(grown, "_rendered", _extend(done, entry, counter))
        return grown

    def replace(self, entry: LibraryEntry, counter: TokenCounter | None = None) -> Library:
        """Replace the entry with the same key in place (its position is kept).

        With ``counter``, the new library's count is the old one's, corrected for the one
        block (see ``measure``), instead of being counted over every entry again.
        """
        i = self._index[entry.key]
        changed = Library((*self.entries[:i], entry, *self.entries[i + 1 :]))
        base = self._base(counter) if counter is not None else None
        if base is not None and counter is not None:
            object.__setattr__(changed, "_measured", _replaced(base, i, entry, counter))
        return changed

    def measure(self, counter: TokenCounter) -> tuple[tuple[Segment, ...], int]:
        """The L2 segments and their exact joined count, without making the layer's text or
        hash when a ``replace`` carried the count forward."""
        base = self._base(counter)
        if base is None:
            layer = self.layer(counter)
            return layer.segments, layer.tokens
        return base.segments, base.tokens

    def _base(self, counter: TokenCounter) -> _Measured | None:
        done = self._rendered
        if done is not None and done.counter_name == counter.name:
            layer = done.layer
            return _Measured(layer.segments, layer.tokens, counter.name, _all_additive(layer))
        found = self._measured
        return found if found is not None and found.counter_name == counter.name else None

    def layer(self, counter: TokenCounter) -> Layer:
        """The L2 layer (segments, text, hash, exact tokens), computed once per library."""
        done = self._rendered
        if done is None or done.counter_name != counter.name:
            measured = self._measured
            if measured is not None and measured.counter_name == counter.name:
                segments, tokens = measured.segments, measured.tokens
            else:
                segments = tuple(e.segment() for e in self.entries)
                tokens = counter.count_joined([s.text for s in segments])
            hasher = hash_joined(xxhash.xxh3_128(), (s.text for s in segments), BLOCK_SEP)
            # The joined text is left to first use (Layer.text): the system message has it.
            layer = Layer(LayerName.L2, segments, tokens, None, hasher.hexdigest())
            done = _Rendered(layer, hasher, counter.name)
            object.__setattr__(self, "_rendered", done)
        return done.layer

    def system_text(self, counter: TokenCounter, head: tuple[str, ...]) -> tuple[str, str]:
        """The system message text, ``head`` blocks (L1) then the library, and its hash.

        Kept with the rendered layer; ``append`` extends the hash and the text is extended
        on first use (one copy), so a warm turn does not join and hash the library again.
        """
        self.layer(counter)
        done = self._rendered
        assert done is not None
        head = tuple(t for t in head if t)
        if done.system is None or done.system.head != head:
            blocks = [*head, LIBRARY_HEADING, *(s.text for s in done.layer.segments)]
            if not done.layer.segments:
                blocks = list(head)
            text = BLOCK_SEP.join(t for t in blocks if t)
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


def _extend_system(system: _System | None, entry: LibraryEntry) -> _System | None:
    if system is None or not entry.text:
        return system
    hasher = system.hasher.copy()
    feed(hasher, BLOCK_SEP + entry.text)
    return _System(system.head, system.text, hasher, (*system.pending, entry.text))


def _extend(done: _Rendered, entry: LibraryEntry, counter: TokenCounter) -> _Rendered:
    old = done.layer
    segment = entry.segment()
    if not old.segments:
        hasher = xxhash.xxh3_128()
        feed(hasher, entry.text)
        layer = Layer(LayerName.L2, (segment,), entry.tokens, entry.text, hasher.hexdigest())
        return _Rendered(layer, hasher, counter.name)
    hasher = done.hasher.copy()
    feed(hasher, BLOCK_SEP + entry.text)
    last = old.segments[-1].text
    if not (starts_piece(entry.text) and (len(old.segments) == 1 or starts_piece(last))):
        tokens = counter.count_joined([s.text for s in old.segments] + [entry.text])
    else:
        # count_joined's additive rule: only the old last block gains a separator.
        tokens = old.tokens - counter.count(last) + counter.count_with_sep(last) + entry.tokens
    # No text: the layer joins it on first use, so appending does not copy the library.
    layer = Layer(LayerName.L2, (*old.segments, segment), tokens, None, hasher.hexdigest())
    return _Rendered(layer, hasher, counter.name, _extend_system(done.system, entry))
