"""Every Prometheus metric of the service, named in one place.

A `Metrics` instance owns its own `CollectorRegistry`, so tests and benchmarks can build several without
clashing with the process-global registry. `render()` returns the text exposition for `/metrics`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from consumer.histogram import BulkHistogram

PREFIX = "clef_router"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
FILL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
TOKEN_BUCKETS = (256, 1024, 4096, 16_384, 65_536, 262_144, 1_048_576)
LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
ERROR_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """Counters, gauges and histograms named `clef_router_*`. Histograms are `BulkHistogram`s (observed on
    the event loop only; records of one run that share a value are observed at once)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        # registered in this order, which is the order of the exposition
        self._add_flow_metrics(self.registry)
        self._add_batch_metrics(self.registry)
        self._add_outcome_metrics(self.registry)
        self._add_http_metrics(self.registry)
        self._add_service_metrics(self.registry)

    def _add_flow_metrics(self, registry: CollectorRegistry) -> None:
        """Records through the Kafka loop: outcomes, lag, in flight, backpressure."""
        self.records = Counter(
            f"{PREFIX}_records", "Input records by final outcome", ["outcome"], registry=registry
        )
        self.consumer_lag = Gauge(
            f"{PREFIX}_consumer_lag",
            "High watermark minus position",
            ["topic", "partition"],
            registry=registry,
        )
        self.in_flight = Gauge(
            f"{PREFIX}_in_flight_records", "Fetched, not yet committed records", registry=registry
        )
        self.paused = Gauge(
            f"{PREFIX}_paused", "1 while input partitions are paused for backpressure", registry=registry
        )

    def _add_batch_metrics(self, registry: CollectorRegistry) -> None:
        """Engine batches: size, tokens, queue wait, fill, budget, GPU and engine time."""
        self.batch_records = BulkHistogram(
            f"{PREFIX}_batch_records", "Records per engine batch", buckets=COUNT_BUCKETS, registry=registry
        )
        self.batch_tokens = BulkHistogram(
            f"{PREFIX}_batch_tokens", "Tokens per engine batch", buckets=TOKEN_BUCKETS, registry=registry
        )
        self.queue_wait = BulkHistogram(
            f"{PREFIX}_queue_wait_seconds",
            "Prepared record waiting for its batch to start",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.prepare_seconds = BulkHistogram(
            f"{PREFIX}_prepare_seconds",
            "Submitted record until prepared (decode and encode, the wait for the prepare pool included)",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.batch_path = BulkHistogram(
            f"{PREFIX}_batch_path_seconds",
            "A record's batch after its cut, by step: stage_wait (for the prepare thread), stage, gpu_wait "
            "(behind the batch before it), run, back (to the event loop), respond_wait (for the prepare "
            "thread), respond; one observation per record",
            buckets=LATENCY_BUCKETS,
            registry=registry,
            labelnames=("step",),
        )
        self.class_queue_wait = BulkHistogram(
            f"{PREFIX}_class_queue_wait_seconds",
            "Prepared record waiting for its batch to start, by priority class",
            buckets=LATENCY_BUCKETS,
            registry=registry,
            labelnames=("priority",),
        )
        self.class_latency = BulkHistogram(
            f"{PREFIX}_class_batcher_seconds",
            "Submission to answer through the batcher (prepare, queue, engine), by priority class",
            buckets=LATENCY_BUCKETS,
            registry=registry,
            labelnames=("priority",),
        )
        self.batch_fill = BulkHistogram(
            f"{PREFIX}_batch_fill_ratio",
            "Tokens per engine batch over the token budget it was cut with",
            buckets=FILL_BUCKETS,
            registry=registry,
        )
        self.batch_budget = Gauge(
            f"{PREFIX}_batch_budget_tokens",
            "Token budget of the last batch cut (fixed: max_batch_tokens; adaptive: follows the queue)",
            registry=registry,
        )
        self.gpu_busy = Counter(
            f"{PREFIX}_gpu_busy_seconds",
            "Seconds the GPU thread spent running batches; rate() is the GPU busy share",
            registry=registry,
        )
        self.batch_cost_error = BulkHistogram(
            f"{PREFIX}_batch_cost_error_seconds",
            "A batch's GPU time against the adaptive cost model's prediction at its cut, by direction: over "
            "(the next batch waits on the GPU thread) or under (the GPU idles until the next is staged)",
            buckets=ERROR_BUCKETS,
            registry=registry,
            labelnames=("direction",),
        )
        self.engine_seconds = BulkHistogram(
            f"{PREFIX}_engine_seconds",
            "Engine execute time per batch",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )

    def _add_outcome_metrics(self, registry: CollectorRegistry) -> None:
        """What became of records: latency, DLQ, routes, retries, splits, commits, rebalances."""
        self.fetch_age = BulkHistogram(
            f"{PREFIX}_fetch_age_seconds",
            "Record timestamp to fetched by the service (the producer's batching, the broker, the fetch)",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.end_to_end = BulkHistogram(
            f"{PREFIX}_end_to_end_seconds",
            "Record timestamp to outputs acknowledged",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.class_end_to_end = BulkHistogram(
            f"{PREFIX}_class_end_to_end_seconds",
            "Record timestamp to outputs acknowledged, by the input topic's priority class",
            buckets=LATENCY_BUCKETS,
            registry=registry,
            labelnames=("priority",),
        )
        self.dlq = Counter(
            f"{PREFIX}_dlq_records", "Dead-lettered records by reason", ["reason"], registry=registry
        )
        self.routed = Counter(
            f"{PREFIX}_routed_records",
            "Answered records by the route topic they went to",
            ["topic"],
            registry=registry,
        )
        self.retries = Counter(f"{PREFIX}_retries", "Retries by kind", ["kind"], registry=registry)
        self.batch_splits = Counter(
            f"{PREFIX}_batch_splits", "Engine batches split after a failure", registry=registry
        )
        self.state_truncated = Counter(
            f"{PREFIX}_state_truncated", "Answers with a truncated state", registry=registry
        )
        self.commits = Counter(f"{PREFIX}_commits", "Offset commits sent", registry=registry)
        self.rebalances = Counter(
            f"{PREFIX}_rebalances", "Partition assignment changes", ["kind"], registry=registry
        )

    def _add_http_metrics(self, registry: CollectorRegistry) -> None:
        """The HTTP API: requests by path and status, in flight, latency."""
        self.http_requests = Counter(
            f"{PREFIX}_http_requests",
            "HTTP requests by path and status",
            ["path", "status"],
            registry=registry,
        )
        self.http_in_flight = Gauge(
            f"{PREFIX}_http_in_flight", "POST /v1/systemone requests being answered", registry=registry
        )
        self.http_seconds = BulkHistogram(
            f"{PREFIX}_http_request_seconds",
            "HTTP request start to response sent, every route",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )

    def _add_service_metrics(self, registry: CollectorRegistry) -> None:
        """The service itself: broker reachability (`run`), the engine being loaded, the loop's lag."""
        self.broker_reachable = Gauge(
            f"{PREFIX}_broker_reachable",
            "1 while the last broker probe answered (run only)",
            registry=registry,
        )
        self.broker_unreachable_seconds = Gauge(
            f"{PREFIX}_broker_unreachable_seconds",
            "Seconds since the broker last answered a probe (0 while reachable)",
            registry=registry,
        )
        self.model_loaded = Gauge(f"{PREFIX}_model_loaded", "1 once the engine is ready", registry=registry)
        self.loop_lag = BulkHistogram(
            f"{PREFIX}_event_loop_lag_seconds",
            "How late the event loop woke up for a periodic sleep (consumer.loop_lag)",
            buckets=LAG_BUCKETS,
            registry=registry,
        )

    def render(self) -> bytes:
        """Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
