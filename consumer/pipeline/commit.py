"""The last stage: committing input offsets, in either delivery mode. Event loop only.

The `Committer` owns the offset tracker (`consumer.pipeline.offsets`) and, in exactly-once mode, the
transactional
producer of every owned input partition (`consumer.kafka.transactions`). The pipeline tells it what was
fetched
(`track`) and which partitions it gains (`open`) and loses (`revoke`); the emitter hands it what is
finished (`done`, at-least-once) or what is ready to publish with its offset (`transact`, exactly-once).
Nothing here calls back into another stage.

- At-least-once: `run` commits the contiguous watermark of every partition every `commit_interval_ms`,
  and at once after `flush_soon` (the emitter calls it when nothing is left in flight), through the
  group's consumer (`CommitTarget`, the `Source`). `revoke` commits the revoked partitions one last time.
- Exactly-once: every run of finished units goes out in one transaction with the input offset after it,
  so outputs and progress become visible together; `run` commits nothing. `open` starts a partition's
  producer (fencing its previous owner), `revoke` and `stop` close it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

from aiokafka import TopicPartition

from consumer.kafka.settings import KafkaSettings
from consumer.kafka.transactions import PartitionTransactions, TransactionFencedError
from consumer.logging import get_logger
from consumer.pipeline.offsets import OffsetTracker
from consumer.records import OutRecord

log = get_logger("consumer.pipeline.commit")

__all__ = ["CommitTarget", "Committer", "TransactionFencedError", "TransactionsLike"]


class CommitTarget(Protocol):
    """Where at-least-once offsets go: the group's consumer (`consumer.kafka.source.Source`)."""

    @property
    def left(self) -> bool: ...

    async def commit(self, offsets: dict[TopicPartition, int], attempts: int) -> bool: ...


class TransactionsLike(Protocol):
    """One input partition's transactional producer (`consumer.kafka.transactions.PartitionTransactions`)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def publish(self, records: Sequence[OutRecord], next_offset: int) -> None: ...


TransactionsFactory = Callable[[KafkaSettings, TopicPartition], TransactionsLike]


class Committer:
    """Offsets and, exactly-once, transactions of the owned input partitions (see the module docstring).

    `transactions` builds a partition's transactional producer (default `PartitionTransactions`; tests
    pass fakes)."""

    def __init__(
        self,
        settings: KafkaSettings,
        target: CommitTarget,
        *,
        transactions: TransactionsFactory = PartitionTransactions,
    ) -> None:
        self._settings = settings
        self._target = target
        self._new_transactions = transactions
        self.tracker: OffsetTracker[TopicPartition] = OffsetTracker()
        self._owned: set[TopicPartition] = set()
        self._txns: dict[TopicPartition, TransactionsLike] = {}
        self._lock = asyncio.Lock()
        self._soon = asyncio.Event()
        self.last_commit = time.monotonic()  # monotonic() of the last commit that advanced (health)

    @property
    def exactly_once(self) -> bool:
        return self._settings.exactly_once

    # ---- ownership ----------------------------------------------------------------------------------------
    async def open(self, tp: TopicPartition) -> None:
        """Take `tp` on (assignment). Exactly-once: start its transactional producer first, which fences
        the previous owner; the caller keeps `tp` paused until this returns. Raises what the producer's
        start raises."""
        if self.exactly_once and tp not in self._txns:
            txn = self._new_transactions(self._settings, tp)
            await txn.start()
            self._txns[tp] = txn
        self._owned.add(tp)

    async def revoke(self, tps: Collection[TopicPartition]) -> int:
        """Give `tps` up: at-least-once, commit their watermark one last time; exactly-once, close their
        producers (call after their emitters ended, so no transaction is open). Returns how many tracked
        spans were still unfinished (abandoned: the next owner processes them again)."""
        owned = [tp for tp in tps if tp in self._owned]
        if not self.exactly_once:
            await self.commit(set(owned))
        abandoned = sum(self.tracker.pending(tp) for tp in owned)
        for tp in owned:
            self._owned.discard(tp)
            self.tracker.forget(tp)
            txn = self._txns.pop(tp, None)
            if txn is not None:
                await txn.stop()
        return abandoned

    async def stop(self) -> None:
        """Close every transactional producer left (shutdown, after the emitters ended). Never raises."""
        txns, self._txns = list(self._txns.values()), {}
        for txn in txns:
            try:
                await txn.stop()
            except Exception as exc:
                log.warning("transaction_producer_stop_failed", error=repr(exc)[:300])

    # ---- bookkeeping --------------------------------------------------------------------------------------
    def track(self, tp: TopicPartition, offset: int, end: int) -> None:
        """A fetched span `[offset, end)` of `tp` entered the pipeline (fetch loop, in offset order)."""
        self.tracker.track(tp, offset, end)

    def done(self, tp: TopicPartition, offset: int) -> None:
        """Every output of the span tracked at `offset` is acknowledged (at-least-once; emitter)."""
        self.tracker.done(tp, offset)

    def pending(self, tps: Collection[TopicPartition]) -> int:
        """Tracked spans of `tps` not yet finished."""
        return sum(self.tracker.pending(tp) for tp in tps)

    def flush_soon(self) -> None:
        """Commit now rather than at the next interval (nothing is left in flight). Non-blocking."""
        self._soon.set()

    # ---- at-least-once ------------------------------------------------------------------------------------
    async def commit(self, only: set[TopicPartition] | None = None) -> None:
        """Commit the watermark of the owned partitions (of `only`, when given) that advanced. No-op in
        exactly-once mode. Raises what `CommitTarget.commit` raises after its retries."""
        if self.exactly_once:
            return
        async with self._lock:
            offsets = {
                tp: off
                for tp, off in self.tracker.committable().items()
                if tp in self._owned and (only is None or tp in only)
            }
            if offsets and await self._target.commit(offsets, self._settings.send_attempts):
                self.tracker.mark_committed(offsets)
                self.last_commit = time.monotonic()

    async def run(self) -> None:
        """The at-least-once commit loop (a task the pipeline owns; returns at once exactly-once). Raises
        the first commit error, which is fatal."""
        if self.exactly_once:
            return
        interval = self._settings.commit_interval_ms / 1000.0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._soon.wait(), interval)
            self._soon.clear()
            await self.commit()

    # ---- exactly-once -------------------------------------------------------------------------------------
    async def transact(self, tp: TopicPartition, records: Sequence[OutRecord], next_offset: int) -> None:
        """Publish `records` and commit `next_offset` for `tp` in one transaction (exactly-once; emitter).

        Raises `TransactionFencedError` when another member took `tp` over (publish nothing more for it),
        `KeyError` for a partition not opened, and the last error after the retries otherwise.
        """
        await self._txns[tp].publish(records, next_offset)
        if tp in self._owned:
            self.tracker.mark_committed({tp: next_offset})
            self.last_commit = time.monotonic()
