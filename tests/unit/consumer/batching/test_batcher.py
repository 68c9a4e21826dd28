"""Batcher flush rules on an injected clock, the engine's limits, prepare errors, one GPU thread, OOM
splitting, and the staged path (only `run` on the GPU thread)."""

from __future__ import annotations

import asyncio

import pytest

from consumer.batching.batcher import Batcher
from consumer.clock import ManualClock
from consumer.metrics import Metrics
from consumer.settings import BatchingSettings
from engine.batching.cut import BatchLimits
from engine.batching.split import EngineError
from engine.types import Between
from schemas.errors import DlqReason, RequestError
from schemas.response import SystemOneResponse
from tests.unit.consumer.batching.fakes import FakeEngine, Item, OutOfMemoryError, answer, ident, items, said

FakeBatcher = Batcher[Item, list[Item], list[SystemOneResponse]]


def settings(**kw: float | str) -> BatchingSettings:
    base: dict[str, float | str] = {"mode": "fixed", "max_wait_ms": 50, "prepare_chunk": 2}
    base.update(kw)
    return BatchingSettings.model_validate(base)


async def settle(rounds: int = 50) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0.002)


async def test_flush_on_max_records_without_waiting() -> None:
    clock = ManualClock()
    engine = FakeEngine()
    b: FakeBatcher = Batcher(engine, settings(), clock=clock)
    await b.start()
    fut = b.submit(ident, items("r0", "r1", "r2", "r3"))
    await settle()
    assert engine.batches == [["r0", "r1", "r2", "r3"]]
    assert said(fut.result()) == [f"answer:r{i}" for i in range(4)]
    await b.close()


async def test_the_engines_limits_cut_not_the_settings() -> None:
    engine = FakeEngine(BatchLimits(max_tokens=25, max_records=3))
    b: FakeBatcher = Batcher(
        engine, settings(max_batch_records=1, max_batch_tokens=10_000), clock=ManualClock()
    )
    await b.start()
    b.submit(ident, [Item("a", 10), Item("b", 10), Item("c", 10), Item("d", 5), Item("e", 5), Item("f", 5)])
    await settle()
    assert engine.batches[:2] == [["a", "b"], ["c", "d", "e"]]  # 30 > 25 tokens; then 3 records
    await b.close()


async def test_flush_on_max_wait_only_after_the_deadline() -> None:
    clock = ManualClock()
    engine = FakeEngine()
    b: FakeBatcher = Batcher(engine, settings(max_wait_ms=50), clock=clock)
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
    assert said(fut.result()) == ["answer:a", "answer:b"]
    await b.close()


async def test_flush_on_token_budget() -> None:
    clock = ManualClock()
    engine = FakeEngine(BatchLimits(max_tokens=100, max_records=4))
    b: FakeBatcher = Batcher(engine, settings(prepare_chunk=8), clock=clock)
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
    b: FakeBatcher = Batcher(engine, settings(), clock=clock)
    await b.start()
    fut = b.submit(ident, items("a", "bad", "b"))
    await settle()
    await clock.advance(0.06)
    await settle()
    outcomes = said(fut.result())
    assert outcomes[0] == "answer:a"
    assert outcomes[2] == "answer:b"
    exc = outcomes[1]
    assert isinstance(exc, RequestError)
    assert exc.reason == DlqReason.bad_json
    await b.close()


async def test_one_gpu_thread_and_poison_record_isolated() -> None:
    clock = ManualClock()
    engine = FakeEngine(fail_on={"r2"})
    b: FakeBatcher = Batcher(engine, settings(), clock=clock, single_attempts=2)
    await b.start()
    fut = b.submit(ident, [Item(f"r{i}") for i in range(8)])
    await settle()
    gpu_threads = {thread for step, thread in engine.steps if step in ("run", "execute")}
    assert len(gpu_threads) == 1
    assert next(iter(gpu_threads)).startswith("clef-gpu")
    results = said(fut.result())
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
    b: FakeBatcher = Batcher(engine, settings(), clock=clock)
    await b.start()
    fut = b.submit(ident, [Item(f"r{i}") for i in range(4)])
    await settle()
    assert said(fut.result()) == [f"answer:r{i}" for i in range(4)]
    assert engine.oom_calls
    assert engine.batches[0] == ["r0", "r1", "r2", "r3"]
    assert ["r0"] in engine.batches
    assert ["r3"] in engine.batches
    await b.close()


async def test_close_flushes_without_waiting_for_the_deadline() -> None:
    clock = ManualClock()
    engine = FakeEngine()
    b: FakeBatcher = Batcher(engine, settings(max_wait_ms=10_000), clock=clock)
    await b.start()
    fut = b.submit(ident, items("a"))
    await settle()
    await b.close(timeout_s=2)
    assert said(fut.result()) == ["answer:a"]
    with pytest.raises(RuntimeError):
        b.submit(ident, items("late"))


async def test_one_future_per_submission_resolves_after_its_last_batch() -> None:
    clock = ManualClock()
    engine = FakeEngine()
    metrics = Metrics()
    b: FakeBatcher = Batcher(engine, settings(), clock=clock, metrics=metrics)
    await b.start()
    first = b.submit(ident, items("a0", "a1", "a2"))
    second = b.submit(ident, items("b0", "b1", "b2"))
    await settle()
    assert engine.batches == [["a0", "a1", "a2", "b0"]]  # submissions share a batch, in order
    assert said(first.result()) == ["answer:a0", "answer:a1", "answer:a2"]
    assert not second.done()  # b1 and b2 wait for the deadline of a batch that is not full
    await clock.advance(0.06)
    await settle()
    assert engine.batches[1:] == [["b1", "b2"]]
    assert said(second.result()) == ["answer:b0", "answer:b1", "answer:b2"]
    assert metrics.queue_wait.count == 6  # one observation per record, even when observed in bulk
    await b.close()


async def test_empty_and_all_failed_submissions_resolve_without_the_engine() -> None:
    engine = FakeEngine()
    b: FakeBatcher = Batcher(engine, settings(), clock=ManualClock())
    await b.start()
    assert await b.submit(ident, []) == []
    outcomes = await asyncio.wait_for(b.submit(ident, items("bad1", "bad2")), 2)
    assert all(isinstance(o, RequestError) for o in outcomes)
    assert engine.batches == []
    await b.close()


class StagedFake(FakeEngine):
    """Fails where the real engine's steps would: an OOM in `run` (the GPU), unusable output in `respond`
    (the CPU pool); `execute` fails on both, as `respond(run(stage(batch)))` would."""

    def run(self, staged: list[Item], between: Between | None = None) -> list[SystemOneResponse]:
        self._note("run")
        self.batches.append([i.name for i in staged])
        if self.oom_above is not None and len(staged) > self.oom_above:
            raise OutOfMemoryError("CUDA out of memory")
        return [answer(i) for i in staged]

    def respond(self, ran: list[SystemOneResponse]) -> list[SystemOneResponse]:
        self._note("respond")
        if any(f"answer:{name}" in said(ran) for name in self.fail_on):
            raise ValueError("poisoned batch")
        return ran


async def test_staged_engine_keeps_only_run_on_the_gpu_thread() -> None:
    engine = StagedFake()
    b: FakeBatcher = Batcher(engine, settings(), clock=ManualClock())
    await b.start()
    fut = b.submit(ident, [Item(f"r{i}") for i in range(8)])
    await settle()
    assert said(fut.result()) == [f"answer:r{i}" for i in range(8)]
    assert engine.executed == [], "execute is not called when the staged steps succeed"
    assert [step for step, _ in engine.steps].count("run") == 2
    for step, thread in engine.steps:
        assert thread.startswith("clef-gpu") == (step == "run"), (step, thread)
    await b.close()


async def test_staged_failure_falls_back_to_splitting_execute() -> None:
    engine = StagedFake(fail_on={"r2"}, oom_above=8)
    b: FakeBatcher = Batcher(engine, settings(), clock=ManualClock(), single_attempts=1)
    await b.start()
    fut = b.submit(ident, [Item(f"r{i}") for i in range(8)])
    await settle()
    results = said(fut.result())
    assert results[:2] == ["answer:r0", "answer:r1"]
    assert isinstance(results[2], EngineError)
    assert results[3:] == [f"answer:r{i}" for i in range(3, 8)]
    assert ["r0", "r1", "r2", "r3"] not in engine.executed, "the failed batch is split, not run whole again"
    assert ["r0", "r1"] in engine.executed
    assert engine.oom_calls == []
    await b.close()


async def test_staged_oom_empties_the_cache_and_splits() -> None:
    engine = StagedFake(oom_above=2)
    b: FakeBatcher = Batcher(engine, settings(), clock=ManualClock())
    await b.start()
    fut = b.submit(ident, [Item(f"r{i}") for i in range(4)])
    await settle()
    assert said(fut.result()) == [f"answer:r{i}" for i in range(4)]
    assert engine.executed[0] == ["r0", "r1"], "after the staged OOM, execute starts with the halves"
    assert ["r0", "r1", "r2", "r3"] not in engine.executed
    assert engine.oom_calls
    assert all(name.startswith("clef-gpu") for name in engine.oom_calls)
    await b.close()
