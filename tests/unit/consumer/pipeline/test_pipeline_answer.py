"""`Pipeline.answer` (HTTP) through the shared batcher, in its priority class; `Pipeline._admit` of records
it may not take yet."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiokafka import TopicPartition

from consumer.kafka.source import Source
from consumer.pipeline.pipeline import Pipeline
from consumer.settings import load_settings
from devtools.stub import StubEngine
from schemas.errors import RequestError


async def test_answer_returns_the_response_and_raises_request_errors() -> None:
    settings = load_settings(http={"enabled": False}, batching={"max_wait_ms": 0})
    pipeline = Pipeline(settings, StubEngine())
    await pipeline.batcher.start()
    try:
        body = {"state": {"summary": "disk full"}, "questions": {"ok": {"type": "noul", "question": "ok?"}}}
        response = await pipeline.answer(json.dumps(body).encode())
        assert list(response.answers) == ["ok"]
        with pytest.raises(RequestError):
            await pipeline.answer(b"not json")
    finally:
        await pipeline.batcher.close(1.0)


async def test_answer_runs_in_the_http_class_unless_given_one() -> None:
    priority = {"levels": 3, "http": 1}
    settings = load_settings(http={"enabled": False}, batching={"max_wait_ms": 0, "priority": priority})
    pipeline = Pipeline(settings, StubEngine())
    seen: list[int | None] = []
    submit = pipeline.batcher.submit

    def recording(prepare: Any, items: Any, *, priority: int | None = None) -> Any:
        seen.append(priority)
        return submit(prepare, items, priority=priority)

    pipeline.batcher.submit = recording  # type: ignore[method-assign]
    await pipeline.batcher.start()
    try:
        body = json.dumps({"state": "disk full", "questions": {"ok": {"type": "noul"}}}).encode()
        await pipeline.answer(body)
        await pipeline.answer(body, priority=0)
        with pytest.raises(ValueError, match="priority"):
            await pipeline.answer(body, priority=3)
    finally:
        await pipeline.batcher.close(1.0)
    assert seen == [1, 0, 3]


class _FakeSource:
    """The part of `consumer.kafka.source.Source` that `_admit` uses."""

    def __init__(self, assigned: set[TopicPartition]) -> None:
        self.assigned = assigned
        self.seeks: list[tuple[TopicPartition, int]] = []

    def assignment(self) -> set[TopicPartition]:
        return self.assigned

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))


async def test_records_of_an_assigned_partition_not_opened_yet_are_fetched_again() -> None:
    """A fetch may return records of a partition between its assignment and the end of the rebalance
    callback that opens it; they are not taken, and the position goes back so nothing is skipped."""
    opening, revoked = TopicPartition("in", 0), TopicPartition("in", 1)
    source = _FakeSource({opening})
    pipeline = Pipeline(load_settings(http={"enabled": False}), StubEngine(), source=cast(Source, source))
    records = [SimpleNamespace(offset=7), SimpleNamespace(offset=8)]
    pipeline._admit(opening, records)  # type: ignore[arg-type]
    pipeline._admit(revoked, records)  # type: ignore[arg-type]  # not assigned any more: dropped, the next owner reads them
    assert source.seeks == [(opening, 7)]
    assert pipeline.in_flight == 0
    await pipeline.batcher.close(1.0)
