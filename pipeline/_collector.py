"""The cyclic garbage collector held off while a stage makes many small values.

A budget stage makes tens of thousands of immutable values (rungs, choices, placements)
that live through its rounds. Each counts towards the collector's thresholds, so the stage
set off full collections that walk the host's whole heap and free nothing: the values
hold no cycles and reference counting frees them (the 1,600-note folder turn at 32k: two
full collections, 110-130 ms of a 0.66 s turn; at 200k four, 260 ms of 1.3 s). ``paused``
holds the collector off for its block, across threads: the first block to enter turns it
off, the last to leave turns it back on if it was on. Cycles made meanwhile are collected
after."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["paused"]


class _Pause:
    """How many blocks hold the collector off, and whether it was on before the first."""

    __slots__ = ("depth", "lock", "was_on")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.was_on = False


_PAUSE = _Pause()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Hold the cyclic collector off for the block (nested and concurrent blocks share
    one pause; the collector's state before the first is restored after the last)."""
    with _PAUSE.lock:
        if _PAUSE.depth == 0:
            _PAUSE.was_on = gc.isenabled()
            gc.disable()
        _PAUSE.depth += 1
    try:
        yield
    finally:
        with _PAUSE.lock:
            _PAUSE.depth -= 1
            if _PAUSE.depth == 0 and _PAUSE.was_on:
                gc.enable()
