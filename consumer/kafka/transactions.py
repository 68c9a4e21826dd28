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

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError, ProducerFenced

from consumer.kafka.producer import Producer
from consumer.kafka.settings import KafkaSettings
from consumer.logging import get_logger
from consumer.records import OutRecord
from consumer.retry import transient_retry

log = get_logger("consumer.kafka.transactions")


def transactional_id(group_id: str, tp: Any) -> str:
    """The transactional id of an input partition's producer: the same for every member of the group."""
    return f"{group_id}.{tp.topic}.{tp.partition}"


class TransactionFencedError(RuntimeError):
    """Another producer with this partition's transactional id started: this member no longer owns the
    partition and must publish nothing more for it (its open transaction was aborted by the broker)."""


class ProducerDiedError(ConnectionError):
    """The partition's producer died inside a transaction (`Producer.dead`); it has been replaced, and
    the transaction is tried again as a new one (a `ConnectionError`, so the retry policy takes it)."""


RESTART_TRIES = 60
RESTART_PAUSE_S = 1.0
"""A replacement producer is started up to `RESTART_TRIES` times, `RESTART_PAUSE_S` apart, so a
broker that is restarting (about 10 s here) is waited for."""


class PartitionTransactions:
    """The transactional producer of one input partition. `start()` before use, `stop()` at the end.

    The owner of `_producer`: only this object replaces it, when aiokafka's sender dies under it."""

    def __init__(
        self,
        settings: KafkaSettings,
        tp: TopicPartition,
        producer_factory: Callable[[KafkaSettings, str], Producer] | None = None,
    ) -> None:
        self.tp = tp
        self._settings = settings
        self._group_id = settings.group_id
        self._attempts = settings.send_attempts
        self._factory = producer_factory or (lambda s, txn_id: Producer(s, transactional_id=txn_id))
        self._producer = self._factory(settings, transactional_id(settings.group_id, tp))
        self._replace = False  # set when the producer died; the next attempt starts a new one

    async def start(self) -> None:
        """Connect and initialise the transactional id (fences older producers with the same id)."""
        await self._producer.start()

    async def _restart(self) -> None:
        """Replace the dead producer: close it (errors only logged), then start a new one with the same
        transactional id, which makes the broker abort the dead one's open transaction (its records stay
        invisible to `read_committed` readers). Tries `RESTART_TRIES` times while the broker is away."""
        await _close_quietly(self._producer)  # a dead producer may fail its own close
        for attempt in range(1, RESTART_TRIES + 1):
            producer = self._factory(self._settings, transactional_id(self._group_id, self.tp))
            try:
                await producer.start()
            except KafkaError as exc:
                if attempt == RESTART_TRIES or isinstance(exc, ProducerFenced):
                    raise
                log.info(
                    "producer_restart_retry",
                    topic=self.tp.topic,
                    partition=self.tp.partition,
                    error=repr(exc),
                )
                await _close_quietly(producer)
                await asyncio.sleep(RESTART_PAUSE_S)
                continue
            self._producer = producer
            self._replace = False
            log.warning("producer_replaced", topic=self.tp.topic, partition=self.tp.partition, starts=attempt)
            return

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
                    if self._replace or self._producer.dead:
                        await self._restart()
                    try:
                        async with self._producer.transaction():
                            sent = await self._producer.send_batches(records)
                            for future, _ in sent:
                                await future  # a failed record fails the transaction, not just its batch
                            await self._producer.send_offsets({self.tp: next_offset}, self._group_id)
                    except KafkaError as exc:
                        if isinstance(exc, ProducerFenced) or not self._producer.dead:
                            raise
                        self._replace = True
                        log.warning(
                            "producer_died", topic=self.tp.topic, partition=self.tp.partition, error=repr(exc)
                        )
                        raise ProducerDiedError(repr(exc)) from exc
        except ProducerFenced as exc:
            log.warning("transaction_fenced", topic=self.tp.topic, partition=self.tp.partition)
            raise TransactionFencedError(str(exc)) from exc


async def _close_quietly(producer: Producer) -> None:
    """Close `producer`, logging instead of raising: a dead one, or one that never started, may fail."""
    try:
        await producer.stop()
    except Exception as exc:  # the producer is dropped either way
        log.info("producer_close_failed", error=repr(exc))
