"""`python3 -m bench.e2e`: the whole service end to end through a real Apache Kafka broker, at fixed rates.

One process, one run (a benchmark program, not a test; nothing here asserts a speed):

1. a local single-node broker (`devtools.kafka_local.LocalKafka`, loopback only) starts in a helper thread
   while the engine is built: `--engine full` (default with CUDA) the full-size Clef-omni thinker and joint
   head with random bf16 weights (`bench.workload.build_engine`, fast path and CUDA graphs, as `bench.load`;
   `--layers N` builds fewer decoder layers for a quick probe), `tiny` the tiny release on CPU, `stub`
   `devtools.stub.StubEngine` (answers at once: the Kafka side alone);
2. a pool of distinct SystemOne requests with `bench.load`'s mix (target lengths 40% 200-500 tokens, 40%
   500-1,000, 20% 1,000-1,500; 3 questions each; sized with the tiny release's tokenizer), sent as JSON
   record values;
3. the engine-only figure of the same process: `bench.load_run.capacity`, a backlog through the service's
   batcher at the pipeline's batching settings, no Kafka (after a warm-up batch run, as `bench.load`);
4. the service's topics (`consumer.settings` defaults: `alerts.in`, `decisions`, `route.*`, `alerts.dlq`)
   created with `--partitions`; the real `consumer.pipeline.pipeline.Pipeline` (at-least-once, the default
   settings
   except the broker address, a fresh group and the HTTP API off) runs in this process's event loop;
5. a producer (acks=all, idempotent) sends events at a fixed rate (`--arrivals uniform`, or Poisson) for a
   warm-up (`--warmup-s`) and then for `--seconds` at each of `--rate`, one after another, each followed by a
   drain until every event of the load is decided (at most `--drain-s`);
6. a tail consumer reads `decisions` and `alerts.dlq`: latency counts from each event's scheduled send time
   (so a producer that falls behind shows up as latency) to the moment the tail consumer holds its decision
   (`ce_id` header, kept by the router); the record-timestamp latency (decision CreateTime minus the input's
   CreateTime, which the producer sets to the scheduled time) is given beside it;
7. a lag sampler, once a second: the input partitions' high watermarks (ListOffsets) against the group's
   committed offsets (OffsetFetch), plus produced, decided and in-flight counts.

Writes `e2e.jsonl` (every line: info, capacity, lag samples, one `load` line per rate, done), `e2e.txt` (the
summary table) and `broker.log` (the broker's WARN+ log) to `--out` (default `$OUT` or `bench-out/`), and
prints the JSON lines and the table. Ctrl-C / SIGTERM: the current load stops, the pipeline drains, the
broker stops. The wall time is bounded by `--deadline-s` (loads that would not fit are skipped).

On the GPU machine it runs through `scripts/device-e2e.sh`, which unpacks the carried JRE, broker jars and
wheels; it installs nothing itself. Without PyAV (too large to carry), a placeholder `av` module lets the
engine package import: these events carry no media, so PyAV is never called.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import math
import os
import random
import shutil
import signal
import statistics
import sys
import time
import types
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from consumer.pipeline.pipeline import Pipeline
    from devtools.kafka_local import LocalKafka

Emit = Callable[..., None]
CE_ID = "ce_id"
#: Broker log lines that mean a class the carried jars or JRE lack was needed.
MISSING_CLASS_MARKERS = ("NoClassDefFoundError", "ClassNotFoundException", "UnsatisfiedLinkError")
SAMPLE_EVERY_S = 1.0
KAFKA_CALL_TIMEOUT_S = 5.0


def install_av_placeholder() -> bool:
    """Register a placeholder `av` module when PyAV cannot be imported, so `engine` imports (its media code
    imports PyAV at module level and names `av.FFmpegError` there). Any other attribute raises
    `AttributeError` saying PyAV is missing (an AttributeError, so `hasattr` and `inspect` see a module
    without it). Returns True when the placeholder was installed, False when PyAV is there."""
    if "av" in sys.modules:
        return False
    try:
        importlib.import_module("av")
        return False
    except ImportError:  # not installed, or its libraries are missing
        pass
    module = types.ModuleType("av", "placeholder for PyAV (bench.e2e): not installed on this machine")

    class FFmpegError(Exception):
        """Never raised: stands in for PyAV's error base class."""

    def missing(name: str) -> Any:
        raise AttributeError(f"PyAV is not installed (bench.e2e placeholder): av.{name} is unavailable")

    module.__dict__.update(FFmpegError=FFmpegError, __getattr__=missing)
    sys.modules["av"] = module
    return True


# ---- engine and events ----------------------------------------------------------------------------------
def build_engines(kind: str, layers: int | None, max_tokens: int) -> tuple[Any, Any]:
    """(engine for the pipeline, engine whose tokenizer sizes the events); blocking. `full`: the full-size
    model on CUDA (`layers` decoder layers, None = 48); `tiny`: the tiny release on CPU (both the same);
    `stub`: `StubEngine`, events sized with the tiny release."""
    from bench.load import build

    if kind == "tiny":
        engine = build(True, max_tokens)
        return engine, engine
    if kind == "stub":
        from devtools.stub import StubEngine

        return StubEngine(), build(True, max_tokens)
    from bench.workload import build_engine
    from engine.model.decoder import default_buckets
    from engine.runner import EngineConfig

    config = EngineConfig(device="cuda", dtype="bfloat16", max_batch_tokens=max_tokens, max_batch_records=256)
    engine = build_engine(config, num_layers=layers)
    engine.model.enable_fast_path(graph_buckets=default_buckets(max_tokens))
    return engine, engine


def event_values(requests: Sequence[Any]) -> list[bytes]:
    """The JSON record values of `requests` (SystemOne bodies: state and questions)."""
    return [r.model_dump_json().encode("utf-8") for r in requests]


# ---- Kafka side -----------------------------------------------------------------------------------------
@dataclass(slots=True)
class Sent:
    """One produced event: its load, scheduled send time (perf_counter) and record timestamp (ms)."""

    load: int
    due: float
    timestamp_ms: int


@dataclass(slots=True)
class Ledger:
    """What was sent and what came back, keyed by the `ce_id` header (event loop only)."""

    sent: dict[str, Sent] = field(default_factory=dict)
    decided: dict[str, tuple[float, int]] = field(default_factory=dict)  # id -> (perf_counter, record ts)
    dead: dict[str, float] = field(default_factory=dict)
    duplicates: int = 0
    unknown: int = 0
    send_errors: int = 0


class Tail:
    """Reads the decisions and DLQ topics from the beginning (fresh topics) into a `Ledger`."""

    def __init__(self, bootstrap: str, decisions: str, dlq: str, partitions: int, ledger: Ledger) -> None:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        self._decisions = decisions
        self._tps = [TopicPartition(t, p) for t in (decisions, dlq) for p in range(partitions)]
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
        )
        self._ledger = ledger
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._consumer.start()
        self._consumer.assign(self._tps)
        await self._consumer.seek_to_beginning(*self._tps)
        self._task = asyncio.create_task(self._loop(), name="e2e-tail")

    async def _loop(self) -> None:
        ledger = self._ledger
        while True:
            batch = await self._consumer.getmany(timeout_ms=100, max_records=2000)
            now = time.perf_counter()
            for tp, records in batch.items():
                for rec in records:
                    eid = next((v.decode() for k, v in rec.headers or () if k == CE_ID and v), None)
                    if eid is None or eid not in ledger.sent:
                        ledger.unknown += 1
                    elif tp.topic != self._decisions:
                        ledger.dead.setdefault(eid, now)
                    elif eid in ledger.decided:
                        ledger.duplicates += 1
                    else:
                        ledger.decided[eid] = (now, int(rec.timestamp))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._consumer.stop()


class LagSampler:
    """Once a second: high watermarks of the input partitions against the group's committed offsets."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        topic: str,
        partitions: int,
        pipeline: Pipeline[Any, Any, Any],
        ledger: Ledger,
    ) -> None:
        from aiokafka import AIOKafkaConsumer, TopicPartition
        from aiokafka.admin import AIOKafkaAdminClient

        self._tps = [TopicPartition(topic, p) for p in range(partitions)]
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
        ends = await asyncio.wait_for(self._offsets.end_offsets(self._tps), KAFKA_CALL_TIMEOUT_S)
        committed = await asyncio.wait_for(
            self._admin.list_consumer_group_offsets(self._group, partitions=self._tps), KAFKA_CALL_TIMEOUT_S
        )
        done = sum(max(0, m.offset) for tp, m in committed.items() if tp in ends)
        return sum(ends.values()), done

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


class Producer:
    """Sends pool events at a fixed rate (open loop), each with a unique `ce_id` header."""

    def __init__(
        self, bootstrap: str, topic: str, values: Sequence[bytes], ledger: Ledger, seed: int
    ) -> None:
        from aiokafka import AIOKafkaProducer

        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5
        )
        self._topic = topic
        self._values = values
        self._ledger = ledger
        self._rng = random.Random(seed)

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def run(self, load: int, rate: float, seconds: float, poisson: bool, stop: asyncio.Event) -> float:
        """Send for `seconds` at `rate` events/s (`poisson`: exponential gaps, else even ones); returns the
        perf_counter time the window began. Stops early when `stop` is set. Waits for every acknowledgement
        (send errors are counted in the ledger)."""
        rng, ledger = self._rng, self._ledger
        t0 = time.perf_counter()
        wall0 = time.time()
        acks = []
        i = 0
        due = t0
        while not stop.is_set():
            due = due + rng.expovariate(rate) if poisson else t0 + i / rate
            if due - t0 >= seconds:
                break
            delay = due - time.perf_counter()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    break
            eid = f"L{load}-{i}"
            ts = int((wall0 + (due - t0)) * 1000)
            ledger.sent[eid] = Sent(load, due, ts)
            value = self._values[rng.randrange(len(self._values))]
            key = f"k{rng.randrange(1000)}".encode()
            acks.append(
                await self._producer.send(
                    self._topic, value, key=key, headers=[(CE_ID, eid.encode())], timestamp_ms=ts
                )
            )
            i += 1
        results = await asyncio.gather(*acks, return_exceptions=True)
        ledger.send_errors += sum(1 for r in results if isinstance(r, BaseException))
        return t0


def quantiles_ms(values: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99 (nearest rank) and max of `values` seconds, in ms; zeros for no values."""
    from bench.load_run import quantiles

    return quantiles(values)


def load_figures(
    ledger: Ledger, load: int, t0: float, seconds: float, lags: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """The figures of load `load` whose window began at `t0` (see the module docstring)."""
    ids = [eid for eid, s in ledger.sent.items() if s.load == load]
    end = t0 + seconds
    decided = [(eid, ledger.decided[eid]) for eid in ids if eid in ledger.decided]
    latencies = [at - ledger.sent[eid].due for eid, (at, _) in decided]
    ts_latencies = [max(0, ts - ledger.sent[eid].timestamp_ms) / 1000.0 for eid, (_, ts) in decided]
    in_window = sum(1 for _, (at, _) in decided if at <= end)
    window_lags = [s for s in lags if s["load"] == load]
    lag_values = [s["lag"] for s in window_lags]
    q = quantiles_ms(latencies)
    ts_q = quantiles_ms(ts_latencies)
    return {
        "events": len(ids),
        "events_in_s": round(len(ids) / seconds, 2),
        "events_out_s": round(in_window / seconds, 2),
        "decided": len(decided),
        "dead_lettered": sum(1 for eid in ids if eid in ledger.dead),
        "undecided": sum(1 for eid in ids if eid not in ledger.decided and eid not in ledger.dead),
        **q,
        "ts_p50_ms": ts_q["p50_ms"],
        "ts_p99_ms": ts_q["p99_ms"],
        "lag_max": max(lag_values, default=0),
        "lag_mean": round(statistics.mean(lag_values), 1) if lag_values else 0.0,
        "lag_at_end": lag_values[-1] if lag_values else 0,
        "lag_series": lag_values,
    }


def _metric(pipeline: Pipeline[Any, Any, Any], name: str) -> float:
    return pipeline.metrics.registry.get_sample_value(name) or 0.0


def service_counters(pipeline: Pipeline[Any, Any, Any]) -> dict[str, float]:
    """Cumulative service figures read from its metrics (differences of two reads give a window's)."""
    m = pipeline.metrics
    return {
        "gpu_busy_s": _metric(pipeline, "clef_router_gpu_busy_seconds_total"),
        "batches": float(m.batch_records.count),
        "batch_records_sum": m.batch_records.sum,
        "batch_tokens_sum": m.batch_tokens.sum,
        "e2e_count": float(m.end_to_end.count),
        "e2e_sum": m.end_to_end.sum,
        "commits": _metric(pipeline, "clef_router_commits_total"),
    }


def service_window(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """A window's service figures from two `service_counters` reads `seconds` apart."""
    d = {k: after[k] - before[k] for k in after}
    batches = d["batches"]
    return {
        "gpu_busy": round(d["gpu_busy_s"] / max(1e-9, seconds), 3),
        "batches": int(batches),
        "records_per_batch_mean": round(d["batch_records_sum"] / batches, 2) if batches else 0.0,
        "tokens_per_batch_mean": round(d["batch_tokens_sum"] / batches) if batches else 0,
        "service_e2e_mean_ms": round(d["e2e_sum"] / d["e2e_count"] * 1000, 2) if d["e2e_count"] else 0.0,
        "commits": int(d["commits"]),
    }


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


async def drain(ledger: Ledger, load: int, limit: float, stop: asyncio.Event) -> float:
    """Wait until every event of `load` is decided or dead-lettered (at most `limit` s); returns seconds."""
    began = time.perf_counter()
    ids = [eid for eid, s in ledger.sent.items() if s.load == load]
    while time.perf_counter() - began < limit and not stop.is_set():
        if all(eid in ledger.decided or eid in ledger.dead for eid in ids):
            break
        await asyncio.sleep(0.05)
    return round(time.perf_counter() - began, 2)


async def kafka_run(
    broker: LocalKafka, engine: Any, values: Sequence[bytes], plan: Plan, t0: float, emit: Emit
) -> list[dict[str, Any]]:
    """Steps 4-7 of the module docstring; returns the `load` lines. Stops early on SIGINT/SIGTERM."""
    from consumer.kafka.access import service_topics
    from consumer.pipeline.pipeline import Pipeline
    from consumer.settings import load_settings

    bootstrap = broker.bootstrap_servers
    group = f"e2e-{uuid.uuid4().hex[:8]}"
    settings = load_settings(
        kafka={"bootstrap_servers": bootstrap, "group_id": group},
        batching=plan.batching,
        http={"enabled": False},
        log_level="warning",
    )
    topics = settings.topics
    names = service_topics(topics, settings.routing.department_map.values())
    await asyncio.to_thread(broker.create_topics, names, partitions=plan.partitions)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    ledger = Ledger()
    pipeline = Pipeline(settings, engine)
    service = asyncio.create_task(pipeline.run(), name="e2e-pipeline")
    tail = Tail(bootstrap, topics.decisions, topics.dlq, plan.partitions, ledger)
    producer = Producer(bootstrap, topics.input[0], values, ledger, seed=2)
    sampler = LagSampler(bootstrap, group, topics.input[0], plan.partitions, pipeline, ledger)
    results: list[dict[str, Any]] = []
    try:
        await _until(lambda: pipeline.ready() or service.done(), 60.0, "pipeline ready")
        if service.done():
            await service  # raises what stopped it
        await tail.start()
        await producer.start()
        await sampler.start(t0, emit)
        emit(kind="note", t=round(time.perf_counter() - t0, 2), message="pipeline ready", group=group)
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
        for closing in (sampler.stop, producer.stop, tail.stop):
            try:
                await asyncio.wait_for(closing(), KAFKA_CALL_TIMEOUT_S * 2)
            except Exception as exc:  # a client that never started, or a broker gone: note it, go on
                emit(kind="note", message=f"closing a client: {exc!r}"[:300])
        pipeline.request_stop()
        try:
            await asyncio.wait_for(service, settings.kafka.shutdown_timeout_s + 5)
        except Exception as exc:
            emit(kind="note", message=f"pipeline stopped with {exc!r}"[:300])
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return results


async def _until(condition: Callable[[], bool], limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {limit_s:.0f} s")
        await asyncio.sleep(0.05)


# ---- report ---------------------------------------------------------------------------------------------
def summary_text(
    info: dict[str, Any], capacity: dict[str, Any] | None, loads: Sequence[dict[str, Any]]
) -> str:
    """The text summary: what ran, the engine-only figure and one row per load."""
    batching = info["batching"]
    lines = [
        f"bench.e2e {info['date']}: engine {info['engine']} on {info['device']}, broker Apache Kafka "
        f"{info['broker_version']}, {info['partitions']} input partitions, batching {batching['mode']} "
        f"(max {batching['max_batch_tokens']} tokens), events {info['tokens_min']}-{info['tokens_max']} "
        f"tokens (p50 {info['tokens_p50']}), {info['arrivals']} arrivals",
    ]
    if capacity is not None:
        lines.append(
            f"engine only (same process, the service's batcher, no Kafka): {capacity['events_s']} events/s "
            f"({capacity['tok_s']} tok/s) over a backlog of {capacity['events']}"
        )
    lines += [
        "",
        "| rate/s | events/s in | events/s out | p50 ms | p95 ms | p99 ms | ts p50 / p99 ms | lag max | "
        "lag at end | records/batch | GPU busy | undecided | DLQ | out / engine-only |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in loads:
        ratio = (
            f"{r['events_out_s'] / capacity['events_s']:.2f}" if capacity and capacity["events_s"] else "-"
        )
        lines.append(
            f"| {r['rate']:g} | {r['events_in_s']} | {r['events_out_s']} | {r['p50_ms']} | {r['p95_ms']} | "
            f"{r['p99_ms']} | {r['ts_p50_ms']} / {r['ts_p99_ms']} | {r['lag_max']} | {r['lag_at_end']} | "
            f"{r['records_per_batch_mean']} | {r['gpu_busy']} | {r['undecided']} | {r['dead_lettered']} | "
            f"{ratio} |"
        )
    return "\n".join(lines) + "\n"


def broker_log_errors(broker: LocalKafka) -> list[str]:
    """Lines of the broker's log naming a missing class or native library (the carried set lacks it)."""
    try:
        text = broker.log_file.read_text(encoding="utf-8", errors="replace")
    except Exception:
        return []
    return [ln[:300] for ln in text.splitlines() if any(m in ln for m in MISSING_CLASS_MARKERS)][:20]


# ---- main -----------------------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `bench.e2e`."""
    p.add_argument("--out", default=None, help="output folder (default: $OUT or bench-out/)")
    p.add_argument("--engine", choices=("auto", "full", "tiny", "stub"), default="auto",
                   help="auto: full with CUDA, else tiny")  # fmt: skip
    p.add_argument("--layers", type=int, default=None, help="full: decoder layers (default 48)")
    p.add_argument("--rate", default="25,50,75,90", help="events/s, one load per value, comma-separated")
    p.add_argument("--seconds", type=float, default=60.0, help="send window per load")
    p.add_argument("--warmup-s", type=float, default=10.0, help="send window before the loads (first rate)")
    p.add_argument("--drain-s", type=float, default=60.0, help="bound on the drain after each load")
    p.add_argument("--arrivals", choices=("uniform", "poisson"), default="uniform")
    p.add_argument("--partitions", type=int, default=3, help="partitions of every topic")
    p.add_argument(
        "--mode", choices=("fixed", "adaptive"), default=None, help="batching mode (default: the service's)"
    )
    p.add_argument(
        "--max-batch-tokens", type=int, default=None, help="batch token budget (default: the service's)"
    )
    p.add_argument("--pool", type=int, default=256, help="distinct events")
    p.add_argument(
        "--capacity-events", type=int, default=1024, help="backlog of the engine-only figure (0: skip)"
    )
    p.add_argument("--deadline-s", type=float, default=400.0, help="no load starts after this many s of run")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: the command line) and run; returns 0 (2 when the run stopped on an error
    before any load finished)."""
    p = argparse.ArgumentParser(prog="bench.e2e", description=__doc__.splitlines()[0] if __doc__ else None)
    add_arguments(p)
    return run(p.parse_args(argv))


def _sigterm_interrupts() -> None:
    """SIGTERM outside the Kafka part raises KeyboardInterrupt, so `finally` stops the broker (its JVM runs
    in its own session and would outlive a plain termination)."""

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def run(args: argparse.Namespace) -> int:
    """The whole run (see the module docstring) with parsed options."""
    t_start = time.perf_counter()
    _sigterm_interrupts()
    av_placeholder = install_av_placeholder()
    import torch

    from bench.load import MIX, _version, make_pool
    from bench.load_run import capacity
    from consumer.settings import BatchingSettings
    from devtools.kafka_local import LocalKafka

    out = Path(args.out or os.environ.get("OUT") or "bench-out")
    out.mkdir(parents=True, exist_ok=True)
    sink = (out / "e2e.jsonl").open("w")

    def emit(**fields: Any) -> None:
        line = json.dumps(fields)
        print(line, flush=True)
        sink.write(line + "\n")
        sink.flush()

    kind = args.engine if args.engine != "auto" else ("full" if torch.cuda.is_available() else "tiny")
    overrides = {
        k: v for k, v in (("mode", args.mode), ("max_batch_tokens", args.max_batch_tokens)) if v is not None
    }
    batching = BatchingSettings.model_validate(overrides).model_dump()
    rates = tuple(float(x) for x in args.rate.split(","))
    if not rates or any(r <= 0 or not math.isfinite(r) for r in rates):
        raise SystemExit("bench.e2e: --rate needs positive numbers")
    broker = LocalKafka()
    code = 2
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="e2e-broker") as pool:
            started = pool.submit(broker.start)  # the JVM starts while the model is built
            t0 = time.perf_counter()
            engine, sizing = build_engines(kind, args.layers, batching["max_batch_tokens"])
            build_s = time.perf_counter() - t0
            requests = make_pool(sizing, random.Random(0), args.pool)
            lengths = sorted(sizing.prepare(r).num_tokens for r in requests)
            started.result(timeout=180)
        values = event_values(requests)
        info = {
            "kind": "info",
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "engine": kind if args.layers is None or kind != "full" else f"full ({args.layers} layers)",
            "device": torch.cuda.get_device_name() if kind == "full" else "cpu",
            "torch": torch.__version__,
            "transformers": _version("transformers"),
            "aiokafka": _version("aiokafka"),
            "python": sys.version.split()[0],
            "java": os.path.realpath(shutil.which("java") or "java"),
            "broker_version": broker.broker_version,
            "broker_ready_s": round(broker.ready_seconds or 0.0, 2),
            "build_s": round(build_s, 1),
            "av_placeholder": av_placeholder,
            "mix": [list(m) for m in MIX],
            "tokens_min": lengths[0],
            "tokens_p50": lengths[len(lengths) // 2],
            "tokens_mean": round(statistics.mean(lengths), 1),
            "tokens_max": lengths[-1],
            "value_bytes_mean": round(statistics.mean(len(v) for v in values)),
            "rates": list(rates),
            "seconds_per_load": args.seconds,
            "warmup_s": args.warmup_s,
            "arrivals": args.arrivals,
            "partitions": args.partitions,
            "batching": batching,
        }
        emit(**info)
        cap: dict[str, Any] | None = None
        if kind != "stub" and args.capacity_events > 0:
            asyncio.run(capacity(engine, requests[:64], batching))  # warm-up: first launches, graph captures
            backlog = [requests[i % len(requests)] for i in range(args.capacity_events)]
            cap = asyncio.run(capacity(engine, backlog, batching))
            emit(kind="capacity", mode=batching["mode"], max_batch_tokens=batching["max_batch_tokens"], **cap)
        plan = Plan(
            rates=rates,
            seconds=args.seconds,
            warmup_s=args.warmup_s,
            drain_s=args.drain_s,
            poisson=args.arrivals == "poisson",
            partitions=args.partitions,
            batching=batching,
            deadline=t_start + args.deadline_s,
        )
        loads = asyncio.run(kafka_run(broker, engine, values, plan, t_start, emit))
        _sigterm_interrupts()  # the event loop's handlers are gone with it
        errors = broker_log_errors(broker)
        text = summary_text(info, cap, loads)
        (out / "e2e.txt").write_text(text, encoding="utf-8")
        print(text, flush=True)
        emit(kind="done", total_s=round(time.perf_counter() - t_start, 1), loads=len(loads),
             broker_missing_class_lines=errors)  # fmt: skip
        code = 0 if loads else 2
    finally:
        with contextlib.suppress(Exception):
            (out / "broker.log").write_bytes(broker.log_file.read_bytes()[-4_000_000:])
        broker.stop()
        sink.close()
    return code


if __name__ == "__main__":
    from consumer.logging import configure_logging

    configure_logging("warning")  # the batcher logs a line per batch at info
    raise SystemExit(main())
