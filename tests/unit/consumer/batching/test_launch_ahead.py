"""Launching ahead (`GpuRunner(ahead=True)`, `batching.launch_ahead`): the GPU thread launches a batch staged
behind a running one before that one finished, a thread of its own waits for each, the batches settle in
launch order with their own answers, a batch's GPU time is the engine's device seconds, a device error
reported at the wait sends the batch down the split path, an urgent batch waiting in the lane runs before
the next bulk batch is launched (in both modes; only those waiting when it came up), and a batch the engine
runs step by step is not launched ahead. Without it, nothing is launched before the batch ahead finished. A
fake device (`Queued`) finishes a batch only when the test lets it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest

from consumer.batching.gpu import GpuRunner
from engine.types import Between
from schemas.response import SystemOneResponse
from tests.unit.consumer.batching.fakes import FakeEngine, Item, said

DEVICE_S = 0.25  # the fake device's seconds for every batch
T = TypeVar("T")


class Queued:
    """A launched fake batch: `wait` blocks until the test `finish`es it, then answers (or raises)."""

    def __init__(self, log: list[str], name: str, answers: list[SystemOneResponse] | Exception) -> None:
        self.log, self.name, self.answers = log, name, answers
        self.done = threading.Event()

    def finish(self) -> None:
        self.done.set()

    def wait(self) -> tuple[list[SystemOneResponse], float | None]:
        assert self.done.wait(5), f"{self.name} was never finished"
        self.log.append(f"waited {self.name}")
        if isinstance(self.answers, Exception):
            raise self.answers
        return self.answers, DEVICE_S


class DeviceEngine(FakeEngine):
    """`FakeEngine` whose `launch` only queues: `launched` holds each batch's `Queued` in launch order."""

    def __init__(self, *, fail_at_wait: set[str] | None = None, stepped: set[str] | None = None) -> None:
        super().__init__()
        self.log: list[str] = []
        self.launched: list[Queued] = []
        self.fail_at_wait = fail_at_wait or set()
        self.stepped = stepped or set()  # batches run step by step (not queued whole)

    def queues_whole(self, staged: list[Item]) -> bool:
        return "+".join(i.name for i in staged) not in self.stepped

    def run(self, staged: list[Item], between: Between | None = None) -> list[SystemOneResponse]:
        return self.launch(staged, between).wait()[0]

    def launch(self, staged: list[Item], between: Between | None = None) -> Queued:
        name = "+".join(i.name for i in staged)
        self.log.append(f"launched {name}")
        failed = ValueError("device fault") if name in self.fail_at_wait else None
        queued = Queued(self.log, name, failed or self._answer(staged))
        self.launched.append(queued)
        return queued


async def _until(check: object, what: str) -> None:
    for _ in range(2500):  # at most about 5 s, whatever the machine
        if callable(check) and check():
            return
        await asyncio.sleep(0.002)
    raise AssertionError(f"timed out waiting until {what}")


Runner = GpuRunner[Item, list[Item], list[SystemOneResponse]]


def _runner(engine: FakeEngine, ahead: bool) -> tuple[Runner, ThreadPoolExecutor]:
    cpu = ThreadPoolExecutor(1)
    return GpuRunner(engine, cpu, ahead=ahead), cpu


async def _settled(runner: Runner, cpu: ThreadPoolExecutor, *runs: Awaitable[T]) -> list[T]:
    """The runs' results (at most 5 s), then the runner's and the prepare pool's threads stopped."""
    try:
        return await asyncio.wait_for(asyncio.gather(*runs), 5)
    finally:
        runner.shutdown()
        cpu.shutdown()


async def _bulk_then_urgent(
    engine: FakeEngine, runner: Runner, cpu: ThreadPoolExecutor, urgent: str
) -> list[asyncio.Future[tuple[Any, float, Any]]]:
    """Bulk "a" and "b" submitted, "b" staged and queued on the GPU thread, then urgent `urgent` waiting in
    the lane (its drain task queued behind "b"); returns the three runs' futures."""
    runs: list[asyncio.Future[tuple[Any, float, Any]]] = [
        asyncio.ensure_future(runner.run([Item(n)], lambda s, learn, ago: None)) for n in ("a", "b")
    ]
    await _until(lambda: sum(step == "stage" for step, _ in engine.steps) == 2, "b's staging began")
    await asyncio.wrap_future(cpu.submit(lambda: None))  # b's stage-and-queue, ahead of this, is done
    runs.append(asyncio.ensure_future(runner.run_urgent([Item(urgent)])))
    await _until(lambda: runner.lane_waiting == 1, f"{urgent} waits in the lane")
    return runs


def _answers(results: list[tuple[Any, float, Any]]) -> list[list[str]]:
    return [said(r.outcomes) for r, _, _ in results]


async def test_a_batch_is_launched_while_the_one_ahead_runs_and_both_settle_in_order() -> None:
    engine = DeviceEngine()
    runner, cpu = _runner(engine, ahead=True)
    done: list[tuple[float, bool]] = []
    first = asyncio.ensure_future(runner.run([Item("a")], lambda s, learn, ago: done.append((s, learn))))
    second = asyncio.ensure_future(runner.run([Item("b")], lambda s, learn, ago: done.append((s, learn))))
    await _until(lambda: len(engine.launched) == 2, "both batches were launched")
    assert engine.log == ["launched a", "launched b"]  # b launched while a was still on the device
    assert not first.done()
    assert not second.done()
    engine.launched[1].finish()  # the device cannot finish b first, but the waits must keep launch order
    await asyncio.sleep(0.05)
    assert not second.done()
    engine.launched[0].finish()
    (r1, s1, t1), (r2, s2, t2) = await _settled(runner, cpu, first, second)
    assert engine.log == ["launched a", "launched b", "waited a", "waited b"]
    assert (said(r1.outcomes), said(r2.outcomes)) == (["answer:a"], ["answer:b"])
    assert (s1, s2) == (DEVICE_S, DEVICE_S)  # the engine's device seconds, not the wall time
    assert done == [(DEVICE_S, True), (DEVICE_S, True)]
    assert t1 is not None
    assert t2 is not None
    assert t1.run_ms == t2.run_ms == DEVICE_S * 1000


async def test_without_launching_ahead_the_next_batch_waits_for_the_one_ahead() -> None:
    engine = DeviceEngine()
    runner, cpu = _runner(engine, ahead=False)
    first = asyncio.ensure_future(runner.run([Item("a")], lambda s, learn, ago: None))
    second = asyncio.ensure_future(runner.run([Item("b")], lambda s, learn, ago: None))
    await _until(lambda: len(engine.launched) == 1, "the first batch was launched")
    await asyncio.sleep(0.05)
    assert engine.log == ["launched a"]  # b is staged but the GPU thread is still waiting for a
    engine.launched[0].finish()
    await _until(lambda: len(engine.launched) == 2, "the second batch was launched")
    engine.launched[1].finish()
    (r1, _, _), (r2, _, _) = await _settled(runner, cpu, first, second)
    assert engine.log == ["launched a", "waited a", "launched b", "waited b"]
    assert (said(r1.outcomes), said(r2.outcomes)) == (["answer:a"], ["answer:b"])


@pytest.mark.parametrize("ahead", [True, False])
async def test_a_device_error_at_the_wait_splits_that_batch_only(ahead: bool) -> None:
    """The device reports a fault when the batch is waited for: that batch goes through `execute` with
    splitting (the fake's `execute` answers), the batch launched behind it is answered as usual."""
    engine = DeviceEngine(fail_at_wait={"a"})
    runner, cpu = _runner(engine, ahead=ahead)
    first = asyncio.ensure_future(runner.run([Item("a")], lambda s, learn, ago: None))
    second = asyncio.ensure_future(runner.run([Item("b")], lambda s, learn, ago: None))
    await _until(lambda: len(engine.launched) >= 1, "the first batch was launched")
    engine.launched[0].finish()
    await _until(lambda: len(engine.launched) == 2, "the second batch was launched")
    engine.launched[1].finish()
    (r1, _, t1), (r2, _, t2) = await _settled(runner, cpu, first, second)
    assert (said(r1.outcomes), said(r2.outcomes)) == (["answer:a"], ["answer:b"])
    assert engine.executed == [["a"]]  # the split path ran the failed batch again, and only it
    assert t1 is None
    assert t2 is not None


class HeldLaunch(DeviceEngine):
    """`DeviceEngine` whose launch of a batch named "a" waits for `go` (the GPU thread is busy meanwhile),
    and whose runs (the lane's) are logged."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()

    def launch(self, staged: list[Item], between: Between | None = None) -> Queued:
        if [i.name for i in staged] == ["a"]:
            assert self.go.wait(5)
        return super().launch(staged, between)

    def run(self, staged: list[Item], between: Between | None = None) -> list[SystemOneResponse]:
        self.log.append("ran " + "+".join(i.name for i in staged))
        return FakeEngine.run(self, staged, between)  # the lane's runs answer at once


async def test_an_urgent_batch_in_the_lane_runs_before_the_next_bulk_batch_is_launched() -> None:
    """The GPU thread is busy launching "a" while bulk "b" is queued on it and then urgent "u" enters the
    lane (its drain queued after "b"): "u" still runs before "b" is launched."""
    engine = HeldLaunch()
    runner, cpu = _runner(engine, ahead=True)
    first = asyncio.ensure_future(runner.run([Item("a")], lambda s, learn, ago: None))
    await _until(lambda: sum(step == "stage" for step, _ in engine.steps) == 1, "a's staging began")
    second = asyncio.ensure_future(runner.run([Item("b")], lambda s, learn, ago: None))
    await _until(lambda: sum(step == "stage" for step, _ in engine.steps) == 2, "b's staging began")
    await asyncio.wrap_future(cpu.submit(lambda: None))  # b's stage-and-queue, ahead of this, is done
    urgent = asyncio.ensure_future(runner.run_urgent([Item("u")]))
    await _until(lambda: runner.lane_waiting == 1, "u waits in the lane")
    engine.go.set()
    await _until(lambda: len(engine.launched) == 2, "b was launched")
    for queued in engine.launched:
        queued.finish()
    (r1, _, _), (r2, _, _), (ru, _, _) = await _settled(runner, cpu, first, second, urgent)
    assert engine.log[:3] == ["launched a", "ran u", "launched b"]
    assert (said(r1.outcomes), said(r2.outcomes), said(ru.outcomes)) == (
        ["answer:a"],
        ["answer:b"],
        ["answer:u"],
    )


async def test_a_batch_run_step_by_step_waits_for_the_one_ahead_even_when_launching_ahead() -> None:
    """ "b" is not queued whole (an eager run): it is not launched while "a" is still on the device, so its
    step boundaries are not behind a's remainder; it runs once a's wait returned."""
    engine = DeviceEngine(stepped={"b"})
    runner, cpu = _runner(engine, ahead=True)
    first = asyncio.ensure_future(runner.run([Item("a")], lambda s, learn, ago: None))
    second = asyncio.ensure_future(runner.run([Item("b")], lambda s, learn, ago: None))
    await _until(lambda: len(engine.launched) == 1, "the first batch was launched")
    await _until(lambda: sum(step == "stage" for step, _ in engine.steps) == 2, "b's staging began")
    await asyncio.wrap_future(cpu.submit(lambda: None))  # b's stage-and-queue, ahead of this, is done
    await asyncio.sleep(0.05)
    assert engine.log == ["launched a"]
    engine.launched[0].finish()
    await _until(lambda: len(engine.launched) == 2, "the second batch was launched")
    engine.launched[1].finish()
    (r1, s1, _), (r2, _, t2) = await _settled(runner, cpu, first, second)
    assert engine.log == ["launched a", "waited a", "launched b", "waited b"]
    assert (said(r1.outcomes), said(r2.outcomes)) == (["answer:a"], ["answer:b"])
    assert s1 == DEVICE_S  # a was launched ahead: the engine's device seconds
    assert t2 is not None


class SteppedAfterA(HeldLaunch):
    """`HeldLaunch` (runs answer at once and are logged) whose batch "b" is not queued whole."""

    def queues_whole(self, staged: list[Item]) -> bool:
        return [i.name for i in staged] != ["b"]


async def test_an_urgent_batch_arriving_while_a_stepped_batch_waits_runs_before_it() -> None:
    """Urgent "u" enters the lane while the GPU thread holds step-by-step "b" until "a" (launched ahead)
    finished: "u" runs as soon as "a" is done, before "b"."""
    engine = SteppedAfterA()
    engine.go.set()
    runner, cpu = _runner(engine, ahead=True)
    runs = await _bulk_then_urgent(engine, runner, cpu, "u")
    await _until(lambda: len(engine.launched) == 1, "a was launched")
    await asyncio.sleep(0.05)
    assert engine.log == ["launched a"]  # b waits for a on the GPU thread
    engine.launched[0].finish()
    results = await _settled(runner, cpu, *runs)
    assert engine.log == ["launched a", "waited a", "ran u", "ran b"]
    assert _answers(results) == [["answer:a"], ["answer:b"], ["answer:u"]]


class HeldRun(FakeEngine):
    """A blocking engine (no launching ahead) whose run of bulk "a" waits for `go`; every run is logged."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.log: list[str] = []

    def run(self, staged: list[Item], between: Between | None = None) -> list[SystemOneResponse]:
        name = "+".join(i.name for i in staged)
        if name == "a":
            assert self.go.wait(5)
        self.log.append(f"ran {name}")
        return super().run(staged, between)


async def test_without_launching_ahead_an_urgent_batch_runs_before_a_bulk_batch_queued_before_it() -> None:
    """Bulk "b" is queued on the GPU thread while "a" runs (a batch with no step boundary), then urgent "u"
    enters the lane (its drain queued after "b"): "u" runs right after "a", before "b"."""
    engine = HeldRun()
    runner, cpu = _runner(engine, ahead=False)
    runs = await _bulk_then_urgent(engine, runner, cpu, "u")
    engine.go.set()
    results = await _settled(runner, cpu, *runs)
    assert engine.log == ["ran a", "ran u", "ran b"]
    assert _answers(results) == [["answer:a"], ["answer:b"], ["answer:u"]]


class HeldLaneRun(HeldRun):
    """`HeldRun` whose lane run of "u1" also waits, for `u1_go`."""

    def __init__(self) -> None:
        super().__init__()
        self.u1_go = threading.Event()
        self.u1_running = threading.Event()

    def run(self, staged: list[Item], between: Between | None = None) -> list[SystemOneResponse]:
        if [i.name for i in staged] == ["u1"]:
            self.u1_running.set()
            assert self.u1_go.wait(5)
        return super().run(staged, between)


async def test_urgent_work_arriving_while_the_lane_runs_does_not_hold_back_the_next_bulk_batch() -> None:
    """Before bulk "b" the GPU thread runs the lane batches waiting when "b" came up ("u1") and no more: "u2",
    which enters the lane while "u1" runs, waits until after "b"."""
    engine = HeldLaneRun()
    runner, cpu = _runner(engine, ahead=False)
    runs = await _bulk_then_urgent(engine, runner, cpu, "u1")
    engine.go.set()
    await _until(engine.u1_running.is_set, "u1 runs")
    runs.append(asyncio.ensure_future(runner.run_urgent([Item("u2")])))
    await _until(lambda: runner.lane_waiting == 1, "u2 waits in the lane")
    engine.u1_go.set()
    results = await _settled(runner, cpu, *runs)
    assert engine.log == ["ran a", "ran u1", "ran b", "ran u2"]
    assert _answers(results) == [["answer:a"], ["answer:b"], ["answer:u1"], ["answer:u2"]]
