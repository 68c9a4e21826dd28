"""The metrics of one finished batch: its size, its engine time, per priority class the queue wait and
end-to-end latency of its submissions, and its GPU time against the cost model's prediction
(`consumer.metrics.Metrics`). Event loop only, like the batcher."""

from __future__ import annotations

from consumer.batching.gpu import BatchTimes
from consumer.batching.submission import Submission
from consumer.metrics import Metrics
from engine.batching.split import SplitStats

COST_DIRECTIONS = ("over", "under")
"""The `direction` labels of `Metrics.batch_cost_error`: the GPU took longer than predicted, or not."""


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


def observe_cost(m: Metrics, predicted: float | None, seconds: float, *, learn: bool) -> None:
    """Record how far a batch's GPU `seconds` were from the cost model's prediction at its cut (`predicted`;
    None before the model's first fit: nothing recorded), by direction: `over` (the next batch, cut for the
    predicted end, waits on the GPU thread) or `under` (the GPU idles until the next one is staged). Only a
    clean run (`learn`) counts: a split batch ran as several."""
    if predicted is None or not learn:
        return
    error = seconds - predicted
    over, under = COST_DIRECTIONS
    m.batch_cost_error.labels(over if error > 0 else under).observe(abs(error))
