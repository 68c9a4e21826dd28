"""The metrics of one finished batch: its size, its engine time, and per priority class the queue wait and
end-to-end latency of its submissions (`consumer.metrics.Metrics`). Event loop only, like the batcher."""

from __future__ import annotations

from consumer.batching.gpu import BatchTimes
from consumer.batching.submission import Submission
from consumer.metrics import Metrics
from engine.batching.split import SplitStats


def observe_batch(
    m: Metrics,
    counts: dict[Submission, int],
    stats: SplitStats,
    tokens: int,
    elapsed: float,
    started: float,
    now: float,
    times: BatchTimes | None = None,
) -> None:
    """Record one batch: `counts` its records per submission, `stats` how its run went, `tokens` its size,
    `elapsed` its engine seconds, `started` and `now` (the batcher's clock) when it was dispatched and
    finished, `times` where its time went after the cut (once per record; None: not known, e.g. split).
    A submission's latency is observed when its last record is settled."""
    records = sum(counts.values())
    m.batch_records.observe(records)
    if times is not None:
        for step, ms in times.steps():
            m.batch_path.labels(step).observe(ms / 1000.0, records)
    m.batch_tokens.observe(tokens)
    m.engine_seconds.observe(elapsed)
    for sub, count in counts.items():  # records of one submission became ready together
        wait = max(0.0, started - sub.ready_at)
        m.queue_wait.observe(wait, count)
        m.class_queue_wait.labels(str(sub.priority)).observe(wait, count)
        if sub.left == 0:
            m.class_latency.labels(str(sub.priority)).observe(max(0.0, now - sub.submitted_at))
    if stats.splits:
        m.batch_splits.inc(stats.splits)
        m.retries.labels(kind="engine_split").inc(stats.splits)
