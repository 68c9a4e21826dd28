"""`bench.e2e`'s report: per-load figures from the `Ledger` and the lag samples (latency percentiles,
events/s in and out, lag), the service's own figures from its metrics, the summary table and the broker-log
check; for the mixed run, per-class figures (Kafka classes from the ledger, HTTP from its calls), the
per-topic ledger, the offsets at the end, the service's per-class histograms and the mixed table. Pure
functions of what the run collected, except `service_counters` and `registry_samples` (read the pipeline's
metrics) and `broker_log_errors` (reads the broker's log file).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bench.e2e_traffic import HttpCall, Ledger
from consumer.batching.batch_metrics import COST_DIRECTIONS
from consumer.batching.gpu import BATCH_STEPS

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

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
    batcher_count, batcher_sum = m.class_latency.totals()
    steps = {name: m.batch_path.labels(name) for name in BATCH_STEPS}
    return {
        **{f"{name}_count": float(series.count) for name, series in steps.items()},
        **{f"{name}_sum": series.sum for name, series in steps.items()},
        "prepare_count": float(m.prepare_seconds.count),
        "prepare_sum": m.prepare_seconds.sum,
        "gpu_busy_s": _metric(pipeline, "clef_router_gpu_busy_seconds_total"),
        "batches": float(m.batch_records.count),
        "batch_records_sum": m.batch_records.sum,
        "batch_tokens_sum": m.batch_tokens.sum,
        "engine_sum": m.engine_seconds.sum,
        "wait_count": float(m.queue_wait.count),
        "wait_sum": m.queue_wait.sum,
        "batcher_count": float(batcher_count),
        "batcher_sum": batcher_sum,
        "fetch_count": float(m.fetch_age.count),
        "fetch_sum": m.fetch_age.sum,
        "e2e_count": float(m.end_to_end.count),
        "e2e_sum": m.end_to_end.sum,
        **{f"cost_{d}_count": float(m.batch_cost_error.labels(d).count) for d in COST_DIRECTIONS},
        **{f"cost_{d}_sum": m.batch_cost_error.labels(d).sum for d in COST_DIRECTIONS},
        "commits": _metric(pipeline, "clef_router_commits_total"),
    }


def service_window(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """A window's service figures from two `service_counters` reads `seconds` apart. The means (ms) split
    a record's time in the service: `service_e2e_mean_ms` its record timestamp to its outputs acknowledged
    (per record), `service_fetch_age_mean_ms` its timestamp to fetched (per record),
    `service_batcher_mean_ms` a submission's time in the batcher (submit to answered: prepare, queue,
    engine; per submission), `service_queue_wait_mean_ms` a prepared record's wait for its batch to start
    (per record), `service_batch_mean_ms` a batch's engine time (per batch), `service_prepare_mean_ms`
    submitted to prepared, and `service_<step>_mean_ms` for each step of `consumer.batching.gpu.BATCH_STEPS`
    after the cut (per record: stage_wait, stage, gpu_wait, run, back, respond_wait, respond). The cost
    model's error over the clean batches it predicted: `service_cost_over_share` the share that ran longer
    than predicted, `service_cost_{over,under}_mean_ms` by how much on average, each way."""
    d = {k: after[k] - before[k] for k in after}
    batches = d["batches"]
    predicted = d["cost_over_count"] + d["cost_under_count"]

    def mean_ms(total: str, count: str) -> float:
        return round(d[total] / d[count] * 1000, 2) if d[count] else 0.0

    return {
        "gpu_busy": round(d["gpu_busy_s"] / max(1e-9, seconds), 3),
        "batches": int(batches),
        "records_per_batch_mean": round(d["batch_records_sum"] / batches, 2) if batches else 0.0,
        "tokens_per_batch_mean": round(d["batch_tokens_sum"] / batches) if batches else 0,
        "service_e2e_mean_ms": mean_ms("e2e_sum", "e2e_count"),
        "service_fetch_age_mean_ms": mean_ms("fetch_sum", "fetch_count"),
        "service_batcher_mean_ms": mean_ms("batcher_sum", "batcher_count"),
        "service_queue_wait_mean_ms": mean_ms("wait_sum", "wait_count"),
        "service_batch_mean_ms": mean_ms("engine_sum", "batches"),
        "service_prepare_mean_ms": mean_ms("prepare_sum", "prepare_count"),
        **{f"service_{name}_mean_ms": mean_ms(f"{name}_sum", f"{name}_count") for name in BATCH_STEPS},
        "service_cost_over_share": round(d["cost_over_count"] / predicted, 3) if predicted else 0.0,
        **{f"service_cost_{w}_mean_ms": mean_ms(f"cost_{w}_sum", f"cost_{w}_count") for w in COST_DIRECTIONS},
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
    means = [
        f"{r['rate']:g}/s, service means: record timestamp to outputs acknowledged "
        f"{r['service_e2e_mean_ms']} ms, to fetched {r.get('service_fetch_age_mean_ms', '-')} ms, "
        f"in the batcher {r['service_batcher_mean_ms']} ms "
        f"(queue wait {r['service_queue_wait_mean_ms']} ms, batch {r['service_batch_mean_ms']} ms)"
        + _path_text(r)
        for r in loads
        if "service_batcher_mean_ms" in r  # load lines read back from older runs lack the split
    ]
    lines += ["", *means] if means else []
    return "\n".join(lines) + "\n"


def _path_text(r: dict[str, Any]) -> str:
    """A load's per-record path through the batcher (prepare, then each step after the cut), or "" for a
    load line from before the steps were counted."""
    if "service_prepare_mean_ms" not in r:
        return ""
    steps = ", ".join(f"{name} {r[f'service_{name}_mean_ms']}" for name in BATCH_STEPS)
    text = f"; per record: prepare {r['service_prepare_mean_ms']}, queue wait, then {steps} ms"
    if "service_cost_over_share" in r:
        text += (
            f"; GPU time against the cost model: over in {r['service_cost_over_share']} of batches by "
            f"{r['service_cost_over_mean_ms']} ms mean, under by {r['service_cost_under_mean_ms']} ms mean"
        )
    return text


def broker_log_errors(broker: LocalKafka) -> list[str]:
    """Lines of the broker's log naming a missing class or native library (the carried set lacks it)."""
    try:
        text = broker.log_file.read_text(encoding="utf-8", errors="replace")
    except Exception:
        return []
    return [ln[:300] for ln in text.splitlines() if any(m in ln for m in MISSING_CLASS_MARKERS)][:20]


# ---- the mixed run ----------------------------------------------------------------------------------------
#: The service's per-class histograms (`consumer.metrics`), read at the end of the mixed run.
CLASS_HISTOGRAMS = {
    "queue_wait": "clef_router_class_queue_wait_seconds",
    "batcher": "clef_router_class_batcher_seconds",
    "end_to_end": "clef_router_class_end_to_end_seconds",
}


def class_figures(ledger: Ledger, loads: Collection[int]) -> dict[str, Any]:
    """The events of `loads`: sent, answered (decided), dead-lettered, and the latency from each one's
    scheduled send to the moment the tail consumer held its decision (p50/p95/p99/max ms)."""
    ids = [eid for eid, s in ledger.sent.items() if s.load in loads]
    latencies = [ledger.decided[eid][0] - ledger.sent[eid].due for eid in ids if eid in ledger.decided]
    return {
        "sent": len(ids),
        "answered": len(latencies),
        "dead_lettered": sum(1 for eid in ids if eid in ledger.dead),
        **quantiles_ms(latencies),
    }


def http_figures(calls: Sequence[HttpCall]) -> dict[str, Any]:
    """The HTTP requests: sent, answered (status 200), errors (any other status or a client error, with
    how many of each), unanswered (no response by the end), latency of the answered ones (request sent to
    response, p50/p95/p99/max ms)."""
    ok = [c.done - c.due for c in calls if c.status == 200 and c.done is not None]
    first = calls[0].due if calls else 0.0
    timed = sorted(
        (
            (c.done - c.due, n, c.due - first)
            for n, c in enumerate(calls, 1)
            if c.status == 200 and c.done is not None
        ),
        reverse=True,
    )
    errors = Counter(
        str(c.status) if c.status is not None else c.error or "?"
        for c in calls
        if c.done is not None and c.status != 200
    )
    return {
        "sent": len(calls),
        "answered": len(ok),
        "errors": sum(errors.values()),
        "error_kinds": dict(errors.most_common(5)),
        "unanswered": sum(1 for c in calls if c.done is None),
        **quantiles_ms(ok),
        # the slowest answers: which request in send order, how far into the run it was sent
        "slowest": [{"n": n, "at_s": round(at, 2), "ms": round(lat * 1e3, 2)} for lat, n, at in timed[:3]],
    }


def window_out(ledger: Ledger, loads: Collection[int], t0: float, t1: float) -> float:
    """Decisions/s of the events of `loads` that the tail consumer held within [t0, t1]."""
    ids = [eid for eid, s in ledger.sent.items() if s.load in loads]
    n = sum(1 for eid in ids if eid in ledger.decided and t0 <= ledger.decided[eid][0] <= t1)
    return round(n / max(1e-9, t1 - t0), 2)


def topic_ledger(ledger: Ledger, loads: Collection[int]) -> dict[str, int]:
    """The events of `loads` (one input topic): sent, decided, dead-lettered, duplicate decisions, and
    lost (neither decided nor dead-lettered)."""
    ids = {eid for eid, s in ledger.sent.items() if s.load in loads}
    return {
        "sent": len(ids),
        "decided": sum(1 for eid in ids if eid in ledger.decided),
        "dead_lettered": sum(1 for eid in ids if eid in ledger.dead),
        "duplicates": sum(1 for eid in ledger.duplicated if eid in ids),
        "lost": sum(1 for eid in ids if eid not in ledger.decided and eid not in ledger.dead),
    }


def offsets_at_end(offsets: Sequence[Mapping[str, Any]]) -> bool:
    """Whether every partition's committed offset reached its high watermark (and there is one)."""
    return bool(offsets) and all(o["committed"] >= o["high"] for o in offsets)


Sample = tuple[str, Mapping[str, str], float]
"""One metric sample: name (with its `_bucket`/`_count`/`_sum` suffix), labels, value."""


def registry_samples(registry: CollectorRegistry) -> list[Sample]:
    """Every sample of `registry` now (blocking only as long as its collectors take)."""
    return [(s.name, s.labels, s.value) for family in registry.collect() for s in family.samples]


def class_histograms(samples: Iterable[Sample]) -> dict[str, dict[str, dict[str, Any]]]:
    """`CLASS_HISTOGRAMS` per priority class: count, mean ms, and the upper bounds (ms) of the buckets that
    hold the p50 and the p99 (None past the last finite bound). Histograms absent or empty: no entry."""
    names = {v: k for k, v in CLASS_HISTOGRAMS.items()}
    counts: dict[tuple[str, str], float] = {}
    sums: dict[tuple[str, str], float] = {}
    buckets: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for name, labels, value in samples:
        base, _, suffix = name.rpartition("_")
        if base not in names or "priority" not in labels:
            continue
        key = (names[base], labels["priority"])
        if suffix == "count":
            counts[key] = value
        elif suffix == "sum":
            sums[key] = value
        elif suffix == "bucket":
            buckets.setdefault(key, []).append((float(labels["le"]), value))
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for metric in CLASS_HISTOGRAMS:
        for (m, priority), n in sorted(counts.items()):
            if m != metric or n <= 0:
                continue
            ordered = sorted(buckets.get((m, priority), []))
            out.setdefault(metric, {})[priority] = {
                "count": int(n),
                "mean_ms": round(sums.get((m, priority), 0.0) / n * 1000, 2),
                "p50_le_ms": _bucket_bound(ordered, 0.5 * n),
                "p99_le_ms": _bucket_bound(ordered, 0.99 * n),
            }
    return out


def _bucket_bound(cumulative: Sequence[tuple[float, float]], rank: float) -> float | None:
    """The upper bound (ms) of the first bucket whose cumulative count reaches `rank`; None when that is the
    +Inf bucket or there is none."""
    le = next((le for le, count in cumulative if count >= rank), None)
    return None if le is None or le == float("inf") else round(le * 1000, 3)


def mixed_text(info: dict[str, Any], capacity: dict[str, Any] | None, mixed: dict[str, Any]) -> str:
    """The mixed run's summary: what ran, one row per class, the Kafka throughput, the ledger per topic and
    the offsets at the end."""
    batching = info["batching"]
    lines = [
        f"bench.e2e --mixed {info['date']}: engine {info['engine']} on {info['device']}, broker Apache Kafka "
        f"{info['broker_version']}, {info['partitions']} partitions per input topic, batching "
        f"{batching['mode']} (max {batching['max_batch_tokens']} tokens)",
        f"backlog {mixed['backlog_events']} events on {mixed['bulk_topic']} (sent in "
        f"{mixed['backlog_send_s']} s), then {mixed['seconds']:g} s of bulk {mixed['bulk_rate']:g}/s "
        f"({info['arrivals']}), {mixed['critical_topic']} {mixed['critical_rate']:g}/s and HTTP "
        f"{mixed['http_rate']:g}/s (Poisson)",
    ]
    if capacity is not None:
        lines.append(f"engine only (same process, no Kafka): {capacity['events_s']} events/s")
    ratio = mixed["kafka_out_over_engine_only"]
    lines += [
        f"Kafka throughput in the window: {mixed['kafka_out_s']} decisions/s of {mixed['bulk_topic']}"
        + (f" ({ratio} of engine-only)" if ratio is not None else ""),
        "",
        "| class | sent | answered | p50 ms | p95 ms | p99 ms | max ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, c in mixed["classes"].items():
        lines.append(
            f"| {name} | {c['sent']} | {c['answered']} | {c['p50_ms']} | {c['p95_ms']} | {c['p99_ms']} | "
            f"{c['max_ms']} |"
        )
    lines += ["", "| topic | sent | decided | DLQ | duplicates | lost |", "|---|---|---|---|---|---|"]
    for topic, t in mixed["topics"].items():
        lines.append(
            f"| {topic} | {t['sent']} | {t['decided']} | {t['dead_lettered']} | {t['duplicates']} | "
            f"{t['lost']} |"
        )
    http = mixed["classes"]["http"]
    kinds = f" {http['error_kinds']}" if http["errors"] else ""
    slow = "; ".join(f"#{c['n']} sent at {c['at_s']} s: {c['ms']} ms" for c in http.get("slowest", []))
    lines += [
        "",
        f"HTTP errors {http['errors']}{kinds}, unanswered {http['unanswered']}; "
        f"committed offsets at the high watermarks after the drain: {mixed['offsets_at_end']} "
        f"(drain {mixed['drain_s']} s)",
        f"HTTP slowest (request in send order): {slow or '-'}",
    ]
    lag = mixed.get("loop_lag")
    if lag:
        worst = "; ".join(f"{w['ms']} ms at {w['at_s']} s" for w in lag["worst"])
        lines.append(
            f"event loop lag (5 ms sleeps, {lag['samples']} samples): p50 {lag['p50_ms']} "
            f"p99 {lag['p99_ms']} max {lag['max_ms']} ms, {lag['over_20ms_s']} s late by more than 20 ms; "
            f"worst (s from the window start): {worst or '-'}"
        )
    for metric, per_class in mixed["service_classes"].items():
        shown = ", ".join(f"{k}: {v['count']} (mean {v['mean_ms']} ms)" for k, v in per_class.items())
        lines.append(f"service {metric} by class: {shown}")
    return "\n".join(lines) + "\n"
