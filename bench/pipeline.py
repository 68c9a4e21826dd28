"""`python -m bench pipeline`: events/s through the whole service against plain aiokafka loops.

Every run uses the same local broker and the same number of pre-produced events; each run reads a fresh
input topic with a fresh group, and time runs from the first fetched batch until every input offset is
committed. Three runs per repeat:

- service: `Pipeline` with `StubEngine` (answers instantly).
- plain (the baseline of the ratio): consume -> produce (acks=all, idempotent, one `send` per record) ->
  await acks -> commit, producing for each event exactly the records the service publishes for it (the
  same decision value, headers, key and topics: `decisions` and the event's `route.*` topic), computed
  before the run by the service's own decode, stub engine and router and looked up by input value. So both
  runs move the same bytes to the same partitions; the ratio is what the service adds on top of that
  Kafka traffic (decoding, validation, batching, engine hand-off, routing, serialising, bookkeeping).
- echo: the same loop forwarding each ~300-byte input twice to two 3-partition topics (smaller records
  to fewer partitions than the service's output, so cheaper for client and broker alike); reported for
  comparison with earlier reports.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from devtools.stub import StubEngine, sample_event

if TYPE_CHECKING:
    from consumer.settings import Settings


async def _produce_inputs(bootstrap: str, topic: str, count: int) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=20,
        max_batch_size=512 * 1024,
    )
    await producer.start()
    try:
        futs = [await producer.send(topic, sample_event(i), key=f"k{i % 50}".encode()) for i in range(count)]
        await asyncio.gather(*futs)
    finally:
        await producer.stop()


OutputsFor = Callable[[Any], Sequence[tuple[str, bytes | None, Sequence[tuple[str, bytes | None]]]]]


async def plain_loop(bootstrap: str, topic: str, outputs_for: OutputsFor, count: int) -> float:
    """Consume -> produce `outputs_for(record)` ((topic, value, headers) each, keyed by the input key) ->
    await acks -> commit.

    Returns seconds from the first fetch to the last commit."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    group = f"bench-plain-{uuid.uuid4().hex[:8]}"
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=500,
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        max_batch_size=256 * 1024,
    )
    await producer.start()
    await consumer.start()
    start: float | None = None
    done = 0
    try:
        while done < count:
            batch = await consumer.getmany(timeout_ms=100, max_records=500)
            if batch and start is None:
                start = time.perf_counter()
            futs = []
            for records in batch.values():
                for rec in records:
                    for out, value, headers in outputs_for(rec):
                        futs.append(await producer.send(out, value, key=rec.key, headers=list(headers)))
                    done += 1
            if futs:
                await asyncio.gather(*futs)
                await consumer.commit()
        assert start is not None
        return time.perf_counter() - start
    finally:
        await consumer.stop()
        await producer.stop()


def echo_outputs(outputs: tuple[str, str]) -> OutputsFor:
    """The echo loop's outputs: the input value and headers, once to each of `outputs`."""

    def outputs_for(rec: Any) -> list[tuple[str, bytes | None, Sequence[tuple[str, bytes | None]]]]:
        return [(out, rec.value, rec.headers) for out in outputs]

    return outputs_for


def service_outputs(settings: Settings, engine: StubEngine, count: int) -> OutputsFor:
    """The records the service publishes for `sample_event(0..count-1)`, computed with its own decode, stub
    engine and router (before any timing), looked up by input value.

    The decision's `source` names a placeholder topic, partition 0 and offset `i` (the live service writes
    the real ones; lengths differ by a few bytes at most).
    """
    from consumer.pipeline.decode import decode_value
    from consumer.pipeline.outputs import default_engine_info
    from consumer.pipeline.router import Router
    from consumer.records import InputRecord
    from schemas.parse import RequestLimits
    from schemas.routing import datetime_json, engine_json

    limits = RequestLimits(max_value_bytes=settings.engine.max_message_bytes)
    info = default_engine_info(settings.engine.model_name)
    router = Router(settings.routing, settings.topics, engine_json(info))
    decided_at = datetime_json(datetime.now(UTC))
    table: dict[bytes, list[tuple[str, bytes | None, Sequence[tuple[str, bytes | None]]]]] = {}
    for i in range(count):
        value = sample_event(i)
        decoded = decode_value(value, settings.routing.default_schema, limits)
        (response,) = engine.execute([engine.prepare(decoded.request)])
        record = InputRecord("bench.plain.input", 0, i, None, value, ())
        outs = router.outputs(record, response, decoded.event_id, decided_at)
        table[value] = [(out.topic, out.value, out.headers) for out in outs]

    def outputs_for(rec: Any) -> list[tuple[str, bytes | None, Sequence[tuple[str, bytes | None]]]]:
        return table[rec.value]

    return outputs_for


async def service_run(bootstrap: str, topic: str, count: int, settings_overrides: dict[str, Any]) -> float:
    """Run `Pipeline` with `StubEngine` until all `count` input offsets are committed; returns seconds."""
    from consumer.pipeline.pipeline import Pipeline
    from consumer.settings import load_settings

    group = f"bench-svc-{uuid.uuid4().hex[:8]}"
    kafka = {"bootstrap_servers": bootstrap, "group_id": group, **settings_overrides.get("kafka", {})}
    settings = load_settings(
        kafka=kafka,
        topics={"input": [topic], **settings_overrides.get("topics", {})},
        batching=settings_overrides.get("batching", {}),
        http={"enabled": False},
    )
    pipeline = Pipeline(settings, StubEngine(settings.batching.limits))
    task = asyncio.create_task(pipeline.run())
    while sum(pipeline.committed().values()) < count:
        if task.done():
            await task
            raise RuntimeError("pipeline stopped early")
        await asyncio.sleep(0.005)
    end = time.perf_counter()
    pipeline.request_stop()
    await task
    assert pipeline.first_fetch_at is not None
    return end - pipeline.first_fetch_at


def _versions(broker_version: str | None) -> dict[str, Any]:
    import os
    import platform

    import aiokafka
    import pydantic

    return {
        "python": platform.python_version(),
        "aiokafka": aiokafka.__version__,
        "pydantic": pydantic.__version__,
        "kafka_broker": broker_version or "external",
        "cpus": os.cpu_count(),
    }


KINDS = ("plain", "service", "echo")


@dataclass(frozen=True, slots=True)
class RunFigures:
    """One timed run: events/s, and CPU microseconds per event of this process and of the local broker."""

    eps: float
    cpu_us: float
    broker_cpu_us: float | None


def main(
    events: int,
    repeats: int,
    bootstrap: str | None = None,
    *,
    kinds: Sequence[str] = KINDS,
    service_settings: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run the benchmark (blocking); prints JSON lines and a table; returns the summary.

    Each repeat runs `kinds` (default all three, see the module docstring) in an order rotated by one per
    repeat, so drift across a repeat (broker JIT warm-up, a busy host) does not always favour the same
    kind. Per run it also reports this process's CPU time per event (user + system, all threads, client
    start and stop included) and, with the local broker, the broker's. Logging is left as configured
    (the CLI sets it to warnings). `service_settings` are setting
    overrides for the service run (sections as in `load_settings`), on top of `commit_interval_ms=50`.
    """
    import statistics

    from consumer.kafka.access import service_topics
    from consumer.settings import load_settings
    from devtools.kafka_local import LocalKafka

    unknown = set(kinds) - set(KINDS)
    if unknown or not kinds:
        raise ValueError(f"kinds must be some of {KINDS}, got {list(kinds)}")
    broker: LocalKafka | None = None
    if bootstrap is None:
        broker = LocalKafka()
        broker.start()
        bootstrap = broker.bootstrap_servers
    try:
        defaults = load_settings(kafka={"bootstrap_servers": bootstrap})
        run_id = uuid.uuid4().hex[:6]
        inputs = {(kind, i): f"bench.{run_id}.{kind}.{i}" for kind in kinds for i in range(repeats + 1)}
        echo_topics = (f"bench.{run_id}.out.a", f"bench.{run_id}.out.b")
        names = [
            *inputs.values(),
            *echo_topics,
            *service_topics(defaults.topics, defaults.routing.department_map.values()),
        ]
        _create_topics(bootstrap, names, broker)
        overrides = {"kafka": {"commit_interval_ms": 50}}
        for section, values in (service_settings or {}).items():
            overrides[section] = {**overrides.get(section, {}), **values}
        warm = max(100, events // 10)
        matched = service_outputs(defaults, StubEngine(), max(events, warm))
        echo = echo_outputs(echo_topics)

        async def one(kind: str, topic: str, n: int) -> RunFigures:
            broker_before = broker.cpu_seconds() if broker is not None else None
            cpu_before = time.process_time()
            if kind == "service":
                seconds = await service_run(bootstrap, topic, n, overrides)
            else:
                seconds = await plain_loop(bootstrap, topic, matched if kind == "plain" else echo, n)
            cpu = time.process_time() - cpu_before
            broker_after = broker.cpu_seconds() if broker is not None else None
            broker_cpu = (
                (broker_after - broker_before) / n * 1e6
                if broker_before is not None and broker_after is not None
                else None
            )
            return RunFigures(n / seconds, cpu / n * 1e6, broker_cpu)

        async def run_all() -> dict[str, list[RunFigures]]:
            for (_kind, i), topic in inputs.items():
                await _produce_inputs(bootstrap, topic, warm if i == 0 else events)
            runs: dict[str, list[RunFigures]] = {kind: [] for kind in kinds}
            for i in range(repeats + 1):
                n = warm if i == 0 else events
                shift = i % len(kinds)
                order = [*kinds[shift:], *kinds[:shift]]
                got = {kind: await one(kind, inputs[(kind, i)], n) for kind in order}
                if i == 0:
                    continue  # run 0 is the warm-up
                line: dict[str, Any] = {"repeat": i, "events": n, "order": order}
                for kind in kinds:
                    runs[kind].append(got[kind])
                    line[f"{kind}_eps"] = round(got[kind].eps, 1)
                    line[f"{kind}_cpu_us_per_event"] = round(got[kind].cpu_us, 1)
                    broker_us = got[kind].broker_cpu_us
                    line[f"{kind}_broker_cpu_us_per_event"] = (
                        None if broker_us is None else round(broker_us, 1)
                    )
                line |= _ratios({kind: got[kind].eps for kind in kinds})
                print(json.dumps(line))
            return runs

        runs = asyncio.run(run_all())
        # rounded before the ratios are taken, so the printed ratio is the ratio of the printed medians
        med = {kind: round(statistics.median(r.eps for r in runs[kind]), 1) for kind in kinds}
        summary: dict[str, Any] = {
            "bench": "pipeline",
            "events": events,
            "repeats": repeats,
            "outputs_per_event": 2,
            **{f"{kind}_eps_median": med[kind] for kind in kinds},
            **{
                f"{kind}_cpu_us_per_event_median": round(statistics.median(r.cpu_us for r in runs[kind]), 1)
                for kind in kinds
            },
            **_ratios(med),
            "target_ratio": 0.8,
            "service_settings": overrides,
            **_versions(broker.broker_version if broker else None),
        }
        print(json.dumps(summary))
        print()
        labels = {
            "plain": "plain aiokafka loop, producing the service's records",
            "service": "clef-router pipeline, stub engine",
            "echo": "plain aiokafka loop, echoing each input twice",
        }
        print(f"| run | events/s (median of {repeats}) |")
        print("|---|---|")
        for kind in kinds:
            print(f"| {labels[kind]} | {med[kind]:,.0f} |")
        if "ratio" in summary:
            print(f"| ratio service / plain (target >= 0.8) | {summary['ratio']:.2f} |")
        if "ratio_vs_echo" in summary:
            print(f"| ratio service / echo | {summary['ratio_vs_echo']:.2f} |")
        return summary
    finally:
        if broker is not None:
            broker.stop()


def _ratios(eps: dict[str, float]) -> dict[str, float]:
    """`ratio` (service / plain) and `ratio_vs_echo` (service / echo), for the kinds that ran."""
    out: dict[str, float] = {}
    if "service" in eps and "plain" in eps:
        out["ratio"] = round(eps["service"] / eps["plain"], 3)
    if "service" in eps and "echo" in eps:
        out["ratio_vs_echo"] = round(eps["service"] / eps["echo"], 3)
    return out


def _create_topics(bootstrap: str, names: list[str], broker: Any) -> None:
    if broker is not None:
        broker.create_topics(names, partitions=3)
        return
    from consumer.kafka.access import ensure_topics
    from consumer.settings import KafkaSettings

    asyncio.run(ensure_topics(KafkaSettings(bootstrap_servers=bootstrap, topic_partitions=3), names))
