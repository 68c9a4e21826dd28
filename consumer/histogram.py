"""A Prometheus histogram for hot paths: `observe(value, count)` records many equal observations at once.

`prometheus_client.Histogram.observe` takes a lock twice per call and records one value; the pipeline
observes several values per record (queue wait, end-to-end latency), and records of one run share most of
them. `BulkHistogram` keeps plain counts, written only on the event loop, and exposes them through a
registered collector as a standard histogram (`_bucket{le=...}`, `_count`, `_sum`), so `/metrics` reads the
same as with `prometheus_client.Histogram`. A scrape from another thread may see one observation half
applied (bucket counted, sum not yet); Prometheus tolerates that within one scrape.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector


class BulkHistogram(Collector):
    """Histogram `name` with the given upper bucket bounds (+Inf is added), registered in `registry`."""

    def __init__(
        self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = sorted(float(b) for b in buckets)
        self._counts = [0] * (len(self._bounds) + 1)  # last slot: above every bound (+Inf only)
        self.sum = 0.0
        self.count = 0
        registry.register(self)

    def observe(self, value: float, count: int = 1) -> None:
        """Record `count` observations of `value` (event loop only; O(log buckets))."""
        self._counts[bisect_left(self._bounds, value)] += count
        self.sum += value * count
        self.count += count

    def collect(self) -> Iterator[HistogramMetricFamily]:
        """The histogram with cumulative buckets, as `prometheus_client` exposes it."""
        cumulative: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip([*self._bounds, float("inf")], self._counts, strict=True):
            running += n
            cumulative.append((_le(bound), running))
        yield HistogramMetricFamily(self._name, self._documentation, buckets=cumulative, sum_value=self.sum)

    def describe(self) -> Iterator[HistogramMetricFamily]:
        """Name and type only (lets the registry check for duplicate names without collecting)."""
        yield HistogramMetricFamily(self._name, self._documentation)


def _le(bound: float) -> str:
    """A bucket bound as Prometheus writes it (`+Inf`, `0.005`, `1.0`)."""
    return "+Inf" if bound == float("inf") else repr(bound)
