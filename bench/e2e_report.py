"""`bench.e2e`'s report: per-load figures from the `Ledger` and the lag samples (latency percentiles,
events/s in and out, lag), the service's own figures from its metrics, the summary table and the broker-log
check. Pure functions of what the run collected, except `service_counters` (reads the pipeline's metrics)
and `broker_log_errors` (reads the broker's log file).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from bench.e2e_traffic import Ledger

if TYPE_CHECKING:
    from consumer.pipeline.pipeline import Pipeline
    from devtools.kafka_local import LocalKafka

Emit = Callable[..., None]
"""Writes one JSON line of the run (keyword fields), to stdout and `e2e.jsonl`."""
#: Broker log lines that mean a class the carried jars or JRE lack was needed.
MISSING_CLASS_MARKERS = ("NoClassDefFoundError", "ClassNotFoundException", "UnsatisfiedLinkError")


def quantiles_ms(values: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99 (nearest rank) and max of `values` seconds, in ms; zeros for no values."""
    from bench.load_run import quantiles

    return quantiles(values)


def load_figures(
    ledger: Ledger, load: int, t0: float, seconds: float, lags: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """The figures of load `load` whose window began at `t0` (step 6 of `bench.e2e`'s docstring)."""
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
