"""Where replays run: in this process, on a local process pool, or on a Dask cluster.

An engine maps one function over the recordings and yields each result as it finishes,
in whatever order; the caller sorts. A task is one whole conversation (its turns are
sequential), so engines never split one.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Protocol, TypeVar

import attrs

from lamina.pipeline import LaminaError
from lamina.pipeline.errors import ConfigError

__all__ = [
    "ENGINES",
    "DaskEngine",
    "Engine",
    "EngineError",
    "LocalEngine",
    "SerialEngine",
    "make_engine",
]

T = TypeVar("T")
R = TypeVar("R")
ENGINES = ("serial", "local", "dask")
_POLL = 0.05  # seconds between looks at the finished results while none is ready
log = logging.getLogger("lamina.replay")

# For a LocalCluster: the workers' statistical profiler (a stack sample every 10 ms) and
# the scheduler holding back tasks until a worker is free (worker-saturation 1.1) each
# cost more than a small conversation's replay: measured, 80 conversations on one worker
# took 21 s with the defaults, 9.7 s with these (a local pool: 8.7 s).
LOCAL_CLUSTER_CONFIG = {
    "distributed.worker.profile.enabled": False,
    "distributed.scheduler.worker-saturation": "inf",
}


class Engine(Protocol):
    """Runs ``fn`` on every item; yields results as they finish."""

    @property
    def name(self) -> str: ...

    def run(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]: ...


@attrs.frozen
class SerialEngine:
    """One item after the other in this process (the reference the others must match)."""

    name: str = "serial"

    def run(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        for item in items:
            yield fn(item)


def _default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)


def _context() -> Any:
    """forkserver where the platform has it (workers fork from a process that has already
    imported Lamina, and no thread of this process is copied), else spawn."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["lamina._replay"])
        return ctx
    return multiprocessing.get_context("spawn")


@attrs.frozen
class LocalEngine:
    """A process pool on this machine (no extra dependency). A worker that dies breaks the
    pool; the unfinished items are then run again on a new pool, up to ``retries`` times."""

    workers: int = attrs.field(factory=_default_workers)
    retries: int = 2
    name: str = "local"

    def run(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        pending = dict(enumerate(items))
        broken = 0
        while pending:
            pool = ProcessPoolExecutor(self.workers, mp_context=_context())
            try:
                futures = {pool.submit(fn, item): i for i, item in pending.items()}
                for future in as_completed(futures):
                    result = future.result()
                    del pending[futures[future]]
                    yield result
            except BrokenProcessPool as exc:
                broken += 1
                if broken > self.retries:
                    raise ConfigError(
                        "engine", f"local worker processes died {broken} times: {exc}"
                    ) from None
            finally:
                pool.shutdown(wait=True, cancel_futures=True)


class EngineError(LaminaError):
    """The engine gave up on a run: results stopped arriving, or a conversation's task was
    lost more often than the engine retries (``.engine``, ``.conversations``: the
    positions of the unfinished items)."""

    def __init__(self, engine: str, problem: str, conversations: Sequence[int] = ()) -> None:
        self.engine = engine
        self.conversations = tuple(conversations)
        super().__init__(f"engine {engine}: {problem}")


# The scheduler's states in which a key the client still waits for will reach it without
# help: being computed or waiting for a worker (or for its turn, with worker saturation).
_ON_ITS_WAY = frozenset({"released", "waiting", "queued", "no-worker", "processing"})


@attrs.frozen
class DaskEngine:
    """``distributed.Client`` on a new ``LocalCluster`` of ``workers`` single-threaded
    processes, or on the scheduler at ``address`` (workers there need Lamina installed and
    the corpus's vaults at the same paths). A lost worker's tasks are rescheduled by the
    cluster; ``retries`` re-runs a task whose worker raised.

    The client is watched, not trusted: after ``stall_check`` seconds without a result
    the scheduler is asked about every key the client still waits for, and a key it holds
    in memory (or has forgotten) at two checks in a row is submitted again as a new task
    (a worker killed while its result is gathered can leave the client waiting for a
    notification that never comes). A conversation resubmitted more than ``retries``
    times, or ``stall_timeout`` seconds with no result at all (None: no limit), is an
    EngineError."""

    workers: int = attrs.field(factory=_default_workers)
    address: str | None = None
    retries: int = 2
    stall_check: float = 5.0
    stall_timeout: float | None = 600.0
    name: str = "dask"

    def run(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        try:
            # distributed has no type hints: hold it as Any rather than silence each call.
            distributed: Any = importlib.import_module("distributed")
        except ImportError:
            raise ConfigError(
                "engine", "the dask engine needs the 'dask' extra: pip install 'lamina[dask]'"
            ) from None
        with importlib.import_module("dask").config.set(LOCAL_CLUSTER_CONFIG):
            yield from self._run(distributed, fn, items)

    def _run(self, distributed: Any, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        cluster = None
        try:
            if self.address is None:
                cluster = distributed.LocalCluster(
                    n_workers=self.workers,
                    threads_per_worker=1,
                    processes=True,
                    dashboard_address=None,
                    silence_logs=logging.ERROR,
                )
                client = distributed.Client(cluster)
            else:
                client = distributed.Client(self.address, timeout=30)
        except (OSError, TimeoutError) as exc:
            where = self.address or "a LocalCluster"
            raise ConfigError("engine", f"cannot reach {where}: {exc}") from None
        try:
            yield from _Collect(self, distributed, client, fn, list(items)).results()
        finally:
            client.close()
            if cluster is not None:
                cluster.close()


class _Collect:
    """One Dask run's bookkeeping on the client thread: which item each key computes,
    which items are done, and the keys the scheduler says are stuck."""

    def __init__(
        self,
        engine: DaskEngine,
        distributed: Any,
        client: Any,
        fn: Callable[[Any], Any],
        items: list[Any],
    ) -> None:
        self.engine, self.distributed, self.client = engine, distributed, client
        self.fn, self.items = fn, items
        self.index: dict[Any, int] = {}  # key -> item position
        self.waiting: dict[int, Any] = {}  # item position -> its newest future
        self.resubmitted = [0] * len(items)
        self.suspects: set[Any] = set()  # keys found stuck at the last check

    def _track(self, futures: Sequence[Any], positions: Sequence[int]) -> None:
        for future, i in zip(futures, positions, strict=True):
            self.index[future.key] = i
            self.waiting[i] = future

    def results(self) -> Iterator[Any]:
        engine = self.engine
        futures = self.client.map(self.fn, self.items, pure=False, retries=engine.retries)
        self._track(futures, range(len(self.items)))
        # Results are gathered by as_completed on the client's own event loop: a
        # future.result() from this thread, racing a lost worker's rescheduled key,
        # can meet an asyncio.Event bound to the other loop (distributed raises).
        done = self.distributed.as_completed(futures, with_results=True, raise_errors=False)
        last = checked = time.monotonic()
        while self.waiting:
            batch = done.next_batch(block=False)
            if not batch:
                time.sleep(_POLL)
                now = time.monotonic()
                if engine.stall_timeout is not None and now - last > engine.stall_timeout:
                    raise EngineError(
                        engine.name,
                        f"no result for {engine.stall_timeout:g} s; "
                        f"{len(self.waiting)} conversations unfinished",
                        sorted(self.waiting),
                    )
                if now - max(last, checked) >= engine.stall_check:
                    checked = now
                    done.update(self._resubmit_stuck())
                continue
            last = time.monotonic()
            self.suspects.clear()
            for future, result in batch:
                # The status first: release() cancels the future's state (on the loop's
                # thread, soon), after which every future reads "cancelled".
                status = future.status
                future.release()
                i = self.index.get(future.key)
                if i is None or self.waiting.get(i) is not future:
                    continue  # a superseded task finished after all: its twin counts
                if status == "error":
                    _typ, exc, tb = result
                    raise exc.with_traceback(tb)
                if status == "cancelled":  # e.g. a key the scheduler had forgotten
                    done.update(self._again([i], f"cancelled: {type(result).__name__}"))
                    continue
                del self.waiting[i]
                yield result

    def _resubmit_stuck(self) -> list[Any]:
        """Ask the scheduler about the keys still awaited; resubmit those it holds in memory
        or has forgotten at two checks in a row. Returns the new futures."""
        pending = {f.key: i for i, f in self.waiting.items()}

        # Defined here so cloudpickle ships it by value: a remote scheduler need not have
        # Lamina installed. It reads each key's task state ("forgotten": no task).
        def states_of(dask_scheduler: Any, keys: list[Any]) -> dict[Any, str]:
            tasks = dask_scheduler.tasks
            return {k: tasks[k].state if k in tasks else "forgotten" for k in keys}

        try:
            states = self.client.run_on_scheduler(states_of, keys=list(pending))
        except Exception as exc:  # the scheduler is gone, or runs no client code
            log.warning("dask: cannot ask the scheduler about unfinished tasks: %s", exc)
            return []
        stuck = {k for k, state in states.items() if state not in _ON_ITS_WAY}
        again = sorted(pending[k] for k in stuck & self.suspects)
        self.suspects = stuck
        reasons = {pending[k]: states[k] for k in stuck}
        return self._again(again, "{} on the scheduler", reasons)

    def _again(
        self, positions: Sequence[int], why: str, states: dict[int, str] | None = None
    ) -> list[Any]:
        """Submit these items again as new tasks (their old futures released); more than
        ``retries`` times for one item is an EngineError."""
        engine = self.engine
        for i in positions:
            self.resubmitted[i] += 1
            state = why.format((states or {}).get(i, ""))
            if self.resubmitted[i] > engine.retries:
                raise EngineError(
                    engine.name,
                    f"conversation {i}'s result never reached this client after "
                    f"{engine.retries + 1} tasks (last: {state})",
                    [i],
                )
            log.warning(
                "dask: conversation %d's result never reached this client (%s); running it again",
                i,
                state,
            )
            self.waiting[i].release()
        if not positions:
            return []
        futures = self.client.map(
            self.fn, [self.items[i] for i in positions], pure=False, retries=engine.retries
        )
        self._track(futures, positions)
        return list(futures)


def make_engine(name: str, workers: int | None = None, address: str | None = None) -> Engine:
    """The engine called ``name`` ("serial", "local" or "dask")."""
    if address is not None and name != "dask":
        raise ConfigError("address", "--address needs --engine dask")
    if workers is not None and workers < 1:
        raise ConfigError("workers", f"must be at least 1, got {workers}")
    count = workers or _default_workers()
    if name == "serial":
        return SerialEngine()
    if name == "local":
        return LocalEngine(count)
    if name == "dask":
        return DaskEngine(count, address)
    raise ConfigError("engine", f"unknown engine {name!r} (known: {', '.join(ENGINES)})")
