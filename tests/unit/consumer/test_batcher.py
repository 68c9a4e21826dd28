"""Batcher flush rules on an injected clock, prepare errors, one GPU thread, OOM splitting."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest

from consumer.batching.batcher import Batcher, StagedCalls, plan_next
from consumer.clock import ManualClock
from consumer.metrics import Metrics
from consumer.settings import BatchingSettings
from engine.batching.split import EngineError
from schemas.errors import DlqReason, RequestError


@dataclass(frozen=True)
class Item:
    name: str
    num_tokens: int = 10


class FakeEngine:
    """Records every batch and the thread it ran on; `fail_on` names raise; OOM above `oom_above` records."""

    def __init__(self, fail_on: set[str] | None = None, oom_above: int | None = None) -> None:
        self.batches: list[list[str]] = []
        self.threads: set[str] = set()
        self.fail_on = fail_on or set()
        self.oom_above = oom_above

    def execute(self, batch: Sequence[Item]) -> list[str]:
        self.threads.add(threading.current_thread().name)
        self.batches.append([i.name for i in batch])
        if self.oom_above is not None and len(batch) > self.oom_above:
            raise OutOfMemoryError("CUDA out of memory")
        if any(i.name in self.fail_on for i in batch):
            raise ValueError("poisoned batch")
        return [f"answer:{i.name}" for i in batch]


class OutOfMemoryError(RuntimeError):
    """Stands in for torch.OutOfMemoryError (the engine's `out_of_memory` tells it apart, not the batcher)."""


def oom_check(calls: list[str]) -> Callable[[BaseException], bool]:
    """An engine's `out_of_memory`: True for `OutOfMemoryError`, noting the thread it was asked on."""

    def out_of_memory(exc: BaseException) -> bool:
        oom = isinstance(exc, OutOfMemoryError)
        if oom:
            calls.append(threading.current_thread().name)
        return oom

    return out_of_memory


def staged(engine: StagedFake) -> StagedCalls[Item, str]:
    return StagedCalls(engine.stage, engine.run, engine.respond)


def ident(item: Item) -> Item:
    """The prepare function of these tests: the item itself; names starting with "bad" fail to prepare."""
    if item.name.startswith("bad"):
        raise RequestError(DlqReason.bad_json, "nope")
    return item


def items(*names: str) -> list[Item]:
    return [Item(name) for name in names]


def settings(**kw: float | str) -> BatchingSettings:
    base: dict[str, float | str] = {
        "mode": "fixed",
        "max_batch_records": 4,
        "max_batch_tokens": 1000,
        "max_wait_ms": 50,
        "prepare_chunk": 2,
    }
    base.update(kw)
    return BatchingSettings.model_validate(base)


async def settle(clock: ManualClock | None = None, rounds: int = 50) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0.002)


def test_plan_next_rules() -> None:
    assert plan_next([10, 10, 10], max_records=4, max_tokens=100) == (3, False)
    assert plan_next([10] * 5, max_records=4, max_tokens=100) == (4, True)
    assert plan_next([60, 50], max_records=4, max_tokens=100) == (1, True)  # next does not fit
    assert plan_next([500, 10], max_records=4, max_tokens=100) == (1, True)  # oversized runs alone
    assert plan_next([50, 50, 1], max_records=4, max_tokens=100) == (2, True)  # budget used exactly
    assert plan_next([], max_records=4, max_tokens=100) == (0, False)


async def test_flush_on_max_records_without_waiting() -> None:
    clock = ManualClock()
    engine = FakeEngine()
    b: Batcher[Item, str] = Batcher(engine.execute, settings(), clock=clock)
    await b.start()
    fut = b.submit(ident, items("r0", "r1", "r2", "r3"))
    await settle()
    assert engine.batches == [["r0", "r1", "r2", "r3"]]
    assert fut.result() == [f"answer:r{i}" for i in range(4)]
    await b.close()


async def test_flush_on_max_wait_only_after_the_deadline() -> None:
    clock = ManualClock()
    engine = FakeEngine()
    b: Batcher[Item, str] = Batcher(engine.execute, settings(max_wait_ms=50), clock=clock)
    await b.start()
    fut = b.submit(ident, items("a", "b"))
    await settle()
    assert engine.batches == []  # 2 < 4 records, deadline not reached
    await clock.advance(0.049)
    await settle()
    assert engine.batches == []
    await clock.advance(0.002)
    await settle()
    assert engine.batches == [["a", "b"]]
    assert fut.result() == ["answer:a", "answer:b"]
    await b.close()


async def test_flush_on_token_budget() -> None:
    clock = ManualClock()
    engine = FakeEngine()
    b: Batcher[Item, str] = Batcher(
        engine.execute, settings(max_batch_tokens=100, prepare_chunk=8), clock=clock
    )
    await b.start()
    b.submit(ident, [Item("big", 70), Item("next", 40), Item("small", 10)])
    await settle()
    assert engine.batches[0] == ["big"]  # "next" would exceed 100 tokens
    await clock.advance(0.06)
    await settle()
    assert engine.batches[1:] == [["next", "small"]]
    await b.close()


async def test_prepare_errors_fail_only_their_record() -> None:
    clock = ManualClock()
    engine = FakeEngine()
    b: Batcher[Item, str] = Batcher(engine.execute, settings(), clock=clock)
    await b.start()
    fut = b.submit(ident, items("a", "bad", "b"))
    await settle()
    await clock.advance(0.06)
    await settle()
    outcomes = fut.result()
    assert outcomes[0] == "answer:a"
    assert outcomes[2] == "answer:b"
    exc = outcomes[1]
    assert isinstance(exc, RequestError)
    assert exc.reason == DlqReason.bad_json
    await b.close()


async def test_one_gpu_thread_and_poison_record_isolated() -> None:
    clock = ManualClock()
    engine = FakeEngine(fail_on={"r2"})
    b: Batcher[Item, str] = Batcher(engine.execute, settings(), clock=clock, single_attempts=2)
    await b.start()
    fut = b.submit(ident, [Item(f"r{i}") for i in range(8)])
    await settle()
    assert len(engine.threads) == 1
    assert next(iter(engine.threads)).startswith("clef-gpu")
    results = fut.result()
    assert results[:2] == ["answer:r0", "answer:r1"]
    assert results[3:] == [f"answer:r{i}" for i in range(3, 8)]
    failure = results[2]
    assert isinstance(failure, EngineError)
    assert failure.reason == DlqReason.engine_failed
    assert failure.attempts == 2
    await b.close()


async def test_oom_splits_the_batch() -> None:
    clock = ManualClock()
    engine = FakeEngine(oom_above=1)
    oom_calls: list[str] = []
    b: Batcher[Item, str] = Batcher(
        engine.execute, settings(), clock=clock, out_of_memory=oom_check(oom_calls)
    )
    await b.start()
    fut = b.submit(ident, [Item(f"r{i}") for i in range(4)])
    await settle()
    assert fut.result() == [f"answer:r{i}" for i in range(4)]
    assert oom_calls
    assert engine.batches[0] == ["r0", "r1", "r2", "r3"]
    assert ["r0"] in engine.batches
    assert ["r3"] in engine.batches
    await b.close()


async def test_close_flushes_without_waiting_for_the_deadline() -> None:
    clock = ManualClock()
    engine = FakeEngine()
    b: Batcher[Item, str] = Batcher(engine.execute, settings(max_wait_ms=10_000), clock=clock)
    await b.start()
    fut = b.submit(ident, items("a"))
    await settle()
    await b.close(timeout_s=2)
    assert fut.result() == ["answer:a"]
    with pytest.raises(RuntimeError):
        b.submit(ident, items("late"))


async def test_one_future_per_submission_resolves_after_its_last_batch() -> None:
    clock = ManualClock()
    engine = FakeEngine()
    metrics = Metrics()
    b: Batcher[Item, str] = Batcher(engine.execute, settings(), clock=clock, metrics=metrics)
    await b.start()
    first = b.submit(ident, items("a0", "a1", "a2"))
    second = b.submit(ident, items("b0", "b1", "b2"))
    await settle()
    assert engine.batches == [["a0", "a1", "a2", "b0"]]  # submissions share a batch, in order
    assert first.result() == ["answer:a0", "answer:a1", "answer:a2"]
    assert not second.done()  # b1 and b2 wait for the deadline of a batch that is not full
    await clock.advance(0.06)
    await settle()
    assert engine.batches[1:] == [["b1", "b2"]]
    assert second.result() == ["answer:b0", "answer:b1", "answer:b2"]
    assert metrics.queue_wait.count == 6  # one observation per record, even when observed in bulk
    await b.close()


async def test_empty_and_all_failed_submissions_resolve_without_the_engine() -> None:
    engine = FakeEngine()
    b: Batcher[Item, str] = Batcher(engine.execute, settings(), clock=ManualClock())
    await b.start()
    assert await b.submit(ident, []) == []
    outcomes = await asyncio.wait_for(b.submit(ident, items("bad1", "bad2")), 2)
    assert all(isinstance(o, RequestError) for o in outcomes)
    assert engine.batches == []
    await b.close()


class StagedFake(FakeEngine):
    """A fake with the engine's three-step execute; records the thread of every step."""

    def __init__(self, fail_on: set[str] | None = None, oom_above: int | None = None) -> None:
        super().__init__(fail_on, oom_above)
        self.steps: list[tuple[str, str]] = []

    def _note(self, step: str) -> None:
        self.steps.append((step, threading.current_thread().name))

    def stage(self, batch: Sequence[Item]) -> list[Item]:
        self._note("stage")
        return list(batch)

    def run(self, staged: list[Item]) -> list[Item]:
        self._note("run")
        if self.oom_above is not None and len(staged) > self.oom_above:
            raise OutOfMemoryError("CUDA out of memory")
        return staged

    def respond(self, ran: list[Item]) -> list[str]:
        self._note("respond")
        if any(i.name in self.fail_on for i in ran):
            raise ValueError("poisoned batch")
        return [f"answer:{i.name}" for i in ran]


async def test_staged_engine_keeps_only_run_on_the_gpu_thread() -> None:
    engine = StagedFake()
    calls = staged(engine)
    b: Batcher[Item, str] = Batcher(engine.execute, settings(), clock=ManualClock(), stages=calls)
    await b.start()
    fut = b.submit(ident, [Item(f"r{i}") for i in range(8)])
    await settle()
    assert fut.result() == [f"answer:r{i}" for i in range(8)]
    assert engine.batches == [], "execute is not called when the staged steps succeed"
    assert [step for step, _ in engine.steps].count("run") == 2
    for step, thread in engine.steps:
        assert thread.startswith("clef-gpu") == (step == "run"), (step, thread)
    await b.close()


async def test_staged_failure_falls_back_to_splitting_execute() -> None:
    engine = StagedFake(fail_on={"r2"}, oom_above=8)
    calls = staged(engine)
    oom_calls: list[str] = []
    b: Batcher[Item, str] = Batcher(
        engine.execute,
        settings(),
        clock=ManualClock(),
        single_attempts=1,
        out_of_memory=oom_check(oom_calls),
        stages=calls,
    )
    await b.start()
    fut = b.submit(ident, [Item(f"r{i}") for i in range(8)])
    await settle()
    results = fut.result()
    assert results[:2] == ["answer:r0", "answer:r1"]
    assert isinstance(results[2], EngineError)
    assert results[3:] == [f"answer:r{i}" for i in range(3, 8)]
    assert ["r0", "r1", "r2", "r3"] not in engine.batches, "the failed batch is split, not run whole again"
    assert ["r0", "r1"] in engine.batches
    assert oom_calls == []
    await b.close()


async def test_staged_oom_empties_the_cache_and_splits() -> None:
    engine = StagedFake(oom_above=2)
    oom_calls: list[str] = []
    b: Batcher[Item, str] = Batcher(
        engine.execute,
        settings(),
        clock=ManualClock(),
        out_of_memory=oom_check(oom_calls),
        stages=staged(engine),
    )
    await b.start()
    fut = b.submit(ident, [Item(f"r{i}") for i in range(4)])
    await settle()
    assert fut.result() == [f"answer:r{i}" for i in range(4)]
    assert engine.batches[0] == ["r0", "r1"], "after the staged OOM, execute starts with the halves"
    assert ["r0", "r1", "r2", "r3"] not in engine.batches
    assert oom_calls
    assert all(name.startswith("clef-gpu") for name in oom_calls)
    await b.close()
