"""`bench.queue_model`: the greedy-batcher model's arithmetic on cases whose answer is known."""

from __future__ import annotations

import json

import pytest

from bench.queue_model import Cost, main, mix_mean, simulate


def test_mix_mean_is_the_weighted_middle() -> None:
    assert mix_mean() == pytest.approx(0.4 * 350 + 0.4 * 750 + 0.2 * 1250)


def test_a_lone_event_takes_its_own_batch_time() -> None:
    # one arrival per 10 s and batches of a few ms: nobody waits, each latency is its batch's duration
    cost = Cost(fixed_s=0.010, per_record_s=0.0, mean_tokens=690.0)
    figures = simulate(cost, rate=0.1, events=200)
    assert figures["p50_ms"] == figures["p99_ms"] == figures["max_ms"] == 10.0
    assert figures["records_per_batch"] == 1.0


def test_latency_grows_with_load_and_batches_with_it() -> None:
    cost = Cost(fixed_s=0.010, per_record_s=0.007, mean_tokens=mix_mean())
    low, high = (simulate(cost, share / cost.per_record_s, 20_000) for share in (0.25, 0.7))
    assert low["p50_ms"] < high["p50_ms"]
    assert low["p99_ms"] < high["p99_ms"]
    assert low["records_per_batch"] < high["records_per_batch"]
    assert 0 < low["gpu_busy"] < high["gpu_busy"] <= 1.0


def test_a_token_cap_never_lets_a_batch_grow_past_it() -> None:
    cost = Cost(fixed_s=0.010, per_record_s=0.007, mean_tokens=mix_mean())
    capped = simulate(cost, 0.9 / cost.per_record_s, 20_000, max_tokens=1500)
    free = simulate(cost, 0.9 / cost.per_record_s, 20_000)
    assert capped["records_per_batch"] < free["records_per_batch"]


def test_main_prints_the_costs_it_derived(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--shares", "0.5", "--events", "2000", "--capacity", "100", "--one-request-ms", "20"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["kind"] == "cost"
    assert lines[0]["per_record_ms"] == 10.0
    assert lines[0]["fixed_ms"] == pytest.approx(20 - 10 * 800 / 690, abs=0.01)
    assert [line["kind"] for line in lines[1:]] == ["share"]
    assert lines[1]["rate"] == 50.0
