"""`KafkaSettings` bounds: the revoke path fits inside the rebalance timeout and the JoinGroup timeout, and a
stop during a revoke fits inside `kafka.shutdown_timeout_s`; a refused bound names the settings involved."""

from __future__ import annotations

import os

import pytest

from consumer.kafka.settings import KafkaSettings
from consumer.settings import SettingsError, load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("CLEF_"):
            monkeypatch.delenv(name)


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
