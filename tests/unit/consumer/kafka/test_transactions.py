"""`consumer.kafka.transactions.PartitionTransactions` on fake producers: a producer whose aiokafka sender
died
inside a transaction is replaced by a new one with the same transactional id, and the transaction is
tried again; fencing and ordinary errors are not retried that way."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError, KafkaError, ProducerFenced

from consumer.kafka import transactions
from consumer.kafka.transactions import PartitionTransactions, TransactionFencedError
from consumer.records import OutRecord
from consumer.settings import KafkaSettings


class FakeProducer:
    """A transactional producer: `fail_offsets` is raised by `send_offsets` (and marks the sender dead
    when `dies`); `start_failures` connection errors come before a successful `start`."""

    def __init__(
        self,
        txn_id: str,
        log: list[str],
        *,
        fail_offsets: BaseException | None = None,
        dies: bool = False,
        start_failures: int = 0,
    ) -> None:
        self.txn_id = txn_id
        self.log = log
        self.fail_offsets = fail_offsets
        self.dies = dies
        self.start_failures = start_failures
        self.dead = False

    async def start(self) -> None:
        if self.start_failures:
            self.start_failures -= 1
            raise KafkaConnectionError("broker away")
        self.log.append(f"start {self.txn_id}")

    async def stop(self) -> None:
        self.log.append("stop")
        if self.dead:
            raise KafkaError("sender died")  # a dead producer may fail its own close

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        self.log.append("begin")
        try:
            yield
        except BaseException:
            self.log.append("abort")
            raise
        self.log.append("commit")

    async def send_batches(self, records: list[OutRecord]) -> list[tuple[Any, list[int]]]:
        self.log.append(f"send {len(records)}")
        return []

    async def send_offsets(self, offsets: dict[TopicPartition, int], group_id: str) -> None:
        if self.fail_offsets is not None:
            self.dead = self.dies
            raise self.fail_offsets
        self.log.append(f"offsets {next(iter(offsets.values()))}")


def _transactions(producers: list[FakeProducer]) -> tuple[PartitionTransactions, list[str]]:
    made: list[str] = []

    def factory(settings: KafkaSettings, txn_id: str) -> Any:
        made.append(txn_id)
        return producers[len(made) - 1]

    return PartitionTransactions(KafkaSettings(group_id="g"), TopicPartition("in", 2), factory), made


RECORDS = [OutRecord("decisions", b"k", b"v", ())]


async def test_a_producer_whose_sender_died_is_replaced_and_the_transaction_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transactions, "RESTART_PAUSE_S", 0.0)
    log: list[str] = []
    died = FakeProducer(
        "g.in.2", log, fail_offsets=KafkaError("Unexpected error during batch delivery"), dies=True
    )
    fresh = FakeProducer("g.in.2", log, start_failures=2)  # the broker is still restarting
    txn, made = _transactions([died, fresh, fresh, fresh])
    await txn.start()
    await txn.publish(RECORDS, 7)
    assert made == ["g.in.2"] * 4  # the same transactional id: the new producer fences the dead one
    assert log == [
        *["start g.in.2", "begin", "send 1", "abort"],  # the dead producer's transaction is aborted
        *["stop", "stop", "stop"],  # the dead one closed, then two starts refused while the broker is away
        *["start g.in.2", "begin", "send 1", "offsets 7", "commit"],  # a new transaction, new producer
    ]


async def test_an_error_of_a_live_producer_is_not_a_replacement() -> None:
    log: list[str] = []
    live = FakeProducer("g.in.2", log, fail_offsets=KafkaError("not retriable"))
    txn, made = _transactions([live])
    await txn.start()
    with pytest.raises(KafkaError, match="not retriable"):
        await txn.publish(RECORDS, 7)
    assert made == ["g.in.2"]
    assert log.count("begin") == 1


async def test_fencing_is_never_retried() -> None:
    log: list[str] = []
    fenced = FakeProducer("g.in.2", log, fail_offsets=ProducerFenced(), dies=True)
    txn, made = _transactions([fenced])
    await txn.start()
    with pytest.raises(TransactionFencedError):
        await txn.publish(RECORDS, 7)
    assert made == ["g.in.2"]
