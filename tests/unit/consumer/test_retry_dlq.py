"""Split-on-failure, transient retries and the DLQ guard / DLQ record."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from aiokafka.errors import KafkaConnectionError, RecordTooLargeError

from consumer.dlq import DlqGuard, DlqGuardTrippedError, dead_letter
from consumer.retry import EngineError, is_oom, is_transient, run_split, transient_retry
from consumer.router import InputRecord
from consumer.settings import DlqSettings
from schemas.dead_letter import parse_dlq_headers
from schemas.errors import DlqReason, RequestError


class OutOfMemoryError(RuntimeError):
    pass


def test_single_oom_record_goes_to_dlq_and_the_rest_are_answered() -> None:
    calls: list[list[int]] = []

    def execute(batch: Sequence[int]) -> list[int]:
        calls.append(list(batch))
        if 3 in batch:
            raise OutOfMemoryError("CUDA out of memory")
        return [x * 10 for x in batch]

    oom_hooks: list[int] = []
    result = run_split(execute, [1, 2, 3, 4, 5], single_attempts=1, on_oom=lambda: oom_hooks.append(1))
    outcomes = result.outcomes
    assert outcomes[:2] == [10, 20]
    assert outcomes[3:] == [40, 50]
    failure = outcomes[2]
    assert isinstance(failure, EngineError)
    assert failure.reason == DlqReason.oom_single_record
    assert result.stats.splits >= 2
    assert result.stats.ooms == len(oom_hooks)


def test_a_failure_reported_by_the_caller_starts_the_splitting() -> None:
    calls: list[list[int]] = []

    def execute(batch: Sequence[int]) -> list[int]:
        calls.append(list(batch))
        return [x * 10 for x in batch]

    oom_hooks: list[int] = []
    failed = OutOfMemoryError("CUDA out of memory")
    result = run_split(execute, [1, 2, 3, 4], on_oom=lambda: oom_hooks.append(1), failed=failed)
    assert result.outcomes == [10, 20, 30, 40]
    assert calls == [[1, 2], [3, 4]], "the whole batch is not run again"
    assert (result.stats.calls, result.stats.splits, result.stats.ooms) == (3, 1, 1)
    assert oom_hooks == [1]
    alone = run_split(execute, [7], single_attempts=1, failed=ValueError("nan"))
    assert isinstance(alone.outcomes[0], EngineError)
    assert alone.outcomes[0].reason == DlqReason.engine_failed


def test_wrong_result_count_is_treated_as_failure() -> None:
    result = run_split(lambda batch: [0], [1, 2], single_attempts=1)
    assert result.outcomes == [0, 0]  # each half answered alone


def test_is_oom_and_is_transient() -> None:
    assert is_oom(OutOfMemoryError("x"))
    assert is_oom(RuntimeError("CUDA out of memory. Tried to allocate"))
    assert not is_oom(ValueError("x"))
    assert is_transient(KafkaConnectionError())
    assert is_transient(TimeoutError())
    assert not is_transient(RecordTooLargeError())
    assert not is_transient(ValueError())


async def test_transient_retry_retries_then_reraises() -> None:
    calls: list[int] = []

    async def failing() -> None:
        async for attempt in transient_retry(3, initial_s=0.001, max_s=0.002):
            with attempt:
                calls.append(1)
                raise KafkaConnectionError()

    with pytest.raises(KafkaConnectionError):
        await failing()
    assert len(calls) == 3


async def test_transient_retry_does_not_retry_permanent_errors() -> None:
    calls: list[int] = []

    async def failing() -> None:
        async for attempt in transient_retry(5, initial_s=0.001):
            with attempt:
                calls.append(1)
                raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        await failing()
    assert len(calls) == 1


def test_dlq_guard_trips_on_share() -> None:
    guard = DlqGuard(DlqSettings(guard_window=10, guard_min_records=4, guard_max_share=0.5))
    guard.record_dead()  # 1/1 but below the minimum sample
    guard.record_ok()
    guard.record_ok()
    guard.record_dead()  # 2/4 = 0.5, not above
    with pytest.raises(DlqGuardTrippedError):
        guard.record_dead()  # 3/5 > 0.5
    assert guard.share == 0.5  # the tripping record was not counted


def test_dlq_guard_window_slides() -> None:
    guard = DlqGuard(DlqSettings(guard_window=4, guard_min_records=4, guard_max_share=0.5))
    for _ in range(2):
        guard.record_dead()
    for _ in range(4):
        guard.record_ok()  # pushes the dead ones out of the window
    assert guard.share == 0.0
    guard.record_dead()
    guard.record_dead()
    with pytest.raises(DlqGuardTrippedError):
        guard.record_dead()


def test_dead_letter_record_keeps_original_bytes_key_and_headers() -> None:
    raw = b'{"broken": '
    record = InputRecord("alerts.in", 2, 41, b"key-1", raw, (("ce_id", b"e1"), ("trace", b"t")), 0)
    out, info = dead_letter(
        record,
        RequestError(DlqReason.bad_json, "Invalid JSON"),
        topic="alerts.dlq",
        stage="decode",
        attempts=1,
    )
    assert out.topic == "alerts.dlq"
    assert out.value == raw
    assert out.key == b"key-1"
    assert out.headers[:2] == (("ce_id", b"e1"), ("trace", b"t"))
    parsed = parse_dlq_headers(out.headers)
    assert parsed.original_topic == "alerts.in"
    assert parsed.original_partition == 2
    assert parsed.original_offset == 41
    assert parsed.reason == DlqReason.bad_json
    assert parsed.stage == "decode"
    assert parsed.attempts == 1
    assert parsed.exception_fqcn.endswith("RequestError")
    assert info.reason == DlqReason.bad_json


def test_dlq_guard_bulk_ok_equals_single_calls() -> None:
    rng = random.Random(7)
    for window in (1, 3, 10):
        cfg = DlqSettings(guard_window=window, guard_min_records=1, guard_max_share=1.0)
        bulk, single = DlqGuard(cfg), DlqGuard(cfg)
        for _ in range(200):
            if rng.random() < 0.3:
                bulk.record_dead()
                single.record_dead()
            else:
                count = rng.randrange(0, 2 * window + 2)
                bulk.record_ok(count)
                for _ in range(count):
                    single.record_ok()
            assert bulk.share == single.share
