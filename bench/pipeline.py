"""`clef-router bench pipeline`: events/s through the whole service against a plain aiokafka loop.

Both runs use the same local broker, the same number of pre-produced events and the same outputs per event
(two records: decisions + route). The plain loop is consume -> produce (acks=all, idempotent) -> await acks ->
commit, with no decoding. The service run is `Pipeline` with `StubEngine` (answers instantly). Each run
reads a fresh input topic with a fresh group; time runs from start until every input offset is committed.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from schemas.request import SystemOneRequest, option_table
from schemas.response import SystemOneResponse, build_response


@dataclass(frozen=True, slots=True)
class StubPrepared:
    request: SystemOneRequest
    num_tokens: int


class StubEngine:
    """An `EngineLike` that answers instantly: deterministic, state-dependent probabilities.

    Responses are cached per (questions object, variant), so the cost per record is a dictionary lookup
    for events of the default schema (whose questions object is shared).
    """

    VARIANTS = 7

    def __init__(self) -> None:
        self._cache: dict[tuple[int, int], tuple[object, SystemOneResponse]] = {}

    def prepare(self, request: SystemOneRequest) -> StubPrepared:
        return StubPrepared(request, 200 + 20 * len(request.questions))

    def execute(self, batch: Sequence[StubPrepared]) -> list[SystemOneResponse]:
        return [self._answer(p) for p in batch]

    def _answer(self, p: StubPrepared) -> SystemOneResponse:
        variant = zlib.crc32(repr(p.request.state).encode()) % self.VARIANTS
        key = (id(p.request.questions), variant)
        hit = self._cache.get(key)
        if hit is not None and hit[0] is p.request.questions:
            return (
                hit[1].model_copy(update={"model": p.request.model})
                if hit[1].model != p.request.model
                else hit[1]
            )
        probs: dict[str, list[float]] = {}
        for i, (qid, question) in enumerate(p.request.questions.items()):
            n = len(option_table(question))
            top = (variant + i) % n
            rest = 0.2 / (n - 1)
            probs[qid] = [0.8 if k == top else rest for k in range(n)]
        response = build_response(p.request, probs, input_tokens=p.num_tokens)
        if len(self._cache) < 10_000:
            self._cache[key] = (p.request.questions, response)
        return response


def sample_event(i: int) -> bytes:
    """A realistic small alert event (about 300 bytes)."""
    kinds = [
        "disk full on /var",
        "BGP session down",
        "replication lag 45s",
        "TLS certificate expires in 2 days",
        "HTTP 5xx rate 12%",
        "UPS on battery",
        "suspicious login from new ASN",
    ]
    return json.dumps(
        {
            "event_id": f"ev-{i}",
            "source": "monitoring",
            "host": f"host-{i % 97}.dc{i % 3}",
            "summary": kinds[i % len(kinds)],
            "severity": ["info", "warning", "critical"][i % 3],
            "metrics": {"value": i % 1000, "threshold": 900},
            "ts": "2026-11-29T12:00:00Z",
        }
    ).encode()


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


async def plain_loop(bootstrap: str, topic: str, outputs: tuple[str, str], count: int) -> float:
    """Consume -> produce 2 records per event -> await acks -> commit.

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
                    for out in outputs:
                        futs.append(await producer.send(out, rec.value, key=rec.key, headers=rec.headers))
                    done += 1
            if futs:
                await asyncio.gather(*futs)
                await consumer.commit()
        assert start is not None
        return time.perf_counter() - start
    finally:
        await consumer.stop()
        await producer.stop()


async def service_run(bootstrap: str, topic: str, count: int, settings_overrides: dict[str, Any]) -> float:
    """Run `Pipeline` with `StubEngine` until all `count` input offsets are committed; returns seconds."""
    from consumer.pipeline import Pipeline
    from consumer.settings import load_settings

    group = f"bench-svc-{uuid.uuid4().hex[:8]}"
    kafka = {"bootstrap_servers": bootstrap, "group_id": group, **settings_overrides.get("kafka", {})}
    settings = load_settings(
        kafka=kafka,
        topics={"input": [topic], **settings_overrides.get("topics", {})},
        batching=settings_overrides.get("batching", {}),
        http={"enabled": False},
    )
    pipeline = Pipeline(settings, StubEngine())
    task = asyncio.create_task(pipeline.run())
    while sum(pipeline.tracker.committed().values()) < count:
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


def main(events: int, repeats: int, bootstrap: str | None = None) -> dict[str, Any]:
    """Run the benchmark (blocking); prints JSON lines and a table; returns the summary."""
    import statistics

    from consumer.kafka_local import LocalKafka
    from consumer.logging import configure_logging
    from consumer.settings import load_settings
    from consumer.source import service_topics

    configure_logging("warning")
    broker: LocalKafka | None = None
    if bootstrap is None:
        broker = LocalKafka()
        broker.start()
        bootstrap = broker.bootstrap_servers
    try:
        defaults = load_settings(kafka={"bootstrap_servers": bootstrap})
        run_id = uuid.uuid4().hex[:6]
        inputs = {
            (kind, i): f"bench.{run_id}.{kind}.{i}" for kind in ("plain", "svc") for i in range(repeats + 1)
        }
        outputs = (f"bench.{run_id}.out.a", f"bench.{run_id}.out.b")
        names = [
            *inputs.values(),
            *outputs,
            *service_topics(defaults.topics, defaults.routing.department_map.values()),
        ]
        _create_topics(bootstrap, names, broker)
        overrides = {"kafka": {"commit_interval_ms": 50}}

        async def run_all() -> dict[str, list[float]]:
            warm = max(100, events // 10)
            for (_kind, i), topic in inputs.items():
                await _produce_inputs(bootstrap, topic, warm if i == 0 else events)
            rates: dict[str, list[float]] = {"plain": [], "service": []}
            for i in range(repeats + 1):
                n = warm if i == 0 else events
                plain = n / await plain_loop(bootstrap, inputs[("plain", i)], outputs, n)
                service = n / await service_run(bootstrap, inputs[("svc", i)], n, overrides)
                if i > 0:  # run 0 is the warm-up
                    rates["plain"].append(plain)
                    rates["service"].append(service)
                    print(
                        json.dumps(
                            {
                                "repeat": i,
                                "events": n,
                                "plain_eps": round(plain, 1),
                                "service_eps": round(service, 1),
                                "ratio": round(service / plain, 3),
                            }
                        )
                    )
            return rates

        rates = asyncio.run(run_all())
        plain_med = statistics.median(rates["plain"])
        service_med = statistics.median(rates["service"])
        summary = {
            "bench": "pipeline",
            "events": events,
            "repeats": repeats,
            "outputs_per_event": 2,
            "plain_eps_median": round(plain_med, 1),
            "service_eps_median": round(service_med, 1),
            "ratio": round(service_med / plain_med, 3),
            "target_ratio": 0.8,
            **_versions(broker.broker_version if broker else None),
        }
        print(json.dumps(summary))
        print()
        print("| run | events/s (median) |")
        print("|---|---|")
        print(f"| plain aiokafka consume -> produce x2 -> commit | {plain_med:,.0f} |")
        print(f"| clef-router pipeline, stub engine | {service_med:,.0f} |")
        print(f"| ratio (target >= 0.8) | {service_med / plain_med:.2f} |")
        return summary
    finally:
        if broker is not None:
            broker.stop()


def _create_topics(bootstrap: str, names: list[str], broker: Any) -> None:
    if broker is not None:
        broker.create_topics(names, partitions=3)
        return
    from consumer.settings import KafkaSettings
    from consumer.source import ensure_topics

    asyncio.run(ensure_topics(KafkaSettings(bootstrap_servers=bootstrap, topic_partitions=3), names))
