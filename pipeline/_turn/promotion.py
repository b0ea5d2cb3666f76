"""The next turn's library, made off the request's critical path (``Promotion``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from pipeline._model.library import Library

__all__ = ["Promotion"]

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _worker() -> ThreadPoolExecutor:
    """One worker thread per process for every conversation's promotions (made on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(1, thread_name_prefix="lamina-promote")
        return _pool


class Promotion:
    """The library the next turn starts from: this turn's new items in carry-forward form.

    The request being sent does not need it, and the previews of large notes are most of a
    cold build's work, so ``start`` lets a background thread make it while the model
    answers. ``result`` waits for that thread, or makes it here if the thread has not begun;
    it is made once either way, with the same bytes. An error is raised by ``result``.
    """

    __slots__ = ("_done", "_future", "_lock", "_make", "_prepare")

    def __init__(
        self, make: Callable[[], Library], prepare: Callable[[Library], None] | None = None
    ) -> None:
        self._make = make
        self._prepare = prepare  # work for later turns (warming memos), after the library
        self._done: Library | None = None
        self._future: Future[Library] | None = None
        self._lock = threading.Lock()

    def without_preparing(self) -> None:
        """Make only the library: for a caller that waits for it at once, the preparing
        would not be off the request's path (it changes no request, only later costs)."""
        self._prepare = None

    def start(self) -> None:
        """Make the library on the background worker (idempotent)."""
        if self._future is None and self._done is None:
            self._future = _worker().submit(self._run)

    def result(self) -> Library:
        """The library, made now unless the worker has made or is making it."""
        future = self._future
        if future is not None and future.cancel():
            self._future = None
        return self._run()

    def _run(self) -> Library:
        with self._lock:
            if self._done is None:
                done = self._make()
                if self._prepare is not None:
                    self._prepare(done)
                self._done = done
            return self._done
