"""Priority classes through the batcher: the most urgent class first, the starvation bound, and the urgent
lane (an urgent batch runs between the layers of a running bulk batch and is answered before it ends)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from consumer.batching.batcher import Batcher
from consumer.clock import ManualClock
from consumer.metrics import Metrics
from consumer.settings import BatchingSettings
from engine.batching.cut import BatchLimits
from engine.types import Between
from schemas.response import SystemOneResponse
from tests.unit.consumer.batching.fakes import FakeEngine, Item, ident, items, said

FakeBatcher = Batcher[Item, list[Item], list[SystemOneResponse]]
ONE = BatchLimits(max_tokens=1000, max_records=1)  # one record per batch: the order is the batches' order


def settings(**priority: int) -> BatchingSettings:
    return BatchingSettings.model_validate(
        {"mode": "fixed", "max_wait_ms": 0, "max_pending_batches": 1, "priority": priority}
    )


class GatedEngine(FakeEngine):
    """Runs of records named `bulk*` take "layers": until `open` is set they call `between` in a loop
    (bounded), as the text decoder does between layers; other runs answer at once."""

    def __init__(self, limits: BatchLimits = ONE) -> None:
        super().__init__(limits)
        self.open = threading.Event()
        self.running = threading.Event()
        self.order: list[str] = []  # batches in the order their run finished

    def run(self, staged: list[Item], between: Between | None = None) -> list[SystemOneResponse]:
        if any(i.name.startswith("bulk") for i in staged):
            self.running.set()
            for _ in range(500):  # bounded: 5 s at most
                if self.open.wait(0.01):
                    break
                if between is not None:
                    between()
        out = super().run(staged, between)
        self.order.append("+".join(i.name for i in staged))
        return out


async def until(condition: Callable[[], bool], rounds: int = 500) -> None:
    for _ in range(rounds):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not met in time")


async def test_the_most_urgent_class_runs_first() -> None:
    """A gated bulk batch holds the GPU while class 2, 1 and 0 records queue; then they run 0, 1, 2, FIFO
    inside a class (urgent_below=0: no lane, only the order). Each class is one submission: submissions
    of one class are queued in the order their prepare calls finish (a pool of several threads)."""
    engine = GatedEngine()
    b: FakeBatcher = Batcher(engine, settings(urgent_below=0), clock=ManualClock())
    await b.start()
    first = b.submit(ident, items("bulk0"), priority=2)
    await until(engine.running.is_set)
    later = [
        b.submit(ident, items("k1", "k2"), priority=2),
        b.submit(ident, items("c1"), priority=1),
        b.submit(ident, items("h1", "h2"), priority=0),
    ]
    await until(lambda: b.pending == 5)
    engine.open.set()
    await asyncio.gather(first, *later)
    assert engine.order == ["bulk0", "h1", "h2", "c1", "k1", "k2"]
    await b.close()


async def test_a_passed_over_class_runs_after_the_bound() -> None:
    """Class 0 keeps two records waiting at every cut; class 2 gets its turn after `starvation_batches`."""
    engine = GatedEngine()
    b: FakeBatcher = Batcher(engine, settings(urgent_below=0, starvation_batches=2), clock=ManualClock())
    await b.start()
    first = b.submit(ident, items("bulk0"), priority=2)
    await until(engine.running.is_set)
    subs = [
        b.submit(ident, items("k"), priority=2),
        b.submit(ident, items(*(f"h{i}" for i in range(5))), priority=0),
    ]
    await until(lambda: b.pending == 6)
    engine.open.set()
    await asyncio.gather(first, *subs)
    assert engine.order == ["bulk0", "h0", "h1", "k", "h2", "h3", "h4"]
    await b.close()


async def test_an_urgent_batch_runs_inside_a_running_bulk_batch() -> None:
    """While a bulk batch runs (its run calls `between` until released), an HTTP-class record is cut into
    a lane batch, run through `between` and answered; the bulk batch ends only after that."""
    engine = GatedEngine()
    metrics = Metrics()
    b: FakeBatcher = Batcher(engine, settings(), clock=ManualClock(), metrics=metrics)
    await b.start()
    bulk = b.submit(ident, items("bulk0"), priority=2)
    await until(engine.running.is_set)
    urgent = b.submit(ident, items("http"), priority=0)
    assert said(await asyncio.wait_for(urgent, 5)) == ["answer:http"]
    assert not bulk.done()
    engine.open.set()
    assert said(await bulk) == ["answer:bulk0"]
    assert engine.order == ["http", "bulk0"]
    # the lane batch was staged and run inside the engine's lane (its own stream on CUDA), the bulk one not
    assert engine.in_lane == [("stage", ["http"]), ("run", ["http"])]
    assert metrics.class_latency.labels("0").count == 1
    assert metrics.class_queue_wait.labels("2").count == 1
    await b.close()


async def test_urgent_work_after_the_bulk_batch_still_runs_once() -> None:
    """A lane batch whose bulk batch ends before any `between` call runs as the GPU thread's next task,
    exactly once."""
    engine = GatedEngine()
    b: FakeBatcher = Batcher(engine, settings(), clock=ManualClock())
    await b.start()
    engine.open.set()  # bulk runs answer at once: no between call reaches the lane
    subs = [b.submit(ident, items(f"bulk{i}"), priority=2) for i in range(3)]
    subs.append(b.submit(ident, items("http"), priority=0))
    outcomes = await asyncio.wait_for(asyncio.gather(*subs), 5)
    assert [said(o) for o in outcomes][-1] == ["answer:http"]
    assert sorted(engine.order) == ["bulk0", "bulk1", "bulk2", "http"]
    await b.close()


async def test_a_class_out_of_range_is_refused() -> None:
    b: FakeBatcher = Batcher(FakeEngine(), settings(), clock=ManualClock())
    await b.start()
    with pytest.raises(ValueError, match=r"outside 0\.\.2"):
        b.submit(ident, items("x"), priority=3)
    await b.close()


def test_run_names_the_hook_it_was_given() -> None:
    """The fake passes `between` through like the engine: a sanity check of the stand-in itself."""
    seen: list[int] = []
    engine = GatedEngine()
    engine.open.set()
    engine.run([Item("bulk")], lambda: seen.append(1))
    assert seen == []  # open before the first layer: no boundary reached
    engine.open.clear()

    def release() -> None:
        seen.append(1)
        engine.open.set()

    engine.run([Item("bulk")], release)
    assert seen == [1]
