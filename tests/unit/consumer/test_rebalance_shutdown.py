"""Issue 19: rebalance and shutdown bounds (settings checks), a stop interrupting a fetch that waits for a
rebalance, and a batcher closed on unfinished work (cancelled, not failed, and no ERROR line)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from structlog.testing import capture_logs

from consumer.batching.batcher import Batcher
from consumer.kafka.source import Source
from consumer.settings import BatchingSettings, KafkaSettings, SettingsError, load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("CLEF_"):
            monkeypatch.delenv(name)


# ---- settings ---------------------------------------------------------------------------------------------
def test_defaults_fit_and_the_rebalance_timeout_follows_max_poll_interval() -> None:
    for exactly_once in (False, True):
        k = load_settings(kafka={"exactly_once": exactly_once}).kafka
        assert k.effective_rebalance_timeout_ms == k.max_poll_interval_ms == 300_000
        assert k.revoke_path_s + k.close_reserve_s <= k.shutdown_timeout_s
    assert KafkaSettings(rebalance_timeout_ms=40_000).effective_rebalance_timeout_ms == 40_000
    assert KafkaSettings(session_timeout_ms=6_000).heartbeat_interval_ms == 1_000
    assert KafkaSettings(session_timeout_ms=45_000).heartbeat_interval_ms == 4_500


def test_a_revoke_path_longer_than_the_rebalance_timeout_is_refused_naming_the_settings() -> None:
    # drain 10 + commit 5 + heartbeat 1 + 1 = 17 s > 15 s
    with pytest.raises(SettingsError) as info:
        load_settings(kafka={"session_timeout_ms": 6_000, "rebalance_timeout_ms": 15_000})
    message = str(info.value)
    for name in ("kafka.rebalance_timeout_ms", "kafka.revoke_timeout_s", "kafka.commit_timeout_s"):
        assert name in message
    assert "17 s" in message
    load_settings(kafka={"session_timeout_ms": 6_000, "rebalance_timeout_ms": 17_000})  # just fits


def test_exactly_once_counts_the_wait_for_the_last_transactions() -> None:
    kafka = {"session_timeout_ms": 6_000, "rebalance_timeout_ms": 17_000}
    load_settings(kafka=kafka)  # at-least-once: 10 + 5 + 1 + 1
    with pytest.raises(SettingsError, match=r"needs 22 s: 2 x kafka\.revoke_timeout_s"):
        load_settings(kafka={**kafka, "exactly_once": True})  # 2 x 10 + 1 + 1


def test_an_unset_rebalance_timeout_names_max_poll_interval() -> None:
    with pytest.raises(SettingsError, match=r"kafka\.max_poll_interval_ms"):
        load_settings(kafka={"max_poll_interval_ms": 10_000})


def test_a_shutdown_bound_shorter_than_a_revoke_plus_closing_is_refused() -> None:
    # a stop during a revoke: 10 + 5 (revoke path) + 3 (leave, close) + 5 (final commit) = 23 s
    with pytest.raises(SettingsError, match=r"kafka\.shutdown_timeout_s is 22 s.*needs 23 s"):
        load_settings(kafka={"shutdown_timeout_s": 22})
    load_settings(kafka={"shutdown_timeout_s": 23})


def test_a_revoke_path_longer_than_a_join_request_is_refused() -> None:
    with pytest.raises(SettingsError, match=r"needs 42 s .*time out after 40 s"):
        load_settings(kafka={"exactly_once": True, "revoke_timeout_s": 19, "shutdown_timeout_s": 45})
    load_settings(kafka={"exactly_once": True, "revoke_timeout_s": 18, "shutdown_timeout_s": 45})


def test_a_poll_interval_shorter_than_the_shutdown_drain_is_refused() -> None:
    kafka = {"rebalance_timeout_ms": 30_000, "shutdown_timeout_s": 25}
    with pytest.raises(SettingsError, match=r"kafka\.max_poll_interval_ms \(20 s\) is below"):
        load_settings(kafka={**kafka, "max_poll_interval_ms": 20_000})
    load_settings(kafka={**kafka, "max_poll_interval_ms": 25_000})


# ---- source: a stop ends a fetch blocked in a rebalance -------------------------------------------------
class _RebalancingConsumer:
    """Stands in for AIOKafkaConsumer during a rebalance: `getmany` waits whatever its timeout."""

    def __init__(self) -> None:
        self.cancelled = 0

    async def getmany(self, *, timeout_ms: int, max_records: int) -> dict[Any, list[Any]]:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return {}


def _source(consumer: object) -> Source:
    source = Source(KafkaSettings(), ["t"])
    source._consumer = consumer  # the real one is never started here
    return source


async def test_stop_fetching_ends_a_fetch_waiting_for_a_rebalance() -> None:
    fake = _RebalancingConsumer()
    source = _source(fake)
    fetch = asyncio.create_task(source.fetch(10, timeout_ms=100))
    await asyncio.sleep(0.3)  # past its timeout: still waiting, as aiokafka does mid-rebalance
    assert not fetch.done()
    source.stop_fetching()
    assert await asyncio.wait_for(fetch, 1.0) == {}
    assert fake.cancelled == 1
    assert await source.fetch(10) == {}  # later fetches return at once
    assert await source.commit({}, attempts=1)


async def test_cancelling_the_caller_of_fetch_still_cancels_it() -> None:
    source = _source(_RebalancingConsumer())
    fetch = asyncio.create_task(source.fetch(10))
    await asyncio.sleep(0.05)
    fetch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await fetch


# ---- batcher: closing on unfinished work ------------------------------------------------------------------
@dataclass(frozen=True)
class _Item:
    num_tokens: int = 10


class _StuckEngine:
    """The GPU thread is busy until `release` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()

    def execute(self, batch: Sequence[_Item]) -> list[str]:
        self.started.set()
        self.release.wait(5)
        return ["ok"] * len(batch)


async def test_close_cancels_unfinished_records_without_an_error_line() -> None:
    engine = _StuckEngine()
    batcher: Batcher[_Item, str] = Batcher(
        engine.execute, BatchingSettings(max_batch_records=1, max_wait_ms=0, max_pending_batches=1)
    )
    await batcher.start()
    running = batcher.submit(lambda item: item, [_Item()])
    queued = batcher.submit(lambda item: item, [_Item()])
    await asyncio.to_thread(engine.started.wait, 5)
    try:
        with capture_logs() as logs:
            await batcher.close(0.05)
            await asyncio.sleep(0.05)  # task done-callbacks run
    finally:
        engine.release.set()
    assert running.cancelled()  # was on the GPU: unfinished, not an engine failure (no DLQ record)
    assert queued.cancelled()
    assert [e for e in logs if e["log_level"] == "error"] == []
