"""Kafka input: the aiokafka consumer group (manual commits, pause/resume, rebalance hook).

`Source.fetch` is the only call that waits for the broker on the hot path; it never waits for GPU work. It
may take a subset of the partitions (the pipeline fetches only its urgent topics' partitions while the
in-flight bound has room for them alone); the others keep their buffered records for a later fetch.
Partitions are paused (`pause_all`) when the emitter stays full and resumed when it has
drained; heartbeats continue meanwhile (aiokafka heartbeats from its own task). Rebalance callbacks are
awaited by aiokafka before the member rejoins, so `on_revoked` may finish or abandon work and commit.

Rebalance timeout: the broker waits `kafka.rebalance_timeout_ms` (default `max_poll_interval_ms`, as the
Java client) for every member to rejoin; a member still in its revoke callback after that is dropped from
the group and its partitions handed on while it drains. aiokafka would default it to the session timeout,
so it is set explicitly, and the settings check that the whole revoke path fits inside it.

Stopping: `stop_fetching` makes a pending `fetch` return at once (aiokafka's `getmany` ignores its
timeout while a rebalance is in progress); `leave_group` sends LeaveGroup and keeps the member from
rejoining, so a member that is shutting down is handed no more partitions; `stop` closes the client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError

from consumer.kafka.config import client_options
from consumer.kafka.settings import KafkaSettings
from consumer.logging import get_logger
from consumer.metrics import Metrics
from consumer.retry import transient_retry

log = get_logger("consumer.kafka.source")


PartitionsCallback = Callable[[set[TopicPartition]], Awaitable[None]]


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, on_assigned: PartitionsCallback, on_revoked: PartitionsCallback) -> None:
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._on_assigned(set(assigned))


class Source:
    """The input consumer (see the module docstring). Not thread-safe: event loop only."""

    def __init__(
        self,
        settings: KafkaSettings,
        topics: Sequence[str],
        *,
        metrics: Metrics | None = None,
    ) -> None:
        self._settings = settings
        self._topics = list(topics)
        self._metrics = metrics
        self._paused = False
        self._lag_gauges: dict[TopicPartition, Any] = {}
        self._getter: asyncio.Future[dict[TopicPartition, list[Any]]] | None = None  # the pending fetch
        self._fetching = True  # False after `stop_fetching`
        self._left = False  # `leave_group` was called
        self._consumer = AIOKafkaConsumer(
            **client_options(settings),
            group_id=settings.group_id,
            enable_auto_commit=False,
            auto_offset_reset=settings.auto_offset_reset,
            session_timeout_ms=settings.session_timeout_ms,
            heartbeat_interval_ms=settings.heartbeat_interval_ms,
            max_poll_interval_ms=settings.max_poll_interval_ms,
            rebalance_timeout_ms=settings.effective_rebalance_timeout_ms,
            max_poll_records=settings.fetch_max_records,
            isolation_level="read_committed",
        )

    async def start(self, *, on_assigned: PartitionsCallback, on_revoked: PartitionsCallback) -> None:
        """Connect and subscribe. aiokafka awaits `on_assigned`/`on_revoked` inside its rebalances, before
        the member rejoins (the fetch loop keeps running meanwhile)."""
        await self._consumer.start()
        self._consumer.subscribe(self._topics, listener=_Listener(on_assigned, on_revoked))

    def stop_fetching(self) -> None:
        """End a pending `fetch` now (it returns no records) and make later ones return at once.

        Non-blocking; idempotent. Safe from a signal handler running on the loop.
        """
        self._fetching = False
        if self._getter is not None:
            # (aiokafka then counts the consumer as fetching for good, so its heartbeat never leaves the
            # group for want of a fetch while the pipeline drains: the drain decides when to leave.)
            self._getter.cancel()

    @property
    def left(self) -> bool:
        """True once `leave_group` was called: no partitions are assigned any more, nothing to commit."""
        return self._left

    async def leave_group(self) -> None:
        """Stop fetching, send LeaveGroup and keep the member from rejoining (idempotent).

        Callable from a rebalance callback: after `on_revoked` returns, the coordinator finds the
        subscription gone and does not join the next generation, so the others get every partition without
        waiting. Yields once, so that aiokafka's LeaveGroup is on the wire before the coordinator's next
        request (a JoinGroup it would send for the old subscription is then refused and ignored). Waits for
        no reply: the broker answers LeaveGroup only after a JoinGroup parked on the same connection.
        """
        self.stop_fetching()
        if self._left:
            return
        self._left = True
        self._consumer.unsubscribe()
        await asyncio.sleep(0)
        log.info("group_left", group=self._settings.group_id)

    async def stop(self) -> None:
        """Leave the group (when `leave_group` has not) and close the client (no commit here: the pipeline
        commits before calling this). Waits for a rebalance in progress to end: bound it by the caller."""
        self.stop_fetching()
        await self._consumer.stop()

    def assignment(self) -> set[TopicPartition]:
        return set(self._consumer.assignment())

    @property
    def paused(self) -> bool:
        return self._paused

    async def fetch(
        self, max_records: int, timeout_ms: int = 100, partitions: Collection[TopicPartition] | None = None
    ) -> dict[TopicPartition, list[Any]]:
        """Records of non-paused assigned partitions, at most `max_records`; with `partitions`, of those
        only (the others keep what the consumer has buffered for them; an empty collection is none).

        Waits at most `timeout_ms`, except during a rebalance, when aiokafka waits for the new assignment
        whatever the timeout; `stop_fetching` ends that wait (the result is then empty). Raises what
        `getmany` raises.
        """
        if not self._fetching:
            return {}
        if partitions is not None and not partitions:
            return {}  # getmany() without partitions would mean all of them
        subset = () if partitions is None else tuple(partitions)
        # A task of its own, so that `stop_fetching` can cancel the wait without cancelling the caller.
        getter = self._getter = asyncio.ensure_future(
            self._consumer.getmany(*subset, timeout_ms=timeout_ms, max_records=max_records)
        )
        try:
            result: dict[TopicPartition, list[Any]] = await getter
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._fetching or (task is not None and task.cancelling()):
                raise  # the caller itself is being cancelled
            return {}
        finally:
            self._getter = None
        return result

    def pause(self, tps: Iterable[TopicPartition]) -> None:
        """Stop fetching from these partitions (records not yet returned are fetched again on resume)."""
        self._consumer.pause(*tps)

    def resume(self, tps: Iterable[TopicPartition]) -> None:
        """Resume fetching from these partitions (still assigned ones only)."""
        assigned = self._consumer.assignment()
        self._consumer.resume(*(tp for tp in tps if tp in assigned))

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Fetch `tp` from `offset` next (it must be assigned)."""
        self._consumer.seek(tp, offset)

    def pause_all(self) -> None:
        """Stop fetching from every assigned partition (idempotent)."""
        parts = self.assignment()
        if parts:
            self._consumer.pause(*parts)
        if not self._paused:
            log.info("paused", partitions=len(parts))
        self._paused = True
        if self._metrics is not None:
            self._metrics.paused.set(1)

    def resume_all(self) -> None:
        """Resume fetching from every assigned partition (idempotent)."""
        parts = self.assignment()
        if parts:
            self._consumer.resume(*parts)
        if self._paused:
            log.info("resumed", partitions=len(parts))
        self._paused = False
        if self._metrics is not None:
            self._metrics.paused.set(0)

    def update_lag(self, positions: dict[TopicPartition, int]) -> int:
        """Refresh the lag gauge from the last known high watermarks (no broker call) and `positions`
        (next offset the pipeline will see per partition); returns the total lag."""
        total = 0
        for tp in self.assignment():
            try:
                high = self._consumer.highwater(tp)
            except (AssertionError, IllegalStateError):
                continue
            pos = positions.get(tp)
            if high is None or pos is None:
                continue
            lag = max(0, high - pos)
            total += lag
            if self._metrics is not None:
                gauge = self._lag_gauges.get(tp)
                if gauge is None:  # label children looked up once per partition (this runs every fetch)
                    gauge = self._metrics.consumer_lag.labels(topic=tp.topic, partition=str(tp.partition))
                    self._lag_gauges[tp] = gauge
                gauge.set(lag)
        return total

    async def commit(self, offsets: dict[TopicPartition, int], attempts: int) -> bool:
        """Commit `offsets` (next offset to read per partition), retrying transient errors, all within
        `kafka.commit_timeout_s`.

        Returns False when the group is rebalancing (`CommitFailedError`), the member has left, or the
        time is up: the caller keeps the offsets and tries again later or on revocation (what stays
        uncommitted is processed again by the next owner). Other errors propagate after the retries.
        """
        if not offsets:
            return True
        if self._left:
            return False
        try:
            async with asyncio.timeout(self._settings.commit_timeout_s):
                async for attempt in transient_retry(attempts):
                    with attempt:
                        await self._consumer.commit(offsets)
        except CommitFailedError as exc:
            log.warning("commit_failed_rebalance", error=str(exc)[:200], partitions=len(offsets))
            return False
        except TimeoutError:
            log.warning("commit_timed_out", seconds=self._settings.commit_timeout_s, partitions=len(offsets))
            return False
        if self._metrics is not None:
            self._metrics.commits.inc()
        return True
