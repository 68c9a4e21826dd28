"""`bench.e2e`'s measured run: the engines it serves with, then steps 4-7 of `bench.e2e`'s docstring on a
started broker: the service's topics, the real `Pipeline` in this event loop (`service_session`, shared with
the mixed run of `bench.e2e_mixed`), the producer's loads one after another each followed by a drain
(traffic in and out: `bench.e2e_traffic`), and the lag sampler.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from bench.e2e_report import Emit, load_figures, service_counters, service_window
from bench.e2e_traffic import LINGER_MS, Ledger, Producer, Tail

if TYPE_CHECKING:
    from bench.routing import Routing
    from consumer.pipeline.pipeline import Pipeline
    from consumer.settings import Settings
    from devtools.kafka_local import LocalKafka

SAMPLE_EVERY_S = 1.0
KAFKA_CALL_TIMEOUT_S = 5.0


class FastPathFlags(TypedDict, total=False):
    """The bool switches of `ClefOmniModel.enable_fast_path` that the benches' modes set."""

    fp8_experts: bool
    fp8_attention: bool
    text_only: bool
    fused_experts: bool


FP8_MODES: dict[str, FastPathFlags] = {
    "off": {},
    "experts": {"fp8_experts": True},
    "attention": {"fp8_experts": True, "fp8_attention": True},
    "text": {"fp8_experts": True, "fp8_attention": True, "text_only": True},
}
"""`build_engines`' FP8 choices for the full-size model (`ClefOmniModel.enable_fast_path` arguments; the
service's `engine.fp8_experts`, `engine.fp8_attention` and `engine.fp8_text_only`: "text" frees the bf16
experts, about 45 GB at peak instead of about 99, so it fits an 80 GB card)."""


def build_engines(
    kind: str,
    layers: int | None,
    max_tokens: int,
    routing: Routing = "levelled",
    fp8: str = "off",
    *,
    lane_stream: bool = False,
    sm90: bool = False,
) -> tuple[Any, Any]:
    """(engine for the pipeline, engine whose tokenizer sizes the events); blocking. `full`: the full-size
    model on CUDA (`layers` decoder layers, None = 48, FP8 as `FP8_MODES[fp8]`); `tiny`: the tiny release
    on CPU (both the same); `stub`: `StubEngine`, events sized with the tiny release. `lane_stream`: the
    full engine's `EngineConfig.lane_stream`. `sm90` (full, FP8 only; as `EngineConfig.sm90_experts`): the
    FP8 experts of the calls `engine.kernels.moe_fp8_sm90` takes through its CUDA cluster kernels, built
    here (nvcc and ninja needed), the graphs captured with them; `BENCH_SM90_FROM_ROWS` replaces its
    `FROM_ROWS_PER_EXPERT` (the average rows an expert from which a call takes both kernels)."""
    from bench.load import build
    from engine.batching.cut import BatchLimits

    if kind == "tiny":
        engine = build(True, max_tokens)
        return engine, engine
    if kind == "stub":
        from devtools.stub import StubEngine

        return StubEngine(BatchLimits(max_tokens, 256)), build(True, max_tokens)
    from bench.workload import build_engine
    from engine.model.graphs import default_buckets
    from engine.runner import EngineConfig

    limits = BatchLimits(max_tokens, 256)
    config = EngineConfig(device="cuda", dtype="bfloat16", limits=limits, lane_stream=lane_stream)
    engine = build_engine(config, num_layers=layers, routing=routing)
    buckets = default_buckets(max_tokens)
    graph_to = int(os.environ.get("BENCH_E2E_GRAPH_TO", "0"))  # an experiment: graphs up to this many tokens
    if graph_to:
        from bench.batch_sizes import buckets_to

        buckets = buckets_to(min(graph_to, max_tokens))
    ext = None
    if sm90:
        from engine.kernels import moe_fp8_sm90

        ext = moe_fp8_sm90.build(moe_fp8_sm90.BUILD_DIR)
        from_rows = os.environ.get("BENCH_SM90_FROM_ROWS")  # an experiment: where the CUDA kernels take over
        if from_rows:
            moe_fp8_sm90.FROM_ROWS_PER_EXPERT = int(from_rows)
    engine.model.enable_fast_path(graph_buckets=buckets, sm90_experts=ext, **FP8_MODES[fp8])
    return engine, engine


class LagSampler:
    """Once a second: high watermarks of the input partitions (every partition of `topics`) against the
    group's committed offsets."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        topics: Sequence[str],
        partitions: int,
        pipeline: Pipeline[Any, Any, Any],
        ledger: Ledger,
    ) -> None:
        from aiokafka import AIOKafkaConsumer, TopicPartition
        from aiokafka.admin import AIOKafkaAdminClient

        self._tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]
        self._group = group
        self._offsets = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        self._admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        self._pipeline = pipeline
        self._ledger = ledger
        self.samples: list[dict[str, Any]] = []
        self.load = -1  # index of the load now running (-1: warm-up or between loads)
        self._task: asyncio.Task[None] | None = None

    async def start(self, t0: float, emit: Emit) -> None:
        await self._offsets.start()
        await self._admin.start()
        self._task = asyncio.create_task(self._loop(t0, emit), name="e2e-lag")

    async def sample(self) -> tuple[int, int]:
        """(sum of high watermarks, sum of committed offsets) over the input partitions."""
        offsets = await self.partition_offsets()
        return sum(o["high"] for o in offsets), sum(o["committed"] for o in offsets)

    async def partition_offsets(self) -> list[dict[str, Any]]:
        """Per input partition: topic, partition, high watermark and the group's committed offset (0 when
        none). Awaits one ListOffsets and one OffsetFetch, each bounded by `KAFKA_CALL_TIMEOUT_S` (raises
        `TimeoutError` or the client's error)."""
        ends = await asyncio.wait_for(self._offsets.end_offsets(self._tps), KAFKA_CALL_TIMEOUT_S)
        committed = await asyncio.wait_for(
            self._admin.list_consumer_group_offsets(self._group, partitions=self._tps), KAFKA_CALL_TIMEOUT_S
        )
        done = {tp: max(0, m.offset) for tp, m in committed.items()}
        return [
            {"topic": tp.topic, "partition": tp.partition, "high": ends[tp], "committed": done.get(tp, 0)}
            for tp in self._tps
            if tp in ends
        ]

    async def _loop(self, t0: float, emit: Emit) -> None:
        due = time.perf_counter()
        while True:
            due += SAMPLE_EVERY_S
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            try:
                high, committed = await self.sample()
            except Exception as exc:  # a slow answer under load: note it, keep sampling
                emit(kind="lag_error", t=round(time.perf_counter() - t0, 2), error=repr(exc)[:200])
                continue
            line = {
                "kind": "lag",
                "t": round(time.perf_counter() - t0, 2),
                "load": self.load,
                "high_watermark": high,
                "committed": committed,
                "lag": high - committed,
                "produced": len(self._ledger.sent),
                "decided": len(self._ledger.decided),
                "in_flight": self._pipeline.in_flight,
            }
            self.samples.append(line)
            emit(**line)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._offsets.stop()
        await self._admin.close()


@dataclass(frozen=True, slots=True)
class Plan:
    """The Kafka part of a run: loads, durations and bounds (seconds)."""

    rates: tuple[float, ...]
    seconds: float
    warmup_s: float
    drain_s: float
    poisson: bool
    partitions: int
    batching: dict[str, Any]
    deadline: float  # perf_counter time after which no load starts and drains stop
    kafka: dict[str, Any] = field(default_factory=dict)  # service Kafka settings of the run (`--set kafka.*`)
    linger_ms: int = LINGER_MS  # the load producer's (`bench.e2e_traffic.LINGER_MS`)


async def drain(ledger: Ledger, load: int, limit: float, stop: asyncio.Event) -> float:
    """Wait until every event of `load` is decided or dead-lettered (at most `limit` s); returns seconds."""
    began = time.perf_counter()
    ids = [eid for eid, s in ledger.sent.items() if s.load == load]
    while time.perf_counter() - began < limit and not stop.is_set():
        if all(eid in ledger.decided or eid in ledger.dead for eid in ids):
            break
        await asyncio.sleep(0.05)
    return round(time.perf_counter() - began, 2)


@dataclass(frozen=True, slots=True)
class Session:
    """A running service on the broker (see `service_session`): its settings, pipeline and the bench's
    clients. `stop` is set by SIGINT/SIGTERM."""

    settings: Settings
    group: str
    pipeline: Pipeline[Any, Any, Any]
    ledger: Ledger
    tail: Tail
    sampler: LagSampler
    stop: asyncio.Event


@contextlib.asynccontextmanager
async def service_session(
    broker: LocalKafka,
    engine: Any,
    partitions: int,
    fields: Mapping[str, Any],
    t0: float,
    emit: Emit,
) -> AsyncIterator[Session]:
    """Create the service's topics (`partitions` each), run the real `Pipeline` on this loop with the
    default settings, a fresh group and `fields` (top-level settings sections, e.g. `batching`, `http`,
    `topics`), and start the tail consumer and the lag sampler over every input topic; yields once the
    pipeline is ready (raises what stopped it, or `TimeoutError` after 60 s). On exit: the `ledger` line,
    the bench's clients closed, the pipeline stopped and drained, the signal handlers removed."""
    from consumer.kafka.access import service_topics
    from consumer.pipeline.pipeline import Pipeline
    from consumer.settings import load_settings

    bootstrap = broker.bootstrap_servers
    group = f"e2e-{uuid.uuid4().hex[:8]}"
    # the pipeline sets the GIL switch interval at start: this process's (BENCH_E2E_SWITCH_INTERVAL_MS),
    # unless `fields` names one
    top = {"gil_switch_interval_ms": sys.getswitchinterval() * 1000.0} | {
        k: v for k, v in fields.items() if k != "kafka"
    }
    settings = load_settings(
        kafka={**fields.get("kafka", {}), "bootstrap_servers": bootstrap, "group_id": group},
        log_level="warning",
        **top,
    )
    topics = settings.topics
    names = service_topics(topics, settings.routing.department_map.values())
    await asyncio.to_thread(broker.create_topics, names, partitions=partitions)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    ledger = Ledger()
    pipeline = Pipeline(settings, engine)
    service = asyncio.create_task(pipeline.run(), name="e2e-pipeline")
    tail = Tail(bootstrap, topics.decisions, topics.dlq, partitions, ledger)
    sampler = LagSampler(bootstrap, group, topics.input, partitions, pipeline, ledger)
    try:
        await _until(lambda: pipeline.ready() or service.done(), 60.0, "pipeline ready")
        if service.done():
            await service  # raises what stopped it
        await tail.start()
        await sampler.start(t0, emit)
        emit(kind="note", t=round(time.perf_counter() - t0, 2), message="pipeline ready", group=group)
        yield Session(settings, group, pipeline, ledger, tail, sampler, stop)
    finally:
        emit(
            kind="ledger",
            sent=len(ledger.sent),
            decided=len(ledger.decided),
            dead_lettered=len(ledger.dead),
            duplicates=ledger.duplicates,
            unknown=ledger.unknown,
            send_errors=ledger.send_errors,
        )
        await close_quietly((sampler.stop, tail.stop), emit)
        pipeline.request_stop()
        try:
            await asyncio.wait_for(service, settings.kafka.shutdown_timeout_s + 5)
        except Exception as exc:
            emit(kind="note", message=f"pipeline stopped with {exc!r}"[:300])
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def close_quietly(closers: Sequence[Callable[[], Any]], emit: Emit) -> None:
    """Await each closer in turn (bounded); a failure is a `note` line, and the next one still runs."""
    for closing in closers:
        try:
            await asyncio.wait_for(closing(), KAFKA_CALL_TIMEOUT_S * 2)
        except Exception as exc:  # a client that never started, or a broker gone: note it, go on
            emit(kind="note", message=f"closing a client: {exc!r}"[:300])


async def kafka_run(
    broker: LocalKafka, engine: Any, values: Sequence[bytes], plan: Plan, t0: float, emit: Emit
) -> list[dict[str, Any]]:
    """Steps 4-7 of `bench.e2e`'s docstring; returns the `load` lines. Stops early on SIGINT/SIGTERM."""
    fields = {"batching": plan.batching, "http": {"enabled": False}, "kafka": plan.kafka}
    results: list[dict[str, Any]] = []
    async with service_session(broker, engine, plan.partitions, fields, t0, emit) as run:
        producer = Producer(
            broker.bootstrap_servers,
            run.settings.topics.input[0],
            values,
            run.ledger,
            seed=2,
            linger_ms=plan.linger_ms,
        )
        try:
            await producer.start()
            await _loads(broker, producer, run, plan, emit, results)
        finally:
            await close_quietly((producer.stop,), emit)
    return results


async def _loads(
    broker: LocalKafka,
    producer: Producer,
    run: Session,
    plan: Plan,
    emit: Emit,
    results: list[dict[str, Any]],
) -> None:
    """The warm-up and the loads of `plan`, each followed by its drain; appends each `load` line."""
    pipeline, ledger, sampler, stop = run.pipeline, run.ledger, run.sampler, run.stop
    if plan.warmup_s > 0:
        await producer.run(0, plan.rates[0], plan.warmup_s, plan.poisson, stop)
        drained = await drain(ledger, 0, plan.drain_s, stop)
        emit(kind="warmup", rate=plan.rates[0], seconds=plan.warmup_s, drain_s=drained)
    for index, rate in enumerate(plan.rates, start=1):
        if stop.is_set():
            break
        left = plan.deadline - time.perf_counter()
        if left < plan.seconds + 10.0:
            emit(kind="skipped", rate=rate, reason=f"deadline: {left:.0f} s left")
            continue
        before = service_counters(pipeline)
        broker_cpu = broker.cpu_seconds()
        sampler.load = index
        began = await producer.run(index, rate, plan.seconds, plan.poisson, stop)
        await asyncio.sleep(max(0.0, began + plan.seconds - time.perf_counter()))
        window_end = time.perf_counter()
        service_fig = service_window(before, service_counters(pipeline), window_end - began)
        cpu_after = broker.cpu_seconds()
        sampler.load = -1
        limit = min(plan.drain_s, max(1.0, plan.deadline - time.perf_counter()))
        drained = await drain(ledger, index, limit, stop)
        line = {
            "kind": "load",
            "rate": rate,
            "seconds": plan.seconds,
            **load_figures(ledger, index, began, plan.seconds, sampler.samples),
            "drain_s": drained,
            **service_fig,
            "broker_cpu_share": (
                round((cpu_after - broker_cpu) / (window_end - began), 3)
                if broker_cpu is not None and cpu_after is not None
                else None
            ),
            "interrupted": stop.is_set(),
        }
        results.append(line)
        emit(**line)


async def _until(condition: Callable[[], bool], limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {limit_s:.0f} s")
        await asyncio.sleep(0.05)
