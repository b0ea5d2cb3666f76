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
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Protocol, TypeVar

import attrs

from pipeline import ConfigError

__all__ = ["ENGINES", "DaskEngine", "Engine", "LocalEngine", "SerialEngine", "make_engine"]

T = TypeVar("T")
R = TypeVar("R")
ENGINES = ("serial", "local", "dask")

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


@attrs.frozen
class DaskEngine:
    """``distributed.Client`` on a new ``LocalCluster`` of ``workers`` single-threaded
    processes, or on the scheduler at ``address`` (workers there need Lamina installed and
    the corpus's vaults at the same paths). A lost worker's tasks are rescheduled by the
    cluster; ``retries`` re-runs a task whose worker raised."""

    workers: int = attrs.field(factory=_default_workers)
    address: str | None = None
    retries: int = 2
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
            futures = client.map(fn, list(items), pure=False, retries=self.retries)
            # Results are gathered by as_completed on the client's own event loop: a
            # future.result() from this thread, racing a lost worker's rescheduled key,
            # can meet an asyncio.Event bound to the other loop (distributed raises).
            for future, result in distributed.as_completed(futures, with_results=True):
                future.release()
                yield result
        finally:
            client.close()
            if cluster is not None:
                cluster.close()


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

