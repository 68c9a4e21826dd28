"""Harness I/O for tests that run the service against a broker: send numbered events, wait until the
group has committed them, read back the decisions and count what was lost or duplicated.

Every call here uses a plain (super-user or unsecured) bootstrap of the harness, never the service's
credentials. Test-only.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from devtools.stub import sample_event


async def produce_events(bootstrap: str, topic: str, start: int, count: int) -> None:
    """Send `sample_event(i)` for i in [start, start + count), keyed over 40 keys; waits for the acks."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5)
    await producer.start()
    try:
        futs = [
            await producer.send(topic, sample_event(i), key=f"k{i % 40}".encode())
            for i in range(start, start + count)
        ]
        await asyncio.gather(*futs)
    finally:
        await producer.stop()


async def committed_total(bootstrap: str, group: str, topic: str) -> int:
    """Sum of the group's committed offsets on `topic` (0 while the group has none)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    except KafkaError:
        return 0
    finally:
        await admin.close()
    return sum(m.offset for tp, m in offsets.items() if tp.topic == topic and m.offset > 0)


async def wait_committed(
    bootstrap: str, group: str, topic: str, total: int, timeout_s: float, alive: Any = None
) -> int:
    """Poll until the group committed `total` offsets on `topic` or `timeout_s` passed; returns the
    last sum. `alive`: an optional task; its failure is raised at once."""
    deadline = time.monotonic() + timeout_s
    while True:
        if alive is not None and alive.done():
            alive.result()  # raises the service's error
            raise AssertionError("the service stopped before committing everything")
        try:
            done = await asyncio.wait_for(committed_total(bootstrap, group, topic), 15)
        except (KafkaError, TimeoutError, OSError):
            done = 0  # the broker is away (fault tests): keep waiting
        if done >= total or time.monotonic() > deadline:
            return done
        await asyncio.sleep(0.5)


async def partitions(bootstrap: str, topic: str) -> list[int]:
    """The partition numbers of `topic` ([] when it does not exist)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    return sorted(p["partition"] for p in described["partitions"]) if described["error_code"] == 0 else []


@dataclass(frozen=True)
class Tally:
    """Decisions read back for `total` inputs: `lost` inputs without one, `duplicates` extra ones."""

    total: int
    decisions: int
    lost: int
    duplicates: int


async def tally_decisions(bootstrap: str, topic: str, total: int, *, read_committed: bool) -> Tally:
    """Read every decision of `topic` and count lost and duplicate answers per input (partition, offset)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed" if read_committed else "read_uncommitted",
    )
    await consumer.start()
    seen: Counter[tuple[int, int]] = Counter()
    try:
        parts = [TopicPartition(topic, p) for p in await partitions(bootstrap, topic)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        todo = {tp for tp in parts if ends[tp] > 0}
        deadline = time.monotonic() + 120
        while todo and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for rec in records:
                    src = json.loads(rec.value)["source"]
                    seen[(src["partition"], src["offset"])] += 1
            todo = {tp for tp in todo if await consumer.position(tp) < ends[tp]}
    finally:
        await consumer.stop()
    decisions = sum(seen.values())
    return Tally(total, decisions, lost=total - len(seen), duplicates=decisions - len(seen))
