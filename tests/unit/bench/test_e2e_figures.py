"""`bench.e2e`'s pure parts: the per-load figures, the service window and the summary (`bench.e2e_report`),
the record values (`bench.e2e_traffic`) and the PyAV placeholder (`bench.av_placeholder`); the whole run on
a real broker: tests/integration/test_bench_e2e.py."""

from __future__ import annotations

import random
import sys
from typing import Any

import pytest

from bench.av_placeholder import install_av_placeholder
from bench.e2e_report import load_figures, service_window, summary_text
from bench.e2e_traffic import Ledger, Sent, event_values
from consumer.batching.gpu import BATCH_STEPS


def _ledger() -> Ledger:
    """Load 1: four events 0.25 s apart from t=10; three decided (one after the window), one dead."""
    ledger = Ledger()
    for i in range(4):
        ledger.sent[f"L1-{i}"] = Sent(1, 10.0 + 0.25 * i, 1_000_000 + 250 * i)
    ledger.sent["L0-0"] = Sent(0, 9.0, 999_000)  # warm-up: not part of load 1
    ledger.decided["L1-0"] = (10.1, 1_000_100)
    ledger.decided["L1-1"] = (10.45, 1_000_450)
    ledger.decided["L1-2"] = (12.5, 1_002_500)  # after the window's end (11.0)
    ledger.dead["L1-3"] = 10.9
    return ledger


def test_load_figures_count_latency_and_lag() -> None:
    lags = [
        {"load": -1, "lag": 9},
        {"load": 1, "lag": 2},
        {"load": 1, "lag": 4},
        {"load": 1, "lag": 0},
    ]
    r = load_figures(_ledger(), 1, 10.0, 1.0, lags)
    assert r["events"] == 4
    assert r["events_in_s"] == 4.0
    assert r["events_out_s"] == 2.0  # two decisions within [10, 11]
    assert (r["decided"], r["dead_lettered"], r["undecided"]) == (3, 1, 0)
    assert r["p50_ms"] == pytest.approx(200.0)  # 100, 200, 2000 ms: nearest-rank p50 is the middle one
    assert r["max_ms"] == pytest.approx(2000.0)
    assert r["ts_p50_ms"] == pytest.approx(200.0)
    assert (r["lag_max"], r["lag_at_end"], r["lag_series"]) == (4, 0, [2, 4, 0])
    assert r["lag_mean"] == 2.0


def test_load_figures_without_answers() -> None:
    ledger = Ledger()
    ledger.sent["L2-0"] = Sent(2, 1.0, 1000)
    r = load_figures(ledger, 2, 1.0, 2.0, [])
    assert (r["decided"], r["undecided"], r["p99_ms"], r["lag_max"], r["lag_mean"]) == (0, 1, 0.0, 0, 0.0)


def test_service_window_differences() -> None:
    before = {
        "gpu_busy_s": 1.0,
        "batches": 10.0,
        "batch_records_sum": 40.0,
        "batch_tokens_sum": 4000.0,
        "engine_sum": 0.5,
        "wait_count": 40.0,
        "wait_sum": 0.8,
        "batcher_count": 20.0,
        "batcher_sum": 1.0,
        "fetch_count": 40.0,
        "fetch_sum": 0.2,
        "e2e_count": 40.0,
        "e2e_sum": 4.0,
        "commits": 3.0,
    }
    after = {**before, "gpu_busy_s": 3.0, "batches": 14.0, "batch_records_sum": 60.0}
    after |= {"batch_tokens_sum": 6000.0, "e2e_count": 60.0, "e2e_sum": 10.0, "commits": 5.0}
    after |= {"engine_sum": 0.7, "wait_count": 60.0, "wait_sum": 1.2}
    after |= {"batcher_count": 25.0, "batcher_sum": 1.5, "fetch_count": 60.0, "fetch_sum": 0.4}
    before |= {"prepare_count": 40.0, "prepare_sum": 0.04}
    after |= {"prepare_count": 60.0, "prepare_sum": 0.08}  # 2 ms a record
    for i, step in enumerate(BATCH_STEPS):  # step i: (i + 1) ms a record over 20 records
        before |= {f"{step}_count": 40.0, f"{step}_sum": 1.0}
        after |= {f"{step}_count": 60.0, f"{step}_sum": 1.0 + 0.02 * (i + 1)}
    before |= {"cost_over_count": 1.0, "cost_over_sum": 0.01, "cost_under_count": 2.0, "cost_under_sum": 0.0}
    after |= {
        "cost_over_count": 4.0,
        "cost_over_sum": 0.016,
        "cost_under_count": 3.0,
        "cost_under_sum": 0.001,
    }
    w = service_window(before, after, 4.0)
    assert (w.pop("service_cost_over_share"), w.pop("service_cost_over_mean_ms")) == (0.75, 2.0)
    assert w.pop("service_cost_under_mean_ms") == 1.0
    assert {k: w.pop(f"service_{k}_mean_ms") for k in BATCH_STEPS} == {
        "stage_wait": 1.0,
        "stage": 2.0,
        "gpu_wait": 3.0,
        "run": 4.0,
        "back": 5.0,
        "respond_wait": 6.0,
        "respond": 7.0,
    }
    assert w.pop("service_prepare_mean_ms") == 2.0
    assert w == {
        "gpu_busy": 0.5,
        "batches": 4,
        "records_per_batch_mean": 5.0,
        "tokens_per_batch_mean": 500,
        "service_e2e_mean_ms": 300.0,
        "service_fetch_age_mean_ms": 10.0,
        "service_batcher_mean_ms": 100.0,
        "service_queue_wait_mean_ms": 20.0,
        "service_batch_mean_ms": 50.0,
        "commits": 2,
    }
    idle = service_window(before, before, 4.0)
    assert (idle["batches"], idle["records_per_batch_mean"], idle["service_e2e_mean_ms"]) == (0, 0.0, 0.0)
    assert (idle["service_batcher_mean_ms"], idle["service_batch_mean_ms"]) == (0.0, 0.0)


def test_summary_text_has_one_row_per_load_and_the_ratio() -> None:
    info = {
        "date": "2026-12-01 00:00:00 UTC",
        "engine": "stub",
        "device": "cpu",
        "broker_version": "4.4.0",
        "partitions": 3,
        "batching": {"mode": "fixed", "max_batch_tokens": 32768},
        "tokens_min": 400,
        "tokens_max": 1500,
        "tokens_p50": 600,
        "arrivals": "uniform",
    }
    load = load_figures(_ledger(), 1, 10.0, 1.0, []) | {"rate": 4.0, "records_per_batch_mean": 1.5}
    load["gpu_busy"] = 0.25
    text = summary_text(info, {"events_s": 8.0, "tok_s": 5000, "events": 64}, [load, load])
    rows = [ln for ln in text.splitlines() if ln.startswith("| 4 |")]
    assert len(rows) == 2
    assert rows[0].endswith("| 0.25 |")  # 2.0 events/s out over 8.0 engine-only
    assert "engine only (same process" in text
    assert summary_text(info, None, [load]).splitlines()[-1].endswith("| - |")

    def service_line(split: dict[str, float]) -> str:
        return summary_text(info, None, [load | split]).splitlines()[-1]

    split = {"service_e2e_mean_ms": 90.5, "service_fetch_age_mean_ms": 4.5, "service_batcher_mean_ms": 80.0}
    split |= {"service_queue_wait_mean_ms": 30.25, "service_batch_mean_ms": 40.0}
    assert service_line(split) == (
        "4/s, service means: record timestamp to outputs acknowledged 90.5 ms, to fetched 4.5 ms, "
        "in the batcher 80.0 ms "
        "(queue wait 30.25 ms, batch 40.0 ms)"
    )
    split |= {"service_prepare_mean_ms": 0.5} | {f"service_{k}_mean_ms": 1.0 for k in BATCH_STEPS}
    assert service_line(split).endswith(
        "; per record: prepare 0.5, queue wait, then stage_wait 1.0, stage 1.0, gpu_wait 1.0, run 1.0, "
        "back 1.0, respond_wait 1.0, respond 1.0 ms"
    )
    split |= {
        "service_cost_over_share": 0.75,
        "service_cost_over_mean_ms": 2.0,
        "service_cost_under_mean_ms": 1.0,
    }
    assert service_line(split).endswith(
        "respond 1.0 ms; GPU time against the cost model: over in 0.75 of batches by 2.0 ms mean, "
        "under by 1.0 ms mean"
    )


class _NoPyAV:
    """A meta path finder that makes `import av` fail as on a machine without PyAV."""

    def find_spec(self, name: str, *_: Any) -> None:
        if name == "av" or name.startswith("av."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


def test_av_placeholder_only_when_pyav_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    real = sys.modules.pop("av", None)
    try:
        monkeypatch.setattr(sys, "meta_path", [_NoPyAV(), *sys.meta_path])
        assert install_av_placeholder() is True
        av = sys.modules["av"]
        assert issubclass(av.FFmpegError, Exception)
        with pytest.raises(AttributeError, match=r"PyAV is not installed.*av\.open"):
            _ = av.open
        assert not hasattr(av, "__file__")  # inspect and friends walk sys.modules with hasattr
        assert install_av_placeholder() is False  # already in sys.modules
    finally:
        sys.modules.pop("av", None)
        if real is not None:
            sys.modules["av"] = real


def test_event_values_decode_to_the_same_requests() -> None:
    from bench.workload import make_request
    from consumer.pipeline.decode import decode_value
    from consumer.settings import load_settings
    from schemas.parse import RequestLimits

    class Sizer:  # token count = words of the message + 400, like a tokenizer with a fixed prompt
        def prepare(self, request: object) -> object:
            state = getattr(request, "state", {})
            words = len(str(state.get("message", "")).split()) if isinstance(state, dict) else 0
            return type("P", (), {"num_tokens": 400 + words})()

    requests = [make_request(random.Random(i), Sizer(), 700) for i in range(3)]  # type: ignore[arg-type]
    settings = load_settings()
    limits = RequestLimits(max_value_bytes=settings.engine.max_message_bytes)
    for request, value in zip(requests, event_values(requests), strict=True):
        assert decode_value(value, settings.routing.default_schema, limits).request == request
