"""The pipeline's shutdown sequence (`consumer.pipeline.pipeline.Pipeline.run` ends with it).

Drain and commit while the partitions are still owned, then close the stages front to back and leave the
group, all within `kafka.shutdown_timeout_s`:

    stop fetching -> drain (a revoke in progress is part of it) -> stop the commit loop -> close every
    partition's emitter -> final commit (at-least-once) -> batcher -> emitter tasks and publisher
    -> committer (exactly-once producers) -> leave the group, close the consumer -> producer

The sequence sees the pipeline only through a `Stages` value (the stage objects and the bounds) and two
callables for what only the pipeline knows: how to drain, and which partitions it still owns.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from consumer.batching.batcher import Batcher
from consumer.kafka.producer import Producer
from consumer.kafka.source import Source
from consumer.logging import get_logger
from consumer.metrics import Metrics
from consumer.pipeline.commit import Committer
from consumer.pipeline.emitter import Emitter
from consumer.records import PartitionState
from consumer.runtime import bounded
from engine.types import PreparedLike

P = TypeVar("P", bound=PreparedLike)
S = TypeVar("S")
R = TypeVar("R")

log = get_logger("consumer.pipeline.pipeline")

EXIT_MARGIN_S = 1.0  # of kafka.settings.SHUTDOWN_RESERVE_S: left for the process to exit after `run` returns


@dataclass(frozen=True, slots=True)
class Stages(Generic[P, S, R]):
    """What the shutdown sequence closes, in its order, and its bounds; built by the pipeline."""

    source: Source
    batcher: Batcher[P, S, R]
    emitter: Emitter
    committer: Committer
    producer: Producer
    metrics: Metrics
    shutdown_timeout_s: float  # `kafka.shutdown_timeout_s`: the whole sequence, drain included
    close_reserve_s: float  # `kafka.close_reserve_s`: kept after the drain for the commit, leaving, closing


async def shutdown(
    stages: Stages[P, S, R],
    commits: asyncio.Task[None],
    drain: Callable[[float], Awaitable[bool]],
    open_partitions: Callable[[], list[PartitionState]],
) -> None:
    """Run the sequence above once the fetch loop has ended. Never raises.

    `commits` is the periodic commit loop (cancelled after the drain). `drain(timeout_s)` waits until
    nothing is in flight and no revoke is in progress: True when it got there, False on timeout, and
    False at once after a fatal error. `open_partitions()` gives the partitions owned when it is called
    (after the drain: a revoke during the drain removes its partitions).
    """
    source = stages.source
    source.stop_fetching()
    began = time.monotonic()
    deadline = began + stages.shutdown_timeout_s - EXIT_MARGIN_S

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    drained = await drain(max(0.0, stages.shutdown_timeout_s - stages.close_reserve_s))
    commits.cancel()
    for state in open_partitions():
        stages.emitter.close(state)  # nothing more is published: what is unfinished now is abandoned
    if not source.left:
        try:
            await stages.committer.commit()  # bounded by commit_timeout_s
        except Exception as exc:
            log.warning("final_commit_failed", error=repr(exc)[:300])
    abandoned = stages.emitter.in_flight
    # HTTP requests already in the batcher may still be answered (Kafka results are not published).
    await stages.batcher.close(left() / 3)
    # Exactly-once: a transaction being committed ends before the group is left, so the next owner reads
    # its offsets.
    await stages.emitter.wait_closed(min(left() / 3, 2.0))
    await bounded(stages.committer.stop(), min(left() / 3, 2.0), "transaction_producers_stop")

    async def leave() -> None:
        await source.leave_group()
        await source.stop()

    left_in_time = await bounded(leave(), left() * 2 / 3, "leave_group")
    await bounded(stages.producer.stop(), left(), "producer_stop")
    stages.metrics.model_loaded.set(0)
    log.info(
        "pipeline_stopped",
        drained=drained,
        abandoned=abandoned,
        left_group=left_in_time,
        seconds=round(time.monotonic() - began, 3),
    )
