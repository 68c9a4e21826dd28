"""The measurements of `bench.load`: single-request latency, capacity under a backlog, open-loop arrivals.

Every run goes through `consumer.batching.batcher.Batcher` with the engine's staged calls (stage and respond
in the
prepare pool, only `Engine.run` on the GPU thread), as the service runs it. Times are `time.perf_counter`
seconds; an open-loop event's latency counts from its scheduled arrival, so a late event loop shows up as
latency instead of silently lowering the offered load.
"""

from __future__ import annotations

import asyncio
import functools
import random
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from consumer.batching.batcher import Batcher
from consumer.metrics import Metrics
from consumer.settings import BatchingSettings
from engine.batching.cut import BatchLimits
from engine.types import Between, Launched, RunsWhenLaunched
from schemas.systemone import SystemOneRequest, SystemOneResponse

_DEFAULTS = BatchingSettings()
#: The service's fixed limits (the defaults of `max_batch_records`, `max_batch_tokens`, `max_wait_ms`).
FIXED_DEFAULT: dict[str, Any] = {
    "mode": "fixed",
    "max_batch_records": _DEFAULTS.max_batch_records,
    "max_batch_tokens": _DEFAULTS.max_batch_tokens,
    "max_wait_ms": _DEFAULTS.max_wait_ms,
}
DRAIN_TIMEOUT_S = 120.0


def quantiles(values: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99 (nearest rank) and max of `values`, in milliseconds, from seconds."""
    if not values:
        return {"p50_ms": 0.0, "p95_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
    ordered = sorted(values)

    def rank(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000.0, 2)

    return {"p50_ms": rank(0.50), "p95_ms": rank(0.95), "p99_ms": rank(0.99), "max_ms": rank(1.0)}


class RunLog:
    """`Engine.run` for the GPU thread that records each call's (start, end, records, tokens)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.runs: list[tuple[float, float, int, int]] = []

    def __call__(self, staged: Any, between: Between | None = None) -> Any:
        t = time.perf_counter()
        result = self._engine.run(staged, between)
        prepared = staged.prepared
        self.runs.append((t, time.perf_counter(), len(prepared), sum(p.num_tokens for p in prepared)))
        return result

    def launch(self, staged: Any, between: Between | None = None) -> Launched[Any]:
        """`Engine.launch` for the GPU thread (`batching.launch_ahead`): the call is recorded when its wait
        returns, from its launch to then (so runs queued on the device overlap)."""
        began = time.perf_counter()
        return _LoggedLaunch(self, staged, self._engine.launch(staged, between), began)

    def summary(self, since: int, window: tuple[float, float]) -> dict[str, float]:
        """Batches from index `since` on: records and tokens per batch, GPU time per batch, and the share
        of `window` covered by runs (the union of their spans: runs launched ahead overlap)."""
        runs = self.runs[since:]
        if not runs:
            return {"batches": 0}
        start, end = window
        busy, reached = 0.0, start  # the union of the runs' spans in the window (launched runs overlap)
        for a, b, _, _ in sorted(runs):
            lo, hi = max(a, reached), min(b, end)
            busy += max(0.0, hi - lo)
            reached = max(reached, hi)
        records = [r for _, _, r, _ in runs]
        return {
            "batches": len(runs),
            "records_per_batch_mean": round(statistics.mean(records), 2),
            "records_per_batch_p50": statistics.median(records),
            "records_per_batch_max": max(records),
            "tokens_per_batch_mean": round(statistics.mean(t for _, _, _, t in runs)),
            "batch_ms_p50": round(statistics.median((b - a) * 1000 for a, b, _, _ in runs), 2),
            "gpu_busy": round(busy / max(1e-9, end - start), 3),
        }


class _LoggedLaunch:
    """A launched run that appends its (launch, end of wait, records, tokens) to its `RunLog` when waited."""

    def __init__(self, log: RunLog, staged: Any, launched: Launched[Any], began: float) -> None:
        self._log, self._staged, self._launched, self._began = log, staged, launched, began

    def wait(self) -> tuple[Any, float | None]:
        result = self._launched.wait()
        prepared = self._staged.prepared
        self._log.runs.append(
            (self._began, time.perf_counter(), len(prepared), sum(p.num_tokens for p in prepared))
        )
        return result


class Metered(RunsWhenLaunched[Any, Any]):
    """`engine` as the service's batcher drives it (`engine.types.ServingEngine`), with the batch limits of
    one run and `run` replaced by a recording one (`RunLog`, `bench.engine.TimedRun`), and `launch` by
    `launch` where given (`RunLog.launch`; else `launch` runs at once)."""

    def __init__(
        self,
        engine: Any,
        limits: BatchLimits,
        run: Callable[[Any, Between | None], Any],
        launch: Callable[[Any, Between | None], Launched[Any]] | None = None,
    ) -> None:
        self._engine = engine
        self._run = run
        self._launch = launch
        self.limits = limits

    def launch(self, staged: Any, between: Between | None = None) -> Launched[Any]:
        return super().launch(staged, between) if self._launch is None else self._launch(staged, between)

    def queues_whole(self, staged: Any) -> bool:
        return self._launch is not None and bool(self._engine.queues_whole(staged))

    def prepare(self, request: SystemOneRequest) -> Any:
        return self._engine.prepare(request)

    def stage(self, batch: Sequence[Any]) -> Any:
        return self._engine.stage(batch)

    def run(self, staged: Any, between: Between | None = None) -> Any:
        return self._run(staged, between)

    def respond(self, ran: Any) -> list[SystemOneResponse]:
        responses: list[SystemOneResponse] = self._engine.respond(ran)
        return responses

    def execute(self, batch: Sequence[Any]) -> list[SystemOneResponse]:
        responses: list[SystemOneResponse] = self._engine.execute(batch)
        return responses

    def out_of_memory(self, exc: BaseException) -> bool:
        return bool(self._engine.out_of_memory(exc))

    def lane(self) -> AbstractContextManager[None]:
        lane: AbstractContextManager[None] = self._engine.lane()
        return lane


def _batcher(
    engine: Any, settings: dict[str, Any], metrics: Metrics | None = None
) -> tuple[Batcher[Any, Any, Any], RunLog]:
    log = RunLog(engine)
    batching = BatchingSettings.model_validate(settings)
    batcher: Batcher[Any, Any, Any] = Batcher(
        Metered(engine, batching.limits, log, log.launch), batching, metrics=metrics
    )
    return batcher, log


async def capacity(engine: Any, requests: Sequence[Any], settings: dict[str, Any]) -> dict[str, float]:
    """Submit every request at once (runs of `prepare_chunk`, as the pipeline does) and wait for all
    answers; events/s and tokens/s from the start of the first GPU run to the last answer."""
    batcher, log = _batcher(engine, settings)
    await batcher.start()
    t0 = time.perf_counter()
    step = BatchingSettings.model_validate(settings).prepare_chunk
    futures = [batcher.submit(engine.prepare, requests[i : i + step]) for i in range(0, len(requests), step)]
    outcomes = [o for fut in futures for o in await fut]
    end = time.perf_counter()
    await batcher.close(5.0)
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    if failed:
        raise RuntimeError(f"{len(failed)} records failed, first: {failed[0]!r}")
    first = log.runs[0][0]
    tokens = sum(t for _, _, _, t in log.runs)
    return {
        "events": len(requests),
        "events_s": round(len(requests) / (end - first), 2),
        "tok_s": round(tokens / (end - first)),
        "seconds": round(end - t0, 2),
        **log.summary(0, (first, end)),
    }


def single_latency(engine: Any, pool: Sequence[Any], count: int) -> dict[str, float]:
    """One event at a time over the pool's mix: `prepare` + `execute` directly, and through the adaptive
    batcher (submit -> answer); p50/p99 of each."""
    direct = []
    for i in range(count):
        t = time.perf_counter()
        engine.execute([engine.prepare(pool[i % len(pool)])])
        direct.append(time.perf_counter() - t)

    async def through() -> list[float]:
        batcher, _ = _batcher(engine, {"mode": "adaptive"})
        await batcher.start()
        spans = []
        for i in range(count):
            t = time.perf_counter()
            await batcher.submit(engine.prepare, [pool[i % len(pool)]])
            spans.append(time.perf_counter() - t)
        await batcher.close(5.0)
        return spans

    batched = asyncio.run(through())
    d, b = quantiles(direct), quantiles(batched)
    return {
        "count": count,
        "direct_p50_ms": d["p50_ms"],
        "direct_p99_ms": d["p99_ms"],
        "batcher_p50_ms": b["p50_ms"],
        "batcher_p99_ms": b["p99_ms"],
    }


class LoadRunner:
    """One batcher in one batching mode, fed open-loop Poisson arrivals one load after another."""

    def __init__(self, engine: Any, settings: dict[str, Any], pool: Sequence[Any], seed: int) -> None:
        self._engine = engine
        self._pool = pool
        self._rng = random.Random(seed)
        self.metrics = Metrics()
        self._batcher, self._log = _batcher(engine, settings, self.metrics)

    async def start(self) -> None:
        await self._batcher.start()

    async def close(self) -> None:
        await self._batcher.close(10.0)

    def _metric(self, name: str) -> float:
        return self.metrics.registry.get_sample_value(name) or 0.0

    async def open_loop(self, rate: float, seconds: float) -> dict[str, float]:
        """Poisson arrivals at `rate` events/s for `seconds`, one event per submission; waits for every
        answer (at most `DRAIN_TIMEOUT_S` more) and returns the figures of this load."""
        rng, pool, engine = self._rng, self._pool, self._engine
        since = len(self._log.runs)
        busy0 = self._metric("clef_router_gpu_busy_seconds_total")
        fill0 = (self.metrics.batch_fill.sum, self.metrics.batch_fill.count)
        answered: list[tuple[float, float]] = []
        futures = []
        t0 = time.perf_counter()
        due = t0
        while True:
            due += rng.expovariate(rate)
            if due - t0 >= seconds:
                break
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            fut = self._batcher.submit(engine.prepare, [pool[rng.randrange(len(pool))]])
            fut.add_done_callback(functools.partial(_answered, answered, due))
            futures.append(fut)
        window_end = t0 + seconds
        await asyncio.sleep(max(0.0, window_end - time.perf_counter()))
        out_in_window = sum(1 for _, done in answered if done <= window_end)
        backlog = len(futures) - len(answered)
        if futures:
            await asyncio.wait(futures, timeout=DRAIN_TIMEOUT_S)
        await asyncio.sleep(0)  # let the last done callbacks run
        end = time.perf_counter()
        failed = sum(
            1 for f in futures if f.done() and not f.cancelled() and isinstance(f.result()[0], BaseException)
        )
        busy = self._metric("clef_router_gpu_busy_seconds_total") - busy0
        fills = self.metrics.batch_fill.count - fill0[1]
        return {
            "events": len(futures),
            "events_in_s": round(len(futures) / seconds, 2),
            "events_out_s": round(out_in_window / seconds, 2),
            "backlog_at_end": backlog,
            "unanswered": len(futures) - len(answered),
            "failed": failed,
            "drain_s": round(end - window_end, 2),
            **quantiles([done - arrived for arrived, done in answered]),
            **self._log.summary(since, (t0, window_end)),
            "gpu_busy_metric": round(busy / max(1e-9, end - t0), 3),
            "batch_fill_mean": round((self.metrics.batch_fill.sum - fill0[0]) / fills, 3) if fills else 0.0,
        }


def _answered(answered: list[tuple[float, float]], arrived: float, _future: object) -> None:
    """Done callback of an open-loop event: note when its answer came."""
    answered.append((arrived, time.perf_counter()))
