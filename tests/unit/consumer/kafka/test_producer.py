"""`Publisher` rounds: push order, coalescing while a round waits, owners dropped when no longer live, and a
handing-over error that is fatal; on a fake producer (`FakeProducer`, shared with the emitter tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from consumer.kafka.producer import Publisher
from consumer.records import OutRecord


class FakeProducer:
    """Batches per topic in order; futures resolve when `ack()` is called (or fail with `fail_next`)."""

    def __init__(self) -> None:
        self.rounds: list[list[OutRecord]] = []
        self.pending: list[asyncio.Future[Any]] = []
        self.resent: list[OutRecord] = []
        self.fail_next: BaseException | None = None
        self.gate: asyncio.Event | None = None  # when set: a round waits for it (aiokafka's drain wait)

    async def send_batches(self, records: Sequence[OutRecord]) -> list[tuple[asyncio.Future[Any], list[int]]]:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_next is not None:
            raise self.fail_next
        self.rounds.append(list(records))
        groups: dict[str, list[int]] = {}
        for i, rec in enumerate(records):
            groups.setdefault(rec.topic, []).append(i)
        loop = asyncio.get_running_loop()
        sent = [(loop.create_future(), indexes) for indexes in groups.values()]
        self.pending += [fut for fut, _ in sent]
        return sent

    async def send_retrying(self, record: OutRecord, attempts: int) -> None:
        self.resent.append(record)

    def ack(self, error: BaseException | None = None) -> None:
        for fut in self.pending:
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)
        self.pending.clear()


def out(topic: str, n: int) -> OutRecord:
    return OutRecord(topic, b"k", str(n).encode(), ())


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_publisher_keeps_push_order_and_coalesces_while_a_round_waits() -> None:
    producer = FakeProducer()
    producer.gate = asyncio.Event()
    batches: list[tuple[list[OutRecord], list[str]]] = []
    publisher: Publisher[str] = Publisher(
        producer,
        on_batch=lambda recs, owners, fut: batches.append((recs, owners)),
        is_live=lambda owner: owner != "revoked",
        on_dropped=lambda owner: batches.append(([], [f"dropped:{owner}"])),
        on_error=lambda exc: None,
    )
    publisher.start()
    publisher.push([out("a", 0), out("b", 0)], "u0")
    await settle()  # round 1 waits at the gate; these collect for round 2
    publisher.push([out("a", 1)], "u1")
    publisher.push([out("a", 9)], "revoked")
    publisher.push([out("a", 2), out("b", 2)], "u2")
    producer.gate.set()
    await settle()
    assert [[r.value for r in rnd] for rnd in producer.rounds] == [[b"0", b"0"], [b"1", b"2", b"2"]]
    assert batches == [([], ["dropped:revoked"])]  # dropped when its round starts, never sent
    producer.ack()
    await settle()
    assert sorted(owners for _, owners in batches[1:]) == [["u0"], ["u0"], ["u1", "u2"], ["u2"]]
    await publisher.stop(1.0)


async def test_publisher_error_is_fatal_and_drops_later_pushes() -> None:
    producer = FakeProducer()
    producer.fail_next = RuntimeError("broker gone")
    errors: list[BaseException] = []
    dropped: list[str] = []
    publisher: Publisher[str] = Publisher(
        producer,
        on_batch=lambda recs, owners, fut: None,
        is_live=lambda owner: True,
        on_dropped=dropped.append,
        on_error=errors.append,
    )
    publisher.start()
    publisher.push([out("a", 0)], "u0")
    await settle()
    assert [str(e) for e in errors] == ["broker gone"]
    publisher.push([out("a", 1)], "u1")
    assert dropped == ["u0", "u1"]
    await publisher.stop(1.0)
