"""A function run in a forked child, for the tests of what a fork inherits."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable


def in_forked_child(work: Callable[[], object], seconds: float = 30) -> object:
    """``work``'s value as returned in a forked child; a child still running after
    ``seconds`` (waiting on a lock it inherited held) is killed and fails the test."""
    fork = multiprocessing.get_context("fork")
    ours, theirs = fork.Pipe(duplex=False)
    child = fork.Process(target=lambda: theirs.send(work()))
    child.start()
    try:
        assert ours.poll(seconds), "the forked child did not finish: it waits on a lock"
        return ours.recv()
    finally:
        child.kill()
        child.join()
