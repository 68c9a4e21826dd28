"""The pipeline's shutdown sequence (`consumer.pipeline.pipeline.Pipeline.run` ends with it).

Drain and commit while the partitions are still owned, then close the stages front to back and leave the
group, all within `kafka.shutdown_timeout_s`:

    stop fetching -> drain (a revoke in progress is part of it) -> stop the commit loop -> close every
    partition's emitter -> final commit (at-least-once) -> batcher -> emitter tasks and publisher
    -> committer (exactly-once producers) -> leave the group, close the consumer -> producer
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, TypeVar

from consumer.logging import get_logger
from consumer.runtime import bounded

if TYPE_CHECKING:
    from consumer.pipeline.pipeline import Pipeline
    from engine.types import PreparedLike

P = TypeVar("P", bound="PreparedLike")
S = TypeVar("S")
R = TypeVar("R")

log = get_logger("consumer.pipeline.pipeline")

EXIT_MARGIN_S = 1.0  # of settings.SHUTDOWN_RESERVE_S: left for the process to exit after `run` returns


async def shutdown(pipeline: Pipeline[P, S, R], commits: asyncio.Task[None]) -> None:
    """Run the sequence above for `pipeline` (whose fetch loop has ended). Never raises."""
    cfg = pipeline.settings.kafka
    source = pipeline.source
    source.stop_fetching()
    began = time.monotonic()
    deadline = began + cfg.shutdown_timeout_s - EXIT_MARGIN_S

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    drained = False
    if pipeline.fatal is None:
        drained = await pipeline.drain(None, max(0.0, cfg.shutdown_timeout_s - cfg.close_reserve_s))
    commits.cancel()
    for state in pipeline.open_partitions():
        pipeline.emitter.close(state)  # nothing more is published: what is unfinished now is abandoned
    if not source.left:
        try:
            await pipeline.committer.commit()  # bounded by commit_timeout_s
        except Exception as exc:
            log.warning("final_commit_failed", error=repr(exc)[:300])
    abandoned = pipeline.in_flight
    # HTTP requests already in the batcher may still be answered (Kafka results are not published).
    await pipeline.batcher.close(left() / 3)
    # Exactly-once: a transaction being committed ends before the group is left, so the next owner reads
    # its offsets.
    await pipeline.emitter.wait_closed(min(left() / 3, 2.0))
    await bounded(pipeline.committer.stop(), min(left() / 3, 2.0), "transaction_producers_stop")

    async def leave() -> None:
        await source.leave_group()
        await source.stop()

    left_in_time = await bounded(leave(), left() * 2 / 3, "leave_group")
    await bounded(pipeline.producer.stop(), left(), "producer_stop")
    pipeline.metrics.model_loaded.set(0)
    log.info(
        "pipeline_stopped",
        drained=drained,
        abandoned=abandoned,
        left_group=left_in_time,
        seconds=round(time.monotonic() - began, 3),
    )
