"""`bench.e2e --mixed`'s pure parts: its sizes and batching settings (`bench.e2e_mixed`), the per-class, per-
topic, offset and histogram figures and the table (`bench.e2e_report`); the whole run on a real broker:
tests/integration/test_bench_e2e.py."""

from __future__ import annotations

from typing import Any

import pytest

from bench import e2e_mixed
from bench.e2e_mixed import mixed_batching, mixed_sizes
from bench.e2e_report import (
    class_figures,
    class_histograms,
    http_figures,
    mixed_text,
    offsets_at_end,
    registry_samples,
    topic_ledger,
    window_out,
)
from bench.e2e_traffic import HttpCall, Ledger, Sent
from bench.loop_lag import lag_figures

BACKLOG, BULK, CRITICAL = e2e_mixed.BACKLOG, e2e_mixed.BULK, e2e_mixed.CRITICAL


def _ledger() -> Ledger:
    """Backlog: 2 events sent at t=0, decided at 3 and 5. Bulk: 3 events at t=1, 1.5, 2; decided at 2.5 and
    6 (twice: a duplicate), one dead-lettered. Critical: 2 events at t=1.2 and 1.8, one decided at 1.5, one
    lost."""
    ledger = Ledger()
    sends = {"B1-0": (BACKLOG, 0.0), "B1-1": (BACKLOG, 0.0), "B2-0": (BULK, 1.0), "B2-1": (BULK, 1.5)}
    sends |= {"B2-2": (BULK, 2.0), "C3-0": (CRITICAL, 1.2), "C3-1": (CRITICAL, 1.8)}
    for eid, (load, due) in sends.items():
        ledger.sent[eid] = Sent(load, due, int(due * 1000))
    for eid, at in {"B1-0": 3.0, "B1-1": 5.0, "B2-0": 2.5, "B2-1": 6.0, "C3-0": 1.5}.items():
        ledger.decided[eid] = (at, int(at * 1000))
    ledger.duplicates = 1
    ledger.duplicated.append("B2-1")
    ledger.dead["B2-2"] = 2.2
    return ledger


def test_class_figures_latency_from_the_scheduled_send() -> None:
    bulk = class_figures(_ledger(), (BULK,))
    assert (bulk["sent"], bulk["answered"], bulk["dead_lettered"]) == (3, 2, 1)
    assert (bulk["p50_ms"], bulk["max_ms"]) == (pytest.approx(4500.0), pytest.approx(4500.0))  # 1500, 4500
    backlog = class_figures(_ledger(), (BACKLOG,))
    assert (backlog["answered"], backlog["p99_ms"]) == (2, pytest.approx(5000.0))
    critical = class_figures(_ledger(), (CRITICAL,))
    assert (critical["sent"], critical["answered"], critical["p50_ms"]) == (2, 1, pytest.approx(300.0))
    assert class_figures(_ledger(), (9,))["sent"] == 0


def test_topic_ledger_counts_duplicates_and_lost_per_topic() -> None:
    ledger = _ledger()
    assert topic_ledger(ledger, (BACKLOG, BULK)) == {
        "sent": 5,
        "decided": 4,
        "dead_lettered": 1,
        "duplicates": 1,
        "lost": 0,
    }
    assert topic_ledger(ledger, (CRITICAL,)) == {
        "sent": 2,
        "decided": 1,
        "dead_lettered": 0,
        "duplicates": 0,
        "lost": 1,
    }


def test_window_out_counts_decisions_inside_the_window() -> None:
    ledger = _ledger()
    assert window_out(ledger, (BACKLOG, BULK), 2.0, 6.0) == 1.0  # 2.5, 3, 5, 6 over 4 s
    assert window_out(ledger, (BACKLOG, BULK), 2.6, 4.6) == 0.5  # 3 only
    assert window_out(ledger, (CRITICAL,), 2.0, 6.0) == 0.0


def test_http_figures_split_answers_errors_and_unanswered() -> None:
    calls = [
        HttpCall(1.0, 1.02, 200),
        HttpCall(2.0, 2.5, 200),
        HttpCall(3.0, 3.01, 503),
        HttpCall(4.0, 4.5, None, "ReadTimeout"),
        HttpCall(5.0, 5.2, 503),
        HttpCall(6.0),  # still waiting at the end
    ]
    r = http_figures(calls)
    assert (r["sent"], r["answered"], r["errors"], r["unanswered"]) == (6, 2, 3, 1)
    assert r["error_kinds"] == {"503": 2, "ReadTimeout": 1}
    assert (r["p50_ms"], r["max_ms"]) == (pytest.approx(500.0), pytest.approx(500.0))  # 20 and 500 ms
    assert r["slowest"] == [{"n": 2, "at_s": 1.0, "ms": 500.0}, {"n": 1, "at_s": 0.0, "ms": 20.0}]
    empty = http_figures([])
    assert (empty["sent"], empty["p99_ms"], empty["error_kinds"], empty["slowest"]) == (0, 0.0, {}, [])


def test_offsets_at_end_needs_every_partition_and_at_least_one() -> None:
    done = [{"high": 5, "committed": 5}, {"high": 0, "committed": 0}]
    assert offsets_at_end(done)
    assert not offsets_at_end([*done, {"high": 7, "committed": 6}])
    assert not offsets_at_end([])


def test_mixed_sizes_from_the_engine_only_figure_or_the_bulk_rate() -> None:
    assert mixed_sizes(100.0, 12.0, None) == (1200, 120.0)  # bulk 1.2 x engine-only
    assert mixed_sizes(100.0, 12.0, 90.0) == (1200, 90.0)  # the backlog stays 12 s of engine-only work
    assert mixed_sizes(None, 2.0, 20.0) == (40, 20.0)  # no engine-only figure: 2 s at the bulk rate
    assert mixed_sizes(50.0, 0.0, None) == (0, 60.0)
    with pytest.raises(ValueError, match="needs --bulk-rate"):
        mixed_sizes(None, 12.0, None)
    with pytest.raises(ValueError, match="positive"):
        mixed_sizes(100.0, 12.0, 0.0)


def test_mixed_batching_puts_the_critical_topic_in_class_1(monkeypatch: pytest.MonkeyPatch) -> None:
    from consumer.settings import BatchingSettings

    base = BatchingSettings().model_dump()
    monkeypatch.setattr(e2e_mixed, "has_priority_classes", lambda: False)
    assert mixed_batching(base) == base
    monkeypatch.undo()
    if not e2e_mixed.has_priority_classes():
        pytest.skip("these settings have no priority classes")
    out = mixed_batching(base)
    assert BatchingSettings.model_validate(out).priority.topics == {"alerts.critical": 1}
    assert {k: v for k, v in out.items() if k != "priority"} == {
        k: v for k, v in base.items() if k != "priority"
    }


def test_class_histograms_from_a_registry() -> None:
    from prometheus_client import CollectorRegistry, Histogram

    registry = CollectorRegistry()
    buckets = (0.01, 0.1, 1.0)
    wait = Histogram(
        "clef_router_class_queue_wait_seconds", "w", ["priority"], registry=registry, buckets=buckets
    )
    other = Histogram("clef_router_batch_seconds", "x", registry=registry, buckets=buckets)
    for value in (0.005,) * 98 + (0.5, 5.0):
        wait.labels("2").observe(value)
    wait.labels("0").observe(0.05)
    other.observe(0.05)
    figures = class_histograms(registry_samples(registry))
    assert list(figures) == ["queue_wait"]  # absent histograms and other metrics: no entry
    low = figures["queue_wait"]["2"]
    assert (low["count"], low["p50_le_ms"]) == (100, 10.0)
    assert low["p99_le_ms"] == 1000.0  # the 99th of 100 lies in (0.1, 1]
    assert low["mean_ms"] == pytest.approx((0.49 + 0.5 + 5.0) / 100 * 1000, abs=0.01)
    assert figures["queue_wait"]["0"] == {"count": 1, "mean_ms": 50.0, "p50_le_ms": 100.0, "p99_le_ms": 100.0}
    wait.labels("1").observe(9.0)  # past the last finite bound
    assert class_histograms(registry_samples(registry))["queue_wait"]["1"]["p99_le_ms"] is None


def _mixed_line(engine_only: float | None) -> dict[str, Any]:
    ledger = _ledger()
    out = window_out(ledger, (BACKLOG, BULK), 2.0, 6.0)
    return {
        "bulk_topic": "alerts.in",
        "critical_topic": "alerts.critical",
        "backlog_events": 2,
        "backlog_send_s": 0.01,
        "bulk_rate": 1.5,
        "critical_rate": 2.0,
        "http_rate": 2.0,
        "seconds": 4.0,
        "classes": {
            "backlog": class_figures(ledger, (BACKLOG,)),
            "bulk": class_figures(ledger, (BULK,)),
            "critical": class_figures(ledger, (CRITICAL,)),
            "http": http_figures([HttpCall(1.0, 1.02, 200), HttpCall(2.0, 2.1, 503)]),
        },
        "kafka_out_s": out,
        "kafka_out_over_engine_only": round(out / engine_only, 3) if engine_only else None,
        "topics": {
            "alerts.in": topic_ledger(ledger, (BACKLOG, BULK)),
            "alerts.critical": topic_ledger(ledger, (CRITICAL,)),
        },
        "offsets_at_end": False,
        "drain_s": 3.5,
        "service_classes": {"queue_wait": {"0": {"count": 1, "mean_ms": 50.0}}},
        "loop_lag": lag_figures([(1.0, 0.001), (1.5, 0.03), (2.5, 0.002)], 1.0),
    }


def test_mixed_text_rows_per_class_and_topic() -> None:
    info = {
        "date": "2026-12-01 00:00:00 UTC",
        "engine": "tiny",
        "device": "cpu",
        "broker_version": "4.4.0",
        "partitions": 3,
        "batching": {"mode": "adaptive", "max_batch_tokens": 32768},
        "arrivals": "uniform",
    }
    text = mixed_text(info, {"events_s": 4.0}, _mixed_line(4.0))
    lines = text.splitlines()
    assert "1.0 decisions/s of alerts.in (0.25 of engine-only)" in text
    assert [ln.split(" | ")[0] for ln in lines if ln.startswith("| ") and "|---" not in ln] == [
        "| class",
        "| backlog",
        "| bulk",
        "| critical",
        "| http",
        "| topic",
        "| alerts.in",
        "| alerts.critical",
    ]
    assert "| alerts.critical | 2 | 1 | 0 | 0 | 1 |" in lines
    assert "HTTP errors 1 {'503': 1}, unanswered 0" in text
    assert "after the drain: False (drain 3.5 s)" in text
    assert "service queue_wait by class: 0: 1 (mean 50.0 ms)" in lines
    assert "0.03 s late by more than 20 ms; worst (s from the window start): 30.0 ms at 0.5 s; 2.0 ms" in text
    bare = mixed_text(info, None, _mixed_line(None))
    assert "engine-only" not in bare
    assert "engine only" not in bare
