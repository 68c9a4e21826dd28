"""Adaptive batch sizing: the GPU cost model and the pure rule that decides when to cut the next batch.

Both modes cut by the engine's one rule (`engine.batching.cut.take`: packed cost, arrival order, within
the engine's `BatchLimits`); they differ in the token budget and the moment. The fixed mode waits up to
`max_wait_ms` for a batch to fill, so under light load every record pays the wait and under a backlog the
budget may be smaller than the GPU's best. The adaptive rule (`plan_adaptive`) instead follows the queue
and the measured GPU time:

- While the GPU has nothing to do, the records that are ready go at once (no wait: at light load a batch is
  one or a few records, and a record's latency is close to the engine's single-request latency).
- While the GPU is busy, the next batch is cut just before the GPU frees up (its predicted end minus the
  time staging takes), so everything that arrived meanwhile rides in it: the batch grows with the load.
- Its token budget is what the GPU runs in half the latency target (a record then waits for at most one
  batch and runs in the next), so a burst is served in slices that each meet the target; once the oldest
  waiting record has waited more than half the target, the target is lost for the queue anyway and the
  budget opens to the engine's `max_tokens`, where the GPU is most efficient, until the backlog is gone.

`CostModel` predicts a batch's GPU seconds as `overhead + per_token * tokens`, a least-squares fit over
the last batches the GPU ran. Everything here is pure and single-threaded (the batcher calls it on the
event loop).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from engine.batching.cut import BatchLimits, take


class CostLike(Protocol):
    """What the adaptive rule needs from a cost model (`CostModel`; tests inject fixed ones)."""

    def observe(self, tokens: int, seconds: float) -> None: ...

    def predict(self, tokens: int) -> float | None: ...

    def tokens_within(self, seconds: float) -> int | None: ...


class CostModel:
    """GPU seconds of a batch as `overhead + per_token * tokens`, fit over the last `window` batches.

    `predict` and `tokens_within` return None until two batches were observed. A fit whose slope is not
    positive (noise, all batches of one size) falls back to the mean time per token with no overhead.
    """

    def __init__(self, window: int = 64) -> None:
        self._points: deque[tuple[int, float]] = deque(maxlen=window)
        self.overhead = 0.0
        self.per_token = 0.0

    @property
    def ready(self) -> bool:
        """True once the model has a fit."""
        return self.per_token > 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        """Add one batch the GPU ran (`tokens` in it, `seconds` of GPU time) and refit."""
        if tokens <= 0 or seconds <= 0.0:
            return
        self._points.append((tokens, seconds))
        if len(self._points) < 2:
            return
        n = len(self._points)
        mean_t = sum(t for t, _ in self._points) / n
        mean_s = sum(s for _, s in self._points) / n
        var = sum((t - mean_t) ** 2 for t, _ in self._points)
        cov = sum((t - mean_t) * (s - mean_s) for t, s in self._points)
        slope = cov / var if var > 0 else 0.0
        overhead = mean_s - slope * mean_t
        if slope <= 0.0 or overhead < 0.0:
            slope, overhead = mean_s / mean_t, 0.0
        self.per_token, self.overhead = slope, overhead

    def predict(self, tokens: int) -> float | None:
        """Predicted GPU seconds of a batch of `tokens`, or None before the first fit."""
        if not self.ready:
            return None
        return self.overhead + self.per_token * tokens

    def tokens_within(self, seconds: float) -> int | None:
        """The most tokens predicted to run within `seconds` (at least 1), or None before the first fit."""
        if not self.ready:
            return None
        return max(1, int((seconds - self.overhead) / self.per_token + 1e-6))  # 1e-6: float noise


class TimerLateness:
    """How late a timed wait wakes up (seconds): an exponential average of each wait's lateness, a sample
    counted up to `cap` (a loop stalled longer is not the timers' doing). The event loop's timers wake up
    to a millisecond late (epoll's timeout is in whole ms), so a batch cut on a timer just before the GPU
    frees up would otherwise miss it by that much; the batcher cuts this much earlier."""

    def __init__(self, cap: float = 0.005, weight: float = 0.2) -> None:
        self.cap = cap
        self.weight = weight
        self.value = 0.0

    def observe(self, asked: float, slept: float) -> None:
        """One timed wait of `asked` seconds that woke after `slept`."""
        late = min(self.cap, max(0.0, slept - asked))
        self.value += self.weight * (late - self.value)


class GpuQueue:
    """The batcher's view of the GPU (event loop only): the tokens of every batch cut and not yet off the
    GPU (FIFO: one GPU thread) with the GPU seconds predicted for it at its cut, when the GPU started on the
    first of them, and the cost model it learns."""

    def __init__(self, cost: CostLike) -> None:
        self.cost = cost
        self._outstanding: deque[tuple[int, float | None]] = deque()
        self._mark = 0.0

    def cut(self, tokens: int, now: float, lead: float) -> None:
        """A batch of `tokens` was cut; staging it takes about `lead` seconds."""
        if not self._outstanding:  # the GPU is idle: it starts on this batch once it is staged
            self._mark = now + lead
        self._outstanding.append((tokens, self.cost.predict(tokens)))

    @property
    def busy(self) -> bool:
        """True while a batch cut is not yet off the GPU."""
        return bool(self._outstanding)

    def done(self, tokens: int, seconds: float, now: float, *, learn: bool) -> float | None:
        """The oldest batch (of `tokens`) left the GPU after `seconds` there; learn its cost when `learn`
        (one clean run), and start the clock on the next one. Returns the GPU seconds predicted for it at its
        cut (None: the cost model had no fit yet)."""
        _, predicted = self._outstanding.popleft()
        self._mark = now
        if learn:
            self.cost.observe(tokens, seconds)
        return predicted

    def free_in(self, now: float) -> float:
        """Predicted seconds until the GPU has run every batch cut so far (0 when none is outstanding or
        the cost model cannot tell yet)."""
        predicted = 0.0
        for tokens, _ in self._outstanding:  # with the current fit, not the one at each cut
            seconds = self.cost.predict(tokens)
            if seconds is None:
                return 0.0
            predicted += seconds
        return max(0.0, self._mark + predicted - now) if self._outstanding else 0.0


@dataclass(frozen=True, slots=True)
class AdaptiveView:
    """What the batcher knows when it plans: all durations in seconds.

    `head_age`: how long the oldest ready record has waited. `gpu_free_in`: predicted time until the GPU
    has run every batch already cut (0 when idle). `lead`: how long from a decision to cut until the batch
    is queued on the GPU thread (a timed wait's lateness, staging, the hand-offs), so a batch cut `lead`
    before the GPU frees up is there in time.
    """

    head_age: float
    gpu_free_in: float
    lead: float


@dataclass(frozen=True, slots=True)
class AdaptiveDecision:
    """Cut the first `count` ready records now (`wait` == 0), or wait up to `wait` seconds and plan again
    (earlier when a record becomes ready or a batch leaves the GPU). `budget` is the token budget used."""

    count: int
    wait: float
    budget: int


def adaptive_budget(
    cost: CostLike,
    *,
    max_tokens: int,
    latency_target: float,
    head_age: float,
    queued_tokens: int = 0,
    backlog_batches: float = 0.0,
) -> int:
    """The token budget of the next batch: what the GPU runs in half of `latency_target`, or
    `max_tokens` once the oldest record has waited more than half the target and more than
    at least `backlog_batches` such batches of tokens wait (`queued_tokens`; 0: the wait alone opens it), or
    before the cost model has a fit. Never above `max_tokens`.

    A short burst (a few target-sized batches) is then still served in target-sized slices, so the records
    behind it do not wait for one batch of `max_tokens`; a real backlog runs at the GPU's best."""
    within = cost.tokens_within(latency_target / 2.0)
    if within is None:
        return max_tokens
    within = max(1, min(max_tokens, within))
    if head_age > latency_target / 2.0 and queued_tokens >= backlog_batches * within:
        return max_tokens
    return within


def plan_adaptive(
    tokens: Sequence[int],
    view: AdaptiveView,
    cost: CostLike,
    *,
    limits: BatchLimits,
    latency_target: float,
    fallback_wait: float,
    backlog_batches: float = 0.0,
) -> AdaptiveDecision:
    """Decide the next batch from the ready records' token counts (in arrival order). Pure.

    The batch is what `take` cuts within `limits` with the adaptive budget as its token limit. Cut now when
    that batch is full or the GPU frees up within `view.lead`; otherwise wait until `lead` before the GPU's
    predicted end (`fallback_wait` when the cost model cannot predict it yet).
    """
    budget = adaptive_budget(
        cost,
        max_tokens=limits.max_tokens,
        latency_target=latency_target,
        head_age=view.head_age,
        queued_tokens=sum(tokens),
        backlog_batches=backlog_batches,
    )
    count, full = take(tokens, limits.with_tokens(budget), "packed")
    if count == 0:
        return AdaptiveDecision(0, fallback_wait, budget)
    if full or view.gpu_free_in <= view.lead:
        return AdaptiveDecision(count, 0.0, budget)
    if cost.predict(1) is None:
        return AdaptiveDecision(count, fallback_wait, budget)
    return AdaptiveDecision(count, view.gpu_free_in - view.lead, budget)
