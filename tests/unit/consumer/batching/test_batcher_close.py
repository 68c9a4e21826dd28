"""`Batcher.close` on unfinished work: the records are cancelled, not failed, and no ERROR line is logged."""

from __future__ import annotations

import asyncio
import threading

from structlog.testing import capture_logs

from consumer.batching.batcher import Batcher
from consumer.settings import BatchingSettings
from engine.batching.cut import BatchLimits
from engine.types import Between
from schemas.response import SystemOneResponse
from tests.unit.consumer.batching.fakes import FakeEngine, Item


class _StuckEngine(FakeEngine):
    """One record per batch; the GPU thread is busy until `release` is set."""

    def __init__(self) -> None:
        super().__init__(BatchLimits(max_tokens=1000, max_records=1))
        self.release = threading.Event()
        self.started = threading.Event()

    def run(self, staged: list[Item], between: Between | None = None) -> list[SystemOneResponse]:
        self.started.set()
        self.release.wait(5)
        return super().run(staged)


async def test_close_cancels_unfinished_records_without_an_error_line() -> None:
    engine = _StuckEngine()
    batcher: Batcher[Item, list[Item], list[SystemOneResponse]] = Batcher(
        engine, BatchingSettings(max_wait_ms=0, max_pending_batches=1)
    )
    await batcher.start()
    running = batcher.submit(lambda item: item, [Item("running")])
    queued = batcher.submit(lambda item: item, [Item("queued")])
    await asyncio.to_thread(engine.started.wait, 5)
    try:
        with capture_logs() as logs:
            await batcher.close(0.05)
            await asyncio.sleep(0.05)  # task done-callbacks run
    finally:
        engine.release.set()
    assert running.cancelled()  # was on the GPU: unfinished, not an engine failure (no DLQ record)
    assert queued.cancelled()
    assert [e for e in logs if e["log_level"] == "error"] == []


async def test_close_leaves_no_prepare_thread_running() -> None:
    # a daemon thread still running when the interpreter finalises can abort the process (CpuPool.join)
    before = set(threading.enumerate())  # other tests' batchers may have left theirs
    batcher: Batcher[Item, list[Item], list[SystemOneResponse]] = Batcher(
        FakeEngine(BatchLimits(max_tokens=1000, max_records=4)), BatchingSettings(max_wait_ms=0)
    )
    await batcher.start()
    answered = batcher.submit(lambda item: item, [Item("one")])
    await asyncio.wait_for(answered, 5)
    ours = [t for t in set(threading.enumerate()) - before if t.name.startswith("clef-prepare")]
    assert ours
    await batcher.close(1.0)
    assert [t.name for t in ours if t.is_alive()] == []
