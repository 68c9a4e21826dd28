"""Network and broker faults between the service and Kafka (issue 18): a 30 s partition, a broker kill -9
and restart, 200 ms added latency. Each scenario runs the service twice at once, at-least-once and
exactly-once (their own topics and groups), through a TCP proxy (`tests/support/tcp_proxy.py`); the
broker advertises the proxy's address on the listener the service uses. Pass: every input answered
(nothing lost) in both modes, nothing twice in exactly-once (read committed), and the service finishes by
itself after the fault, without a restart. Lost and duplicate counts are printed per scenario and mode.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from consumer.pipeline.pipeline import Pipeline
from consumer.settings import Settings, load_settings
from devtools.kafka_local import HOST, ExtraListener, LocalKafka, free_port
from devtools.stub import StubEngine
from tests.support.flow import produce_events, tally_decisions, wait_committed
from tests.support.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

EVENTS = 1500
PARTITION_S = 30.0
LATENCY_S = 0.2


class SlowStub(StubEngine):
    """The stub engine with a little time per batch, so work is in flight when the fault starts."""

    def execute(self, batch: Any) -> Any:
        time.sleep(0.02)
        return super().execute(batch)


@pytest.fixture(scope="module")
def proxied(pytestconfig: pytest.Config) -> Iterator[tuple[LocalKafka, TcpProxy]]:
    """A broker whose PROXIED listener is advertised at the proxy's port (harness: plain listener)."""
    proxy_port, inner_port = free_port(), free_port()
    broker = LocalKafka(
        extra_listeners=[ExtraListener("PROXIED", "PLAINTEXT", inner_port, advertised_port=proxy_port)]
    )
    broker.start()
    proxy = TcpProxy(inner_port, proxy_port)
    proxy.start()
    try:
        yield broker, proxy
    finally:
        proxy.stop()
        broker.stop()


def _settings(bootstrap: str, prefix: str, exactly_once: bool) -> Settings:
    return load_settings(
        kafka={
            "bootstrap_servers": bootstrap,
            "group_id": f"{prefix}.g",
            "exactly_once": exactly_once,
            "commit_interval_ms": 100,
            "max_in_flight": 256,
            "fetch_max_records": 64,
            "session_timeout_ms": 10_000,
        },
        topics={
            "input": [f"{prefix}.in"],
            "decisions": f"{prefix}.decisions",
            "route_prefix": f"{prefix}.route.",
            "review": f"{prefix}.route.review",
            "unrouted": f"{prefix}.route.unrouted",
            "dlq": f"{prefix}.dlq",
        },
        batching={"max_batch_records": 16, "max_wait_ms": 5},
        http={"enabled": False},
    )


async def _scenario(
    broker: LocalKafka, proxy: TcpProxy, name: str, fault: Callable[[], Awaitable[None]]
) -> None:
    """Both modes at once: start, let them commit a fifth, run `fault`, then wait for all and tally."""
    runs: list[tuple[Settings, Pipeline, asyncio.Task[None]]] = []
    for exactly_once in (False, True):
        prefix = f"{name}-{'eos' if exactly_once else 'alo'}-{uuid.uuid4().hex[:6]}"
        settings = _settings(f"{HOST}:{proxy.port}", prefix, exactly_once)
        topic = settings.topics.input[0]
        await asyncio.to_thread(broker.create_topics, [topic], partitions=3)
        await produce_events(broker.bootstrap_servers, topic, 0, EVENTS)
        pipeline = Pipeline(settings, SlowStub(settings.batching.limits))
        runs.append((settings, pipeline, asyncio.create_task(pipeline.run())))
    try:
        for settings, _, task in runs:
            group, topic = settings.kafka.group_id, settings.topics.input[0]
            started = await wait_committed(broker.bootstrap_servers, group, topic, EVENTS // 5, 120, task)
            assert started >= EVENTS // 5, f"{group}: no progress before the fault"
        began = time.monotonic()
        await fault()
        fault_s = time.monotonic() - began
        for settings, _, task in runs:
            group, topic = settings.kafka.group_id, settings.topics.input[0]
            done = await wait_committed(broker.bootstrap_servers, group, topic, EVENTS, 300, task)
            assert done == EVENTS, f"{group}: {done}/{EVENTS} committed after the fault"
        recovered_s = time.monotonic() - began - fault_s
    finally:
        for _, pipeline, _ in runs:
            pipeline.request_stop()
        await asyncio.wait_for(asyncio.gather(*(task for *_, task in runs), return_exceptions=True), 90)
    for settings, _, task in runs:
        assert task.exception() is None, f"the service failed: {task.exception()!r}"
        mode = "exactly-once" if settings.kafka.exactly_once else "at-least-once"
        tally = await tally_decisions(
            broker.bootstrap_servers,
            settings.topics.decisions,
            EVENTS,
            read_committed=settings.kafka.exactly_once,
        )
        print(
            f"\nfault {name} [{mode}]: {EVENTS} events, {tally.decisions} decisions, lost={tally.lost} "
            f"duplicates={tally.duplicates} (fault {fault_s:.1f} s, all committed {recovered_s:.1f} s later)"
        )
        assert tally.lost == 0
        if settings.kafka.exactly_once:
            assert tally.duplicates == 0


async def test_partition_30s(proxied: tuple[LocalKafka, TcpProxy]) -> None:
    broker, proxy = proxied
    held: list[int] = []

    async def partition() -> None:
        proxy.blackhole()
        try:
            await asyncio.sleep(PARTITION_S)  # the fault's length, not a wait for a result
            held.append(await _committed_everywhere(broker))
        finally:
            proxy.heal()

    await _scenario(broker, proxy, "partition", partition)
    assert held[0] < 2 * EVENTS  # the partition did hold the service back (it was not done by then)


async def test_broker_kill_9_and_restart(proxied: tuple[LocalKafka, TcpProxy]) -> None:
    broker, proxy = proxied

    async def kill_and_restart() -> None:
        await asyncio.to_thread(broker.restart, hard=True)

    await _scenario(broker, proxy, "kill9", kill_and_restart)


async def test_added_latency_200ms(proxied: tuple[LocalKafka, TcpProxy]) -> None:
    broker, proxy = proxied

    async def slow_network() -> None:
        proxy.delay(LATENCY_S)  # stays on until the scenario has finished

    before = proxy.connections
    try:
        await _scenario(broker, proxy, "latency", slow_network)
    finally:
        proxy.delay(0)
    assert proxy.connections > before  # the service's traffic went through the proxy


async def _committed_everywhere(broker: LocalKafka) -> int:
    """Offsets committed so far by every group of the running scenario (harness listener)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    await admin.start()
    try:
        total = 0
        for group, *_ in await admin.list_consumer_groups():
            if str(group).startswith("partition-"):
                offsets = await admin.list_consumer_group_offsets(group)
                total += sum(m.offset for m in offsets.values() if m.offset > 0)
        return total
    finally:
        await admin.close()
