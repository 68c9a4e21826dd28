"""`Source`: a stop ends a fetch that waits for a rebalance (aiokafka's `getmany` ignores its timeout then),
cancelling the caller of `fetch` still cancels it, and a fetch of some partitions asks for those only."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import TopicPartition

from consumer.kafka.settings import KafkaSettings
from consumer.kafka.source import Source


class _RebalancingConsumer:
    """Stands in for AIOKafkaConsumer during a rebalance: `getmany` waits whatever its timeout."""

    def __init__(self) -> None:
        self.cancelled = 0

    async def getmany(self, *, timeout_ms: int, max_records: int) -> dict[Any, list[Any]]:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return {}


def _source(consumer: object) -> Source:
    source = Source(KafkaSettings(), ["t"])
    source._consumer = consumer  # the real one is never started here
    return source


async def test_stop_fetching_ends_a_fetch_waiting_for_a_rebalance() -> None:
    fake = _RebalancingConsumer()
    source = _source(fake)
    fetch = asyncio.create_task(source.fetch(10, timeout_ms=100))
    await asyncio.sleep(0.3)  # past its timeout: still waiting, as aiokafka does mid-rebalance
    assert not fetch.done()
    source.stop_fetching()
    assert await asyncio.wait_for(fetch, 1.0) == {}
    assert fake.cancelled == 1
    assert await source.fetch(10) == {}  # later fetches return at once
    assert await source.commit({}, attempts=1)


async def test_cancelling_the_caller_of_fetch_still_cancels_it() -> None:
    source = _source(_RebalancingConsumer())
    fetch = asyncio.create_task(source.fetch(10))
    await asyncio.sleep(0.05)
    fetch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await fetch


class _BufferedConsumer:
    """Stands in for AIOKafkaConsumer with records buffered: `getmany` records the partitions it is given."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[TopicPartition, ...], int]] = []

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int, max_records: int
    ) -> dict[TopicPartition, list[Any]]:
        self.calls.append((partitions, max_records))
        return {tp: [max_records] for tp in partitions}


async def test_fetch_takes_only_the_given_partitions() -> None:
    fake = _BufferedConsumer()
    source = _source(fake)
    urgent = TopicPartition("alerts.critical", 0)
    assert await source.fetch(8, partitions=[urgent]) == {urgent: [8]}
    assert await source.fetch(16) == {}  # every partition: getmany() without arguments
    assert await source.fetch(4, partitions=()) == {}  # none at all, without asking the consumer
    assert fake.calls == [((urgent,), 8), ((), 16)]
