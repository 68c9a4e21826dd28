"""Transient retries and the DLQ guard / DLQ record (batch splitting: tests/unit/engine/test_split.py)."""

from __future__ import annotations

import random

import pytest
from aiokafka.errors import KafkaConnectionError, RecordTooLargeError

from consumer.pipeline.dlq import DlqGuard, DlqGuardTrippedError, dead_letter
from consumer.records import InputRecord
from consumer.retry import is_transient, transient_retry
from consumer.settings import DlqSettings
from schemas.dead_letter import parse_dlq_headers
from schemas.errors import DlqReason, RequestError


def test_is_transient() -> None:
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
