"""Exactly-once publishing (setting `kafka.exactly_once`): one transactional producer per input partition.

The emitter of an input partition hands each run of finished units to `PartitionTransactions.publish`: one
transaction carries their output records (answers and dead letters) and the input offset after the run
(`send_offsets_to_transaction`), so outputs and progress become visible together or not at all. A failed
transaction is aborted and, for transient errors, tried again as a new transaction (tenacity); its records
stay invisible to `read_committed` consumers.

The transactional id is fixed per input partition (`transactional_id`), so whichever member owns the
partition next fences the previous owner when its producer starts, and the broker aborts the previous
owner's open transaction (KIP-98 zombie fencing; aiokafka has no consumer-group fencing, hence one producer
per input partition). The pipeline starts the producer of a partition when the partition is assigned,
before it takes any record of it. Downstream consumers must read with `isolation_level=read_committed`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import ProducerFenced

from consumer.logging import get_logger
from consumer.producer import Producer
from consumer.records import OutRecord
from consumer.retry import transient_retry
from consumer.settings import KafkaSettings

log = get_logger("consumer.transactions")


def transactional_id(group_id: str, tp: Any) -> str:
    """The transactional id of an input partition's producer: the same for every member of the group."""
    return f"{group_id}.{tp.topic}.{tp.partition}"


class TransactionFencedError(RuntimeError):
    """Another producer with this partition's transactional id started: this member no longer owns the
    partition and must publish nothing more for it (its open transaction was aborted by the broker)."""


class PartitionTransactions:
    """The transactional producer of one input partition. `start()` before use, `stop()` at the end."""

    def __init__(self, settings: KafkaSettings, tp: TopicPartition) -> None:
        self.tp = tp
        self._group_id = settings.group_id
        self._attempts = settings.send_attempts
        self._producer = Producer(settings, transactional_id=transactional_id(settings.group_id, tp))

    async def start(self) -> None:
        """Connect and initialise the transactional id (fences older producers with the same id)."""
        await self._producer.start()

    async def stop(self) -> None:
        """Close the producer (an open transaction is aborted by the broker when it times out or the next
        owner starts)."""
        await self._producer.stop()

    async def publish(self, records: Sequence[OutRecord], next_offset: int) -> None:
        """Publish `records` and commit `next_offset` for the input partition in one transaction.

        Transient errors abort the transaction and retry in a new one, up to `send_attempts` tries. Raises
        `TransactionFencedError` when another owner fenced this producer, and the last error otherwise.
        """
        try:
            async for attempt in transient_retry(self._attempts):
                with attempt:
                    async with self._producer.transaction():
                        sent = await self._producer.send_batches(records)
                        for future, _ in sent:
                            await future  # a failed record fails the transaction, not just its batch
                        await self._producer.send_offsets({self.tp: next_offset}, self._group_id)
        except ProducerFenced as exc:
            log.warning("transaction_fenced", topic=self.tp.topic, partition=self.tp.partition)
            raise TransactionFencedError(str(exc)) from exc
