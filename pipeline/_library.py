"""The L2 library: one entry per key, first-seen order, append-mostly."""

from __future__ import annotations

from collections.abc import Iterator

import attrs

from pipeline._envelope import Form, View

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


@attrs.frozen
class Library:
    """Immutable, ordered entries; ``append`` and ``replace`` return new libraries."""

    entries: tuple[LibraryEntry, ...] = ()
    _index: dict[str, int] = attrs.field(init=False, repr=False, eq=False)

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

    def append(self, entry: LibraryEntry) -> Library:
        if entry.key in self._index:
            raise ValueError(f"{entry.key} is already in the library")
        return Library((*self.entries, entry))

    def replace(self, entry: LibraryEntry) -> Library:
        """Replace the entry with the same key in place (its position is kept)."""
        i = self._index[entry.key]
        return Library((*self.entries[:i], entry, *self.entries[i + 1 :]))
