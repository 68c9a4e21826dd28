"""`BulkHistogram`: the same exposition as `prometheus_client.Histogram`, with bulk observations."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from consumer.histogram import BulkHistogram

BUCKETS = (0.005, 0.01, 0.5, 1.0, 2.5)
OBSERVED = [(0.001, 3), (0.005, 1), (0.0051, 2), (0.7, 1), (1.0, 4), (99.0, 2)]


def _samples(registry: CollectorRegistry) -> list[str]:
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if not line.startswith("#") and "_created" not in line]


def test_bulk_observations_expose_like_prometheus_histogram() -> None:
    ours, reference = CollectorRegistry(), CollectorRegistry()
    bulk = BulkHistogram("h_seconds", "help", buckets=BUCKETS, registry=ours)
    plain = Histogram("h_seconds", "help", buckets=BUCKETS, registry=reference)
    for value, count in OBSERVED:
        bulk.observe(value, count)
        for _ in range(count):
            plain.observe(value)
    assert _samples(ours) == _samples(reference)
    assert bulk.count == sum(count for _, count in OBSERVED)
    assert 'h_seconds_bucket{le="0.005"} 4.0' in _samples(ours)  # a value equal to a bound is in it
    assert 'h_seconds_bucket{le="+Inf"} 13.0' in _samples(ours)


def test_empty_histogram_exposes_zero_buckets() -> None:
    registry = CollectorRegistry()
    BulkHistogram("e", "help", buckets=(1.0,), registry=registry)
    assert _samples(registry) == [
        'e_bucket{le="1.0"} 0.0',
        'e_bucket{le="+Inf"} 0.0',
        "e_count 0.0",
        "e_sum 0.0",
    ]


def test_totals_sum_every_series_of_a_family() -> None:
    registry = CollectorRegistry()
    family = BulkHistogram("f_seconds", "help", buckets=BUCKETS, registry=registry, labelnames=("class",))
    family.labels("0").observe(0.5, 3)
    family.labels("1").observe(2.0)
    assert family.totals() == (4, 3.5)
    assert (family.count, family.sum) == (0, 0.0)  # the unlabelled series holds nothing in a family
    plain = BulkHistogram("p_seconds", "help", buckets=BUCKETS, registry=registry)
    plain.observe(0.25, 2)
    assert plain.totals() == (2, 0.5)
