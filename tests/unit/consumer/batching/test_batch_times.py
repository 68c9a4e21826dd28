"""Where a normal batch's time goes after its cut (`consumer.batching.gpu.BatchTimes`): a batch queued on
the GPU thread behind a running one counts that wait as `gpu_wait`, not as its run; waits for the busy
prepare thread count as `stage_wait` and `respond_wait`, not as staging or answering; and the batcher records
every step once per record (`Metrics.batch_path`) and each submission's prepare time. The waits are made
with events, so the bounds hold however slow the machine is."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from consumer.batching.batcher import Batcher
from consumer.batching.gpu import BATCH_STEPS, GpuRunner
from consumer.metrics import Metrics
from consumer.settings import BatchingSettings
from engine.types import Between
from schemas.response import SystemOneResponse
from tests.unit.consumer.batching.fakes import FakeEngine, Item, ident, items, said

HELD_S = 0.05  # how long the first batch is held on the GPU thread after the second one was queued


class HeldEngine(FakeEngine):
    """The run of a batch holding "first" waits for `go`; `staged` counts the batches staged so far."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.staged = 0

    def stage(self, batch: Sequence[Item]) -> list[Item]:
        out = super().stage(batch)
        self.staged += 1  # prepare pool only
        return out

    def run(self, staged: list[Item], between: Between | None = None) -> list[SystemOneResponse]:
        if any(i.name == "first" for i in staged):
            assert self.go.wait(5)
        return super().run(staged, between)


async def test_a_batch_behind_a_running_one_counts_the_wait_as_gpu_wait() -> None:
    engine = HeldEngine()
    cpu = ThreadPoolExecutor(1)
    runner: GpuRunner[Item, list[Item], list[SystemOneResponse]] = GpuRunner(engine, cpu)

    def on_done(seconds: float, learn: bool, ago: float) -> None:
        pass

    first = asyncio.ensure_future(runner.run([Item("first")], on_done))
    second = asyncio.ensure_future(runner.run([Item("second")], on_done))
    for _ in range(1000):  # both staged; the second is queued right after its stage returns
        if engine.staged == 2:
            break
        await asyncio.sleep(0.002)
    await asyncio.sleep(HELD_S)
    engine.go.set()
    (r1, _, t1), (r2, _, t2) = await asyncio.wait_for(asyncio.gather(first, second), 5)
    runner.shutdown()
    cpu.shutdown()
    assert (said(r1.outcomes), said(r2.outcomes)) == (["answer:first"], ["answer:second"])
    assert t1 is not None
    assert t2 is not None
    assert t1.run_ms >= HELD_S * 1000 * 0.9  # held on the GPU thread: its run
    assert t2.gpu_wait_ms >= HELD_S * 1000 * 0.9  # queued behind it: waiting, not running
    assert [name for name, _ in t2.steps()] == list(BATCH_STEPS)
    assert all(ms >= 0.0 for _, ms in t1.steps() + t2.steps())


async def test_waits_for_the_prepare_thread_count_as_stage_wait_and_respond_wait() -> None:
    """A batch whose stage, and later its respond, queue behind other work on the one prepare thread counts
    those waits apart from the staging and answering themselves."""
    engine = HeldEngine()
    cpu = ThreadPoolExecutor(1)
    runner: GpuRunner[Item, list[Item], list[SystemOneResponse]] = GpuRunner(engine, cpu)
    busy, busy_again = threading.Event(), threading.Event()
    cpu.submit(busy.wait, 5)  # the prepare thread is taken before the cut

    def on_done(seconds: float, learn: bool, ago: float) -> None:
        cpu.submit(busy_again.wait, 5)  # taken again before the respond is queued

    batch = asyncio.ensure_future(runner.run([Item("first")], on_done))
    await asyncio.sleep(HELD_S)
    busy.set()
    for _ in range(1000):
        if engine.staged == 1:
            break
        await asyncio.sleep(0.002)
    engine.go.set()
    await asyncio.sleep(HELD_S)
    busy_again.set()
    result, _, times = await asyncio.wait_for(batch, 5)
    runner.shutdown()
    cpu.shutdown()
    assert said(result.outcomes) == ["answer:first"]
    assert times is not None
    assert times.stage_wait_ms >= HELD_S * 1000 * 0.9  # the cut waited for the busy thread ...
    assert times.stage_ms < times.stage_wait_ms  # ... not for staging itself
    assert times.respond_wait_ms >= HELD_S * 1000 * 0.9
    assert times.respond_ms < times.respond_wait_ms


async def test_the_batcher_records_each_step_once_per_record_and_the_prepare_time() -> None:
    metrics = Metrics()
    batcher = Batcher(FakeEngine(), BatchingSettings(mode="fixed", max_wait_ms=1), metrics=metrics)
    await batcher.start()
    outcomes = await asyncio.wait_for(batcher.submit(ident, items("a", "b", "c")), 5)
    await batcher.close()
    assert said(outcomes) == ["answer:a", "answer:b", "answer:c"]
    count, _ = metrics.batch_path.totals()
    assert count == 3 * len(BATCH_STEPS)  # one observation per record and step
    assert [metrics.batch_path.labels(s).count for s in BATCH_STEPS] == [3] * len(BATCH_STEPS)
    assert metrics.prepare_seconds.count == 3
    assert 0.0 <= metrics.prepare_seconds.sum < 5.0 * 3
