"""`run`'s readiness follows the broker: `/readyz` turns 503 once the broker has been unreachable for longer
than `http.broker_unreachable_s`, the gauges show it, and it turns 200 again by itself after a restart."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from consumer.kafka.broker_watch import BrokerWatch
from consumer.metrics import Metrics
from consumer.settings import KafkaSettings
from devtools.kafka_local import LocalKafka, free_port


def gauge(metrics: Metrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(f"clef_router_{name}")


async def wait_for(condition: Callable[[], bool], timeout_s: float) -> None:
    """Return once `condition()` holds; raises TimeoutError after `timeout_s`."""
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > timeout_s:
            raise TimeoutError
        await asyncio.sleep(0.05)


async def test_unreachable_then_recovers(restartable_broker: LocalKafka) -> None:
    metrics = Metrics()
    settings = KafkaSettings(bootstrap_servers=restartable_broker.bootstrap_servers)
    watch = BrokerWatch(settings, metrics, unreachable_after_s=2.0)
    await watch.start()
    try:
        assert await watch.probe_once()
        assert watch.reachable()
        assert gauge(metrics, "broker_reachable") == 1
        # stop the JVM but keep its data and ports (what the first half of `restart()` does)
        await asyncio.to_thread(restartable_broker._terminate)
        await wait_for(lambda: not watch.reachable(), 30)  # (the bound itself: the fake-clock test below)
        assert gauge(metrics, "broker_reachable") == 0
        assert gauge(metrics, "broker_unreachable_seconds") > 0
        await asyncio.to_thread(restartable_broker.start)
        await wait_for(watch.reachable, 60)
        assert gauge(metrics, "broker_unreachable_seconds") == 0
    finally:
        await watch.stop()


async def test_never_reachable_is_not_ready_after_the_bound() -> None:
    clock = [100.0]
    watch = BrokerWatch(
        KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}"),
        Metrics(),
        unreachable_after_s=5.0,
        clock=lambda: clock[0],
    )
    assert not await watch.probe_once()
    assert watch.reachable()  # within the bound since start
    clock[0] += 5.5
    assert not watch.reachable()
    assert watch.unreachable_seconds() == 5.5
    await watch.stop()
