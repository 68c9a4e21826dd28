"""The batcher's CPU threads (`consumer.batching.cpu_pool.CpuPool`): a free thread takes staging before
answering and both before preparing, FIFO within a kind; errors reach the caller's future; shutdown cancels
what never started. The one thread is held on an event while the queue fills, so the order is exact."""

from __future__ import annotations

import asyncio
import threading

import pytest

from consumer.batching.cpu_pool import CpuPool, Work


def _held(pool: CpuPool) -> threading.Event:
    """Occupy the pool's one thread until the returned event is set."""
    go = threading.Event()
    started = threading.Event()

    def hold() -> None:
        started.set()
        assert go.wait(5)

    pool.submit_at(Work.PREPARE, hold)
    assert started.wait(5)
    return go


def test_a_free_thread_takes_stage_then_respond_then_prepare_fifo_within_a_kind() -> None:
    pool = CpuPool(1, "test-cpu")
    order: list[str] = []
    go = _held(pool)
    submitted = [
        (Work.PREPARE, "prepare 1"),
        (Work.RESPOND, "respond 1"),
        (Work.PREPARE, "prepare 2"),
        (Work.STAGE, "stage 1"),
        (Work.RESPOND, "respond 2"),
        (Work.STAGE, "stage 2"),
    ]
    futures = [pool.submit_at(kind, order.append, name) for kind, name in submitted]
    assert pool.queued == {Work.STAGE: 2, Work.RESPOND: 2, Work.PREPARE: 2}
    go.set()
    for future in futures:
        future.result(5)
    assert order == ["stage 1", "stage 2", "respond 1", "respond 2", "prepare 1", "prepare 2"]
    pool.shutdown()


def test_an_error_reaches_the_callers_future_and_the_thread_goes_on() -> None:
    pool = CpuPool(1, "test-cpu")

    def fail() -> None:
        raise ValueError("bad record")

    with pytest.raises(ValueError, match="bad record"):
        pool.submit_at(Work.PREPARE, fail).result(5)
    assert pool.submit_at(Work.STAGE, lambda: 7).result(5) == 7
    pool.shutdown()


def test_shutdown_cancels_what_never_started_and_refuses_new_work() -> None:
    pool = CpuPool(1, "test-cpu")
    go = _held(pool)
    waiting = pool.submit_at(Work.STAGE, lambda: 1)
    pool.shutdown(wait=False, cancel_futures=True)
    assert waiting.cancelled()
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit_at(Work.PREPARE, lambda: 2)
    go.set()
    pool.shutdown()  # joins the thread once the held task ended
    assert not any(t.name.startswith("test-cpu") and t.is_alive() for t in threading.enumerate())


def test_join_waits_for_a_started_task_within_its_bound() -> None:
    pool = CpuPool(2, "test-join")
    go = _held(pool)
    pool.shutdown(wait=False, cancel_futures=True)
    assert pool.join(0.05) is False  # the held task runs on: one thread is still alive
    go.set()
    assert pool.join(5) is True
    assert not any(t.name.startswith("test-join") and t.is_alive() for t in threading.enumerate())


def test_shutdown_without_cancel_runs_the_queued_work_first() -> None:
    pool = CpuPool(2, "test-cpu")
    futures = [pool.submit_at(Work.PREPARE, pow, i, 2) for i in range(20)]
    pool.shutdown()
    assert [f.result(0) for f in futures] == [i * i for i in range(20)]


async def test_at_is_an_executor_for_the_event_loop_at_its_kind() -> None:
    pool = CpuPool(1, "test-cpu")
    loop = asyncio.get_running_loop()
    order: list[str] = []
    go = _held(pool)
    later = loop.run_in_executor(pool.at(Work.PREPARE), order.append, "prepare")
    first = loop.run_in_executor(pool.at(Work.STAGE), order.append, "stage")
    go.set()
    await asyncio.wait_for(asyncio.gather(later, first), 5)
    assert order == ["stage", "prepare"]
    pool.at(Work.STAGE).shutdown()  # a view's shutdown leaves the pool working
    assert await loop.run_in_executor(pool.at(Work.RESPOND), int, "3") == 3
    pool.shutdown()
