"""L4 kept between turns: the history's segments, their counts and the layer's running hash."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import xxhash

from lamina.pipeline._hashing import feed
from lamina.pipeline._model.envelope import BLOCK_SEP, Segment
from lamina.pipeline._model.history import HistoryEntry
from lamina.pipeline._tokens.counter import TokenCounter, starts_piece

__all__ = ["HistorySegments", "MakeSegment"]

MakeSegment = Callable[[int, str, str, int | None], Segment]
"""Renders and counts one history message: (turn, role, text, shortened to tokens or None)."""


@attrs.define
class _Made:
    """A history segment, the text it was made from (a reply before shortening) and, once
    asked for, the count of its text followed by a blank line."""

    source: str
    shortened_to: int | None
    segment: Segment
    with_sep: int | None = None


@attrs.define
class _Shown:
    """The last history shown: its entries (by identity), how they were shown, the segments."""

    entries: tuple[HistoryEntry, ...]
    how: tuple[object, ...]
    segments: tuple[Segment, ...]


@attrs.define
class HistorySegments:
    """A conversation's L4 kept between turns: segments by (turn, role), the last history
    shown, the running count and xxh3 of the last L4 text, so a warm turn renders, counts
    and hashes only the history entries that are new.

    Mutable on purpose, one per conversation (``TurnContext.l4``), like ``LibraryPrefix``: a
    segment is reused only when made from the same text, shortened the same way, by the
    same tokenizer, and a running count or hash only for a layer that extends the one it
    was made for (by identity); anything else is made afresh, so a stale or shared memo is
    slower, never wrong.
    """

    _counter: str = ""
    _made: dict[tuple[int, str], _Made] = attrs.field(factory=dict)
    _shown: _Shown | None = None
    _counted: tuple[Segment, ...] = ()
    _count_but_last: int | None = None
    _hashed: tuple[Segment, ...] = ()
    _hasher: xxhash.xxh3_128 | None = None

    def segments(
        self,
        counter: TokenCounter,
        history: tuple[HistoryEntry, ...],
        start: int,
        shortened: tuple[int, ...],
        limit: int,
        make: MakeSegment,
    ) -> tuple[Segment, ...]:
        """L4's segments: every message of the entries from turn ``start`` on, the replies of
        ``shortened`` turns cut to ``limit`` tokens; kept ones reused, the rest made."""
        if counter.name != self._counter:
            self._counter, self._made, self._shown = counter.name, {}, None
            self._counted, self._hashed, self._hasher = (), (), None
        how = (start, shortened, limit)
        last = self._shown
        out: list[Segment] = []
        done = 0
        if last is not None and last.how == how and _extends(last.entries, history):
            out, done = list(last.segments), len(last.entries)
        elif any(turn < start for turn, _ in self._made):
            self._made = {at: m for at, m in self._made.items() if at[0] >= start}
        for entry in history[done:]:
            if entry.turn < start:
                continue
            out.append(self._segment(entry.turn, "user", entry.user, None, make))
            if entry.assistant is not None:
                to = limit if entry.turn in shortened else None
                out.append(self._segment(entry.turn, "assistant", entry.assistant, to, make))
        self._shown = _Shown(history, how, tuple(out))
        return self._shown.segments

    def _segment(
        self, turn: int, role: str, source: str, shortened_to: int | None, make: MakeSegment
    ) -> Segment:
        made = self._made.get((turn, role))
        if made is not None and made.shortened_to == shortened_to and made.source == source:
            return made.segment
        segment = make(turn, role, source, shortened_to)
        self._made[(turn, role)] = _Made(source, shortened_to, segment)
        return segment

    def tokens(self, counter: TokenCounter, segments: Sequence[Segment]) -> int | None:
        """Exact count of the segments' texts joined by a blank line from their kept counts
        (each new piece after a newline, see ``joined_tokens``); None when unsure."""
        shown = tuple(s for s in segments if s.text)
        if not shown:
            return 0
        kept = self._counted
        if self._count_but_last is not None and kept and _extends(kept, shown):
            total: int | None = self._count_but_last
            done = len(kept) - 1
        else:
            total, done = 0, 0
        for i in range(done, len(shown) - 1):
            if total is None or not starts_piece(shown[i + 1].text):
                total = None
                break
            total += self._with_sep(counter, shown[i])
        self._counted, self._count_but_last = shown, total
        return None if total is None else total + shown[-1].tokens

    def _with_sep(self, counter: TokenCounter, segment: Segment) -> int:
        _, turn, role = segment.key.split(":")
        made = self._made.get((int(turn), role))
        if made is not None and made.segment is segment and made.with_sep is not None:
            return made.with_sep
        with_sep = counter.count_with_sep(segment.text, BLOCK_SEP)
        if made is not None and made.segment is segment:
            made.with_sep = with_sep
        return with_sep

    def layer_hash(self, segments: tuple[Segment, ...]) -> str:
        """xxh3-128 of the segments' texts joined by a blank line (``Layer.hash``), feeding
        only the segments after those hashed last time when the layer extends them."""
        shown = tuple(s for s in segments if s.text)
        kept = self._hashed
        if self._hasher is not None and kept and _extends(kept, shown):
            hasher, rest, first = self._hasher.copy(), shown[len(kept) :], False
        else:
            hasher, rest, first = xxhash.xxh3_128(), shown, True
        for segment in rest:
            if not first:
                feed(hasher, BLOCK_SEP)
            first = False
            feed(hasher, segment.text)
        if shown:
            self._hashed, self._hasher = shown, hasher.copy()
        return hasher.hexdigest()


def _extends(kept: tuple[object, ...], now: tuple[object, ...]) -> bool:
    """Whether ``now`` starts with ``kept`` (the same objects, in C: tuple equality tests
    identity first, and equal values are as good)."""
    return len(kept) <= len(now) and now[: len(kept)] == kept
