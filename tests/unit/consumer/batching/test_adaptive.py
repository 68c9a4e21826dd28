"""Adaptive batching: the cost model, the pure planning rule, and the batcher on an injected clock with a
GPU that runs only when the test lets it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from consumer.batching.adaptive import (
    AdaptiveDecision,
    AdaptiveView,
    CostLike,
    CostModel,
    GpuQueue,
    TimerLateness,
    adaptive_budget,
    plan_adaptive,
)
from consumer.batching.batcher import Batcher
from consumer.clock import ManualClock
from consumer.metrics import Metrics
from consumer.settings import BatchingSettings
from engine.batching.cut import BatchLimits
from engine.types import Between
from schemas.response import SystemOneResponse
from tests.unit.consumer.batching.fakes import FakeEngine, Item, answer, ident, said

FakeBatcher = Batcher[Item, list[Item], list[SystemOneResponse]]


class FixedCost:
    """A cost model with fixed answers: every batch takes `seconds`; `within` tokens fit any time."""

    def __init__(self, seconds: float = 0.1, within: int = 1000) -> None:
        self.seconds = seconds
        self.within = within
        self.observed: list[int] = []

    def observe(self, tokens: int, seconds: float) -> None:
        self.observed.append(tokens)

    def predict(self, tokens: int) -> float | None:
        return self.seconds

    def tokens_within(self, seconds: float) -> int | None:
        return self.within


class GatedEngine(FakeEngine):
    """Runs a batch (64 records, 1,000 tokens at most) only after the test calls `allow()` once for it (a
    GPU the test keeps busy)."""

    def __init__(self) -> None:
        super().__init__(BatchLimits(max_tokens=1000, max_records=64))
        self._gate = threading.Semaphore(0)

    def allow(self, n: int = 1) -> None:
        for _ in range(n):
            self._gate.release()

    def run(self, staged: list[Item], between: Between | None = None) -> list[SystemOneResponse]:
        self.batches.append([i.name for i in staged])  # started on the GPU thread
        if not self._gate.acquire(timeout=5):
            raise TimeoutError("test never allowed this batch")
        return [answer(i) for i in staged]


def adaptive(**kw: float | str) -> BatchingSettings:
    base: dict[str, float | str] = {
        "mode": "adaptive",
        "max_wait_ms": 50,
        "latency_target_ms": 200,
        "prepare_chunk": 8,
    }
    base.update(kw)
    return BatchingSettings.model_validate(base)


async def settle(rounds: int = 40) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0.002)


def test_cost_model_fits_overhead_and_per_token_time() -> None:
    cost = CostModel()
    assert cost.predict(100) is None
    assert cost.tokens_within(1.0) is None
    for tokens in (100, 400, 1600, 3200):
        cost.observe(tokens, 0.010 + 1e-5 * tokens)
    assert cost.overhead == pytest.approx(0.010)
    assert cost.per_token == pytest.approx(1e-5)
    assert cost.predict(1000) == pytest.approx(0.020)
    assert cost.tokens_within(0.030) == pytest.approx(2000, abs=1)


def test_cost_model_with_one_batch_size_uses_the_mean_time_per_token() -> None:
    cost = CostModel()
    for _ in range(3):
        cost.observe(1000, 0.05)
    assert cost.overhead == 0.0
    assert cost.predict(2000) == pytest.approx(0.1)


def test_cost_model_forgets_old_batches() -> None:
    cost = CostModel(window=4)
    for tokens in (100, 200, 300, 400):
        cost.observe(tokens, 1e-3 * tokens)  # a slow GPU
    for tokens in (100, 200, 300, 400):
        cost.observe(tokens, 1e-5 * tokens)  # then a fast one
    assert cost.per_token == pytest.approx(1e-5)


def test_budget_follows_the_latency_target_until_a_backlog_builds() -> None:
    cost = CostModel()
    for tokens in (1000, 2000):
        cost.observe(tokens, 1e-4 * tokens)  # 10k tokens/s, no overhead
    # half of a 200 ms target is 100 ms: 1,000 tokens
    assert adaptive_budget(cost, max_tokens=50_000, latency_target=0.2, head_age=0.0) == 1000
    assert adaptive_budget(cost, max_tokens=500, latency_target=0.2, head_age=0.0) == 500
    assert adaptive_budget(cost, max_tokens=50_000, latency_target=0.2, head_age=0.11) == 50_000
    assert adaptive_budget(CostModel(), max_tokens=777, latency_target=0.2, head_age=0.0) == 777


def test_plan_cuts_at_once_when_idle_and_just_in_time_when_busy() -> None:
    cost = FixedCost(seconds=0.1, within=1000)
    limits = BatchLimits(max_tokens=1000, max_records=64)

    def plan(tokens: list[int], view: AdaptiveView, model: CostLike) -> AdaptiveDecision:
        return plan_adaptive(tokens, view, model, limits=limits, latency_target=0.2, fallback_wait=0.05)

    idle = plan([10], AdaptiveView(0.0, 0.0, 0.002), cost)
    assert (idle.count, idle.wait) == (1, 0.0)
    busy = plan([10, 10], AdaptiveView(0.0, 0.08, 0.002), cost)
    assert busy.count == 2
    assert busy.wait == pytest.approx(0.078)
    full = plan([600, 600], AdaptiveView(0.0, 0.08, 0.002), cost)
    assert (full.count, full.wait) == (1, 0.0)
    blind = plan([10], AdaptiveView(0.0, 0.08, 0.0), CostModel())
    assert blind.wait == 0.05  # busy but no cost model yet: the fixed wait
    tight = plan([10] * 70, AdaptiveView(0.0, 0.08, 0.002), FixedCost(within=25))
    assert (tight.count, tight.wait, tight.budget) == (2, 0.0, 25)  # the adaptive budget cuts, and is full
    many = plan([1] * 70, AdaptiveView(0.0, 0.08, 0.002), cost)
    assert (many.count, many.wait) == (64, 0.0)  # the engine's record limit holds under any budget


def test_a_busy_gpu_gets_a_graph_sized_batch_cut_now_instead_of_a_little_larger_one() -> None:
    """The engine's largest CUDA graph (`BatchLimits.graph_tokens`): 12 records of 800 tokens would run
    eagerly; 10 of them (8,000 tokens) go now, full, and the other two wait for the next batch."""
    cost = FixedCost(seconds=0.1, within=20_000)
    limits = BatchLimits(max_tokens=32_768, max_records=256, graph_tokens=8_192)
    view = AdaptiveView(0.0, 0.08, 0.002)
    snapped = plan_adaptive([800] * 12, view, cost, limits=limits, latency_target=0.25, fallback_wait=0.02)
    assert (snapped.count, snapped.wait) == (10, 0.0)
    plain = plan_adaptive(
        [800] * 12, view, cost, limits=limits.with_graph(0), latency_target=0.25, fallback_wait=0.02
    )
    assert plain.count == 12
    assert plain.wait == pytest.approx(0.078)  # just in time, all twelve


def test_the_gpu_queue_hands_back_each_batch_s_prediction_from_its_cut() -> None:
    queue = GpuQueue(CostModel())
    queue.cut(100, 0.0, 0.0)
    assert queue.done(100, 0.01, 0.01, learn=True) is None  # cut before the model had a fit
    queue.cut(200, 0.01, 0.0)
    assert queue.done(200, 0.02, 0.03, learn=True) is None
    queue.cut(300, 0.03, 0.0)  # the fit: 0.1 ms a token, no overhead
    queue.cut(400, 0.03, 0.0)
    assert queue.done(300, 0.05, 0.08, learn=True) == pytest.approx(0.03)
    assert queue.done(400, 0.04, 0.12, learn=True) == pytest.approx(0.04)  # from its cut, not the refit
    assert not queue.busy


@pytest.mark.parametrize(("predicted", "direction"), [(10.0, "under"), (1e-9, "over")])
async def test_the_batcher_records_a_batch_s_gpu_time_against_its_prediction(
    predicted: float, direction: str
) -> None:
    engine = GatedEngine()
    engine.allow(1)
    metrics = Metrics()
    cost = FixedCost(seconds=predicted)
    b: FakeBatcher = Batcher(engine, adaptive(), clock=ManualClock(), cost=cost, metrics=metrics)
    await b.start()
    assert said(await asyncio.wait_for(b.submit(ident, [Item("a")]), 5)) == ["answer:a"]
    await settle()
    await b.close()
    other = "over" if direction == "under" else "under"
    assert metrics.batch_cost_error.labels(direction).count == 1
    assert metrics.batch_cost_error.labels(other).count == 0
    assert 0.0 < metrics.batch_cost_error.labels(direction).sum < 10.0 + 1e-9
    assert "clef_router_batch_cost_error_seconds_count{direction=" in metrics.render().decode()


async def test_idle_gpu_takes_a_lone_record_at_once() -> None:
    engine = GatedEngine()
    engine.allow(10)
    b: FakeBatcher = Batcher(engine, adaptive(), clock=ManualClock(), cost=FixedCost())
    await b.start()
    fut = b.submit(ident, [Item("a")])
    await settle()
    assert engine.batches == [["a"]]  # no max_wait_ms (50 ms on a clock that never moved)
    assert said(fut.result()) == ["answer:a"]
    await b.close()


async def test_busy_gpu_cut_waits_for_its_predicted_end_and_takes_everything_ready() -> None:
    clock = ManualClock()
    engine = GatedEngine()
    metrics = Metrics()
    cost = FixedCost(seconds=0.1)
    b: FakeBatcher = Batcher(engine, adaptive(), clock=clock, cost=cost, metrics=metrics)
    await b.start()
    b.submit(ident, [Item("a")])
    await settle()
    assert engine.batches == [["a"]]  # running, held by the gate
    b.submit(ident, [Item("b0"), Item("b1")])
    await settle()
    await clock.advance(0.05)
    b.submit(ident, [Item("b2")])
    await settle()
    assert b.pending == 3, "cut before the GPU could take it"
    await clock.advance(0.06)  # past the predicted end of "a"
    await settle()
    assert b.pending == 0
    engine.allow(2)
    await settle()
    assert engine.batches == [["a"], ["b0", "b1", "b2"]]
    assert cost.observed == [10, 30]
    assert metrics.batch_fill.count == 2
    text = metrics.render().decode()
    busy = [line for line in text.splitlines() if line.startswith("clef_router_gpu_busy_seconds_total ")]
    assert busy
    assert float(busy[0].split()[1]) > 0
    assert "clef_router_batch_budget_tokens 1000.0" in text  # the budget of the last cut
    assert 'clef_router_batch_fill_ratio_bucket{le="0.05"} 2.0' in text  # 10 and 30 of 1,000 tokens
    await b.close()


async def test_gpu_finishing_early_takes_the_queue_at_once() -> None:
    clock = ManualClock()
    engine = GatedEngine()
    b: FakeBatcher = Batcher(engine, adaptive(), clock=clock, cost=FixedCost(seconds=10.0))
    await b.start()
    b.submit(ident, [Item("a")])
    await settle()
    b.submit(ident, [Item("b0"), Item("b1")])
    await settle()
    assert b.pending == 2
    engine.allow()  # "a" ends long before its prediction
    await settle()
    assert b.pending == 0
    engine.allow()
    await settle()
    assert engine.batches == [["a"], ["b0", "b1"]]
    await b.close()


@pytest.mark.parametrize(
    ("backlog_batches", "after_the_wait"),
    [(0.0, [["r4", "r5", "r6"]]), (1.0, [["r4", "r5", "r6"]]), (2.0, [["r4", "r5"], ["r6"]])],
)
async def test_latency_budget_slices_a_burst_then_a_backlog_opens_it(
    backlog_batches: float, after_the_wait: list[list[str]]
) -> None:
    """Target-sized batches (2 records) until the oldest record waited half the target; then the budget
    opens when at least `backlog_batches` target-sized batches wait (3 records of 10 tokens = 1.2 of 25),
    else the slices go on."""
    clock = ManualClock()
    engine = GatedEngine()
    cost = FixedCost(seconds=0.05, within=25)  # half the target fits 2 records of 10 tokens
    settings = adaptive(max_pending_batches=1, backlog_batches=backlog_batches)
    b: FakeBatcher = Batcher(engine, settings, clock=clock, cost=cost)
    await b.start()
    b.submit(ident, [Item(f"r{i}") for i in range(7)])
    await settle()
    assert engine.batches == [["r0", "r1"]]
    engine.allow()
    await settle()
    assert engine.batches[1:] == [["r2", "r3"]]
    await clock.advance(0.11)  # the queue's oldest record has now waited over half the 200 ms target
    for _ in after_the_wait:
        engine.allow()
        await settle()
    assert engine.batches[2:] == after_the_wait
    engine.allow()
    await b.close()


async def test_fixed_mode_still_waits_for_max_wait() -> None:
    clock = ManualClock()
    engine = GatedEngine()
    engine.allow(10)
    b: FakeBatcher = Batcher(engine, adaptive(mode="fixed"), clock=clock, cost=FixedCost())
    await b.start()
    b.submit(ident, [Item("a")])
    await settle()
    assert engine.batches == []
    await clock.advance(0.051)
    await settle()
    assert engine.batches == [["a"]]
    await b.close()


def test_a_short_burst_keeps_target_sized_batches_when_asked() -> None:
    """With `backlog_batches`, a head that waited past half the target opens the budget only when more
    than that many target-sized batches of tokens wait."""
    cost = CostModel()
    for tokens in (1000, 2000):
        cost.observe(tokens, 1e-4 * tokens)  # 1,000 tokens in half of a 200 ms target
    late = {"max_tokens": 50_000, "latency_target": 0.2, "head_age": 0.11}
    assert adaptive_budget(cost, **late, queued_tokens=1500, backlog_batches=2.0) == 1000
    assert adaptive_budget(cost, **late, queued_tokens=2001, backlog_batches=2.0) == 50_000
    assert adaptive_budget(cost, **late, queued_tokens=1500) == 50_000  # 0: the wait alone opens it
    assert (
        adaptive_budget(cost, **{**late, "head_age": 0.05}, queued_tokens=9999, backlog_batches=2.0) == 1000
    )


def test_timer_lateness_averages_how_late_waits_wake_and_caps_a_stall() -> None:
    late = TimerLateness(cap=0.005, weight=0.5)
    assert late.value == 0.0
    late.observe(0.010, 0.011)  # 1 ms late
    assert late.value == pytest.approx(0.0005)
    late.observe(0.010, 0.011)
    assert late.value == pytest.approx(0.00075)
    late.observe(0.010, 0.009)  # early (another clock's rounding): counts as on time
    assert late.value == pytest.approx(0.000375)
    late.observe(0.010, 1.0)  # a stalled loop: counted as `cap`, not 990 ms
    assert late.value == pytest.approx(0.0026875)
