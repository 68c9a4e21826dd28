"""`bench.e2e --mixed`: Kafka saturated while urgent work arrives at a low rate, on a started broker.

The real `Pipeline` (`bench.e2e_run.service_session`) reads two input topics: `alerts.in` (bulk, the default
priority class) and `alerts.critical` (`batching.priority.topics` gives it class 1, when the settings have
priority classes); the service's HTTP API (`consumer.http.app` behind `ServiceBackend`, served by
`HttpServer` on 127.0.0.1 and a free port) runs beside it on the same loop, as `clef-router run` serves it.

1. a backlog of `MixedPlan.backlog_events` events on `alerts.in`, sent as fast as the producer goes;
2. then, for `seconds`, at once: `alerts.in` at `bulk_rate` (even or Poisson gaps), `alerts.critical` at
   `critical_rate` (Poisson) and `POST /v1/systemone` at `http_rate` (Poisson; `bench.e2e_traffic.HttpLoad`);
3. a drain until every event is decided or dead-lettered and every HTTP request has ended (at most
   `drain_s`), then up to `OFFSETS_WAIT_S` for the group's committed offsets to reach the high watermark of
   every input partition.

One `mixed` line: per class (backlog, bulk, critical, http) sent, answered and latency percentiles (Kafka:
scheduled send to the decision held by the tail consumer; HTTP: request to response), the Kafka throughput
in the window (decisions/s of `alerts.in`) and its ratio to the engine-only figure, the ledger per topic,
the offsets per partition after the drain, the service's per-class histograms (`bench.e2e_report`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bench.e2e_report import (
    Emit,
    class_figures,
    class_histograms,
    http_figures,
    offsets_at_end,
    registry_samples,
    service_counters,
    service_window,
    topic_ledger,
    window_out,
)
from bench.e2e_run import Session, close_quietly, service_session
from bench.e2e_traffic import HttpLoad, Producer
from bench.loop_lag import LoopLag, lag_figures

if TYPE_CHECKING:
    from consumer.http.server import HttpServer
    from consumer.kafka.broker_watch import BrokerWatch
    from devtools.kafka_local import LocalKafka

BULK_TOPIC = "alerts.in"
CRITICAL_TOPIC = "alerts.critical"
CRITICAL_CLASS = 1
BULK_OVER_CAPACITY = 1.2  # the bulk rate without --bulk-rate, over the engine-only figure
BACKLOG, BULK, CRITICAL = 1, 2, 3  # the ledger's loads
OFFSETS_WAIT_S = 10.0
HTTP_TIMEOUT_S = 300.0


def has_priority_classes() -> bool:
    """Whether the service's settings know priority classes (`batching.priority`)."""
    from consumer.settings import BatchingSettings

    return "priority" in BatchingSettings.model_fields


def mixed_batching(batching: Mapping[str, Any]) -> dict[str, Any]:
    """`batching` (a dumped `BatchingSettings`) with `alerts.critical` in class `CRITICAL_CLASS`; unchanged
    where the settings have no priority classes."""
    if not has_priority_classes():
        return dict(batching)
    priority = dict(batching.get("priority") or {})
    priority["topics"] = {**priority.get("topics", {}), CRITICAL_TOPIC: CRITICAL_CLASS}
    return {**batching, "priority": priority}


def mixed_sizes(engine_only_s: float | None, backlog_s: float, bulk_rate: float | None) -> tuple[int, float]:
    """(backlog events, bulk events/s): the backlog is `backlog_s` of work at the engine-only figure (or at
    `bulk_rate` without one), the bulk rate `bulk_rate` or `BULK_OVER_CAPACITY` x the engine-only figure.
    Raises `ValueError` when there is neither."""
    if bulk_rate is None:
        if not engine_only_s:
            raise ValueError(
                "--mixed without an engine-only figure (stub, --capacity-events 0) needs --bulk-rate"
            )
        bulk_rate = round(BULK_OVER_CAPACITY * engine_only_s, 2)
    if bulk_rate <= 0 or backlog_s < 0:
        raise ValueError("--mixed needs a positive --bulk-rate and a --backlog-s of 0 or more")
    return round(backlog_s * (engine_only_s or bulk_rate)), bulk_rate


@dataclass(frozen=True, slots=True)
class MixedPlan:
    """The mixed run: sizes, rates (per second), durations and bounds (seconds)."""

    backlog_events: int
    bulk_rate: float
    critical_rate: float
    http_rate: float
    seconds: float
    drain_s: float
    poisson: bool  # bulk arrivals
    partitions: int
    batching: dict[str, Any]
    engine_only_s: float | None  # events/s of the engine-only figure, None when not measured
    deadline: float  # perf_counter time after which the run does not start and the drain stops


async def mixed_run(
    broker: LocalKafka, engine: Any, values: Sequence[bytes], plan: MixedPlan, t0: float, emit: Emit
) -> dict[str, Any] | None:
    """The run of the module docstring; returns the `mixed` line (None when the deadline left no room or
    the run was interrupted before the window). Stops early on SIGINT/SIGTERM."""
    fields = {
        "batching": plan.batching,
        "topics": {"input": [BULK_TOPIC, CRITICAL_TOPIC]},
        "http": {"enabled": True, "host": "127.0.0.1", "port": 0},
    }
    async with service_session(broker, engine, plan.partitions, fields, t0, emit) as run:
        left = plan.deadline - time.perf_counter()
        if left < plan.seconds + 10.0:
            emit(kind="skipped", mixed=True, reason=f"deadline: {left:.0f} s left")
            return None
        server, watch = await _http_server(run)
        bootstrap = broker.bootstrap_servers
        bulk = Producer(bootstrap, BULK_TOPIC, values, run.ledger, seed=2, prefix="B")
        critical = Producer(bootstrap, CRITICAL_TOPIC, values, run.ledger, seed=5, prefix="C")
        http = HttpLoad(f"http://127.0.0.1:{server.port}", values, seed=7, timeout_s=HTTP_TIMEOUT_S)
        try:
            await bulk.start()
            await critical.start()
            return await _mixed(run, plan, bulk, critical, http, emit)
        finally:
            await close_quietly((http.stop, bulk.stop, critical.stop, server.stop, watch.stop), emit)


async def _http_server(run: Session) -> tuple[HttpServer, BrokerWatch]:
    """The service's HTTP app on the pipeline, served on the loop, and its broker watch; both started."""
    from consumer.http.backends import ServiceBackend, http_server
    from consumer.kafka.broker_watch import BrokerWatch

    settings, pipeline = run.settings, run.pipeline
    watch = BrokerWatch(settings.kafka, pipeline.metrics, settings.http.broker_unreachable_s)
    server = http_server(settings, ServiceBackend(pipeline, watch), pipeline.metrics)
    await server.start()
    await watch.start()
    return server, watch


async def _mixed(
    run: Session, plan: MixedPlan, bulk: Producer, critical: Producer, http: HttpLoad, emit: Emit
) -> dict[str, Any] | None:
    """Steps 1-3 of the module docstring on started clients; the `mixed` line (emitted too)."""
    run.sampler.load = BACKLOG
    loop_lag = LoopLag()
    loop_lag.start()  # from the backlog's first send: the service fetches it while it is being sent
    try:
        return await _window(run, plan, bulk, critical, http, loop_lag, emit)
    finally:
        await loop_lag.stop()


async def _window(
    run: Session,
    plan: MixedPlan,
    bulk: Producer,
    critical: Producer,
    http: HttpLoad,
    loop_lag: LoopLag,
    emit: Emit,
) -> dict[str, Any] | None:
    """`_mixed` with the loop's lag sampled throughout."""
    ledger, sampler, stop = run.ledger, run.sampler, run.stop
    began = await bulk.burst(BACKLOG, plan.backlog_events, stop)
    backlog_send_s = round(time.perf_counter() - began, 2)
    emit(kind="backlog", events=plan.backlog_events, send_s=backlog_send_s)
    if stop.is_set():
        return None
    before = service_counters(run.pipeline)
    sampler.load = BULK
    window_start = time.perf_counter()
    sends = [bulk.run(BULK, plan.bulk_rate, plan.seconds, plan.poisson, stop)]
    if plan.critical_rate > 0:
        sends.append(critical.run(CRITICAL, plan.critical_rate, plan.seconds, True, stop))
    if plan.http_rate > 0:
        sends.append(http.run(plan.http_rate, plan.seconds, stop))
    await asyncio.gather(*sends)
    await asyncio.sleep(max(0.0, window_start + plan.seconds - time.perf_counter()))
    window_end = time.perf_counter()
    service_fig = service_window(before, service_counters(run.pipeline), window_end - window_start)
    sampler.load = -1
    drained = await _drain(run, http, min(plan.drain_s, max(1.0, plan.deadline - time.perf_counter())))
    offsets = await _offsets(run, OFFSETS_WAIT_S)
    kafka_out = window_out(ledger, (BACKLOG, BULK), window_start, window_end)
    engine_only = plan.engine_only_s
    lags = [s["lag"] for s in sampler.samples if s["load"] == BULK]
    line = {
        "kind": "mixed",
        "bulk_topic": BULK_TOPIC,
        "critical_topic": CRITICAL_TOPIC,
        "critical_class": CRITICAL_CLASS if has_priority_classes() else None,
        "backlog_events": plan.backlog_events,
        "backlog_send_s": backlog_send_s,
        "bulk_rate": plan.bulk_rate,
        "critical_rate": plan.critical_rate,
        "http_rate": plan.http_rate,
        "seconds": plan.seconds,
        "classes": {
            "backlog": class_figures(ledger, (BACKLOG,)),
            "bulk": class_figures(ledger, (BULK,)),
            "critical": class_figures(ledger, (CRITICAL,)),
            "http": http_figures(http.calls),
        },
        "kafka_out_s": kafka_out,
        "kafka_out_over_engine_only": round(kafka_out / engine_only, 3) if engine_only else None,
        "topics": {
            BULK_TOPIC: topic_ledger(ledger, (BACKLOG, BULK)),
            CRITICAL_TOPIC: topic_ledger(ledger, (CRITICAL,)),
        },
        "offsets": offsets,
        "offsets_at_end": offsets_at_end(offsets),
        "drain_s": drained,
        "lag_max": max(lags, default=0),
        # the service's loop (it is this process's): lateness of a 5 ms sleep, times from the window start
        "loop_lag": lag_figures(loop_lag.samples, window_start),
        **service_fig,
        "service_classes": class_histograms(registry_samples(run.pipeline.metrics.registry)),
        "interrupted": stop.is_set(),
    }
    emit(**line)
    return line


async def _drain(run: Session, http: HttpLoad, limit: float) -> float:
    """Wait until every event sent is decided or dead-lettered and no HTTP request is pending (at most
    `limit` s, or until `run.stop`); returns the seconds waited."""
    began = time.perf_counter()
    ledger = run.ledger
    ids = list(ledger.sent)
    while time.perf_counter() - began < limit and not run.stop.is_set():
        ids = [eid for eid in ids if eid not in ledger.decided and eid not in ledger.dead]
        if not ids and http.pending == 0:
            break
        await asyncio.sleep(0.05)
    return round(time.perf_counter() - began, 2)


async def _offsets(run: Session, limit: float) -> list[dict[str, Any]]:
    """The input partitions' offsets (`LagSampler.partition_offsets`) once every committed offset reached
    its high watermark, or the last read after `limit` s (empty when no read answered)."""
    deadline = time.monotonic() + limit
    offsets: list[dict[str, Any]] = []
    while True:
        with contextlib.suppress(Exception):  # a slow answer: read again until the bound
            offsets = await run.sampler.partition_offsets()
        if offsets_at_end(offsets) or time.monotonic() > deadline or run.stop.is_set():
            return offsets
        await asyncio.sleep(0.25)
