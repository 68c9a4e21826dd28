"""The batcher's CPU threads, with the work that frees the GPU first: one queue ordered by kind, then FIFO.

The batcher's CPU threads (`batching.prepare_workers`, 1 by default: more CPU-bound threads starve the
event loop of the GIL, BENCHMARKS.md "Priority classes, round three") do three kinds of work: staging the
next batch (`Work.STAGE`: the GPU waits for it once the running batch ends), answering a finished batch
(`Work.RESPOND`: its records wait for nothing else) and preparing newly fetched records
(`Work.PREPARE`: they would wait for the next cut anyway). With a plain FIFO pool a batch's staging queued
behind every prepare and respond task submitted before its cut. Here a free thread takes the most urgent
kind waiting (a lower `Work`), FIFO within a kind; a task that has started runs to its end. Prepare tasks
cannot starve: stage and respond tasks come at most once per batch each, and a batch needs prepared
records.

`CpuPool.at(kind)` is a `concurrent.futures.Executor` submitting at that kind (for `loop.run_in_executor`).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from enum import IntEnum
from typing import ParamSpec, TypeVar

from consumer.logging import get_logger

__all__ = ["JOIN_S", "CpuPool", "Work"]

log = get_logger("consumer.batching.cpu_pool")

JOIN_S = 5.0
"""How long a stopping service waits for the threads to end in `CpuPool.join` (`Batcher.close`)."""

T = TypeVar("T")
Params = ParamSpec("Params")


class Work(IntEnum):
    """Kinds of CPU work, most urgent first."""

    STAGE = 0
    RESPOND = 1
    PREPARE = 2


@dataclass(order=True, slots=True)
class _Task:
    """A queued call: ordered by (kind, submission number) only."""

    kind: int
    seq: int
    run: Callable[[], None] = field(compare=False)
    cancel: Callable[[], bool] = field(compare=False)  # its future's


class CpuPool:
    """`workers` threads named `name`_N running submitted calls most urgent kind first (see the module
    docstring). Thread-safe. `shutdown` stops it; its threads are daemons that end once it is shut down
    and their queue is empty (`join` waits for that)."""

    def __init__(self, workers: int, name: str) -> None:
        if workers < 1:
            raise ValueError("a CpuPool needs at least one worker")
        self._heap: list[_Task] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True) for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def submit_at(
        self, kind: Work, fn: Callable[Params, T], /, *args: Params.args, **kwargs: Params.kwargs
    ) -> Future[T]:
        """Queue `fn(*args, **kwargs)` as work of `kind`; returns its future. Raises RuntimeError after
        `shutdown`."""
        future: Future[T] = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # the caller's future carries it, as ThreadPoolExecutor's does
                future.set_exception(exc)
            else:
                future.set_result(result)

        with self._cond:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            heapq.heappush(self._heap, _Task(int(kind), next(self._seq), run, future.cancel))
            self._cond.notify()
        return future

    def at(self, kind: Work) -> Executor:
        """An `Executor` whose `submit` queues work of `kind` here (its `shutdown` leaves the pool alone)."""
        return _At(self, kind)

    @property
    def queued(self) -> dict[Work, int]:
        """Tasks waiting for a thread, by kind (a snapshot)."""
        with self._cond:
            kinds = [Work(task.kind) for task in self._heap]
        return {kind: kinds.count(kind) for kind in Work}

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no new work; with `cancel_futures`, cancel what has not started; with `wait`, join the
        threads (they finish the tasks left in the queue first)."""
        with self._cond:
            self._closed = True
            if cancel_futures:
                for task in self._heap:
                    task.cancel()
                self._heap.clear()
            self._cond.notify_all()
        if wait:
            self.join(None)

    def join(self, timeout_s: float | None) -> bool:
        """After `shutdown`: wait at most `timeout_s` seconds in all (None: without a bound) for the threads
        to end (a task that has started runs to its end first); True when every one has (the calling
        thread aside). Blocking.

        The threads are daemons, so the process can exit while one still runs; but one still running when
        the interpreter finalises is stopped where it next takes the GIL, and inside torch's native code
        that aborts the process ("terminate called without an active exception", exit -6). A stopping
        service joins them first (`consumer.batching.batcher.Batcher.close`). Logs a warning for threads
        still running at the bound."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        others = [t for t in self._threads if t is not threading.current_thread()]
        for thread in others:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        running = [t.name for t in others if t.is_alive()]
        if running:
            log.warning("cpu_threads_still_running", threads=running, seconds=timeout_s)
        return not running

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._heap and not self._closed:
                    self._cond.wait()
                if not self._heap:
                    return  # closed and drained
                task = heapq.heappop(self._heap)
            task.run()


class _At(Executor):
    """`CpuPool.at`: submits at one kind."""

    def __init__(self, pool: CpuPool, kind: Work) -> None:
        self._pool = pool
        self._kind = kind

    def submit(self, fn: Callable[Params, T], /, *args: Params.args, **kwargs: Params.kwargs) -> Future[T]:
        return self._pool.submit_at(self._kind, fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing: the pool's owner shuts it down."""
