"""A Prometheus histogram for hot paths: `observe(value, count)` records many equal observations at once.

`prometheus_client.Histogram.observe` takes a lock twice per call and records one value; the pipeline
observes several values per record (queue wait, end-to-end latency), and records of one run share most of
them. `BulkHistogram` keeps plain counts, written only on the event loop, and exposes them through a
registered collector as a standard histogram (`_bucket{le=...}`, `_count`, `_sum`), so `/metrics` reads the
same as with `prometheus_client.Histogram`. With `labelnames`, `labels(*values)` gives one series per
label values (created on first use), all exposed as one family. A scrape from another thread may see one
observation half applied (bucket counted, sum not yet); Prometheus tolerates that within one scrape.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector


class _Series:
    """The counts of one histogram series (one set of label values)."""

    __slots__ = ("_bounds", "count", "counts", "sum")

    def __init__(self, bounds: list[float]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # last slot: above every bound (+Inf only)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, count: int = 1) -> None:
        """Record `count` observations of `value` (event loop only; O(log buckets))."""
        self.counts[bisect_left(self._bounds, value)] += count
        self.sum += value * count
        self.count += count

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip([*self._bounds, float("inf")], self.counts, strict=True):
            running += n
            out.append((_le(bound), running))
        return out


class BulkHistogram(Collector):
    """Histogram `name` with the given upper bucket bounds (+Inf is added), registered in `registry`;
    `labelnames` (none by default) make it a family of series, one per `labels(...)` values."""

    def __init__(
        self,
        name: str,
        documentation: str,
        buckets: Sequence[float],
        registry: CollectorRegistry,
        labelnames: Sequence[str] = (),
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = sorted(float(b) for b in buckets)
        self._labelnames = tuple(labelnames)
        self._series: dict[tuple[str, ...], _Series] = {}
        self._plain = _Series(self._bounds)
        if not self._labelnames:
            self._series[()] = self._plain
        registry.register(self)

    @property
    def sum(self) -> float:
        return self._plain.sum

    @property
    def count(self) -> int:
        return self._plain.count

    def totals(self) -> tuple[int, float]:
        """(count, sum) over every series: the unlabelled one and each label values' (benchmarks read a
        window's mean from two reads)."""
        series = list(self._series.values()) if self._labelnames else [self._plain]
        return sum(s.count for s in series), sum(s.sum for s in series)

    def observe(self, value: float, count: int = 1) -> None:
        """Record `count` observations of `value` in the unlabelled series (event loop only)."""
        self._plain.observe(value, count)

    def labels(self, *values: str) -> _Series:
        """The series of these label values (created on first use). Raises `ValueError` for a wrong count."""
        if len(values) != len(self._labelnames):
            raise ValueError(f"{self._name} takes labels {self._labelnames}, got {values}")
        series = self._series.get(values)
        if series is None:
            series = self._series[values] = _Series(self._bounds)
        return series

    def collect(self) -> Iterator[HistogramMetricFamily]:
        """The histogram with cumulative buckets, as `prometheus_client` exposes it."""
        if not self._labelnames:
            yield HistogramMetricFamily(
                self._name, self._documentation, buckets=self._plain.cumulative(), sum_value=self._plain.sum
            )
            return
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)
        for values, series in sorted(self._series.items()):
            family.add_metric(list(values), series.cumulative(), sum_value=series.sum)
        yield family

    def describe(self) -> Iterator[HistogramMetricFamily]:
        """Name and type only (lets the registry check for duplicate names without collecting)."""
        yield HistogramMetricFamily(self._name, self._documentation)


def _le(bound: float) -> str:
    """A bucket bound as Prometheus writes it (`+Inf`, `0.005`, `1.0`)."""
    return "+Inf" if bound == float("inf") else repr(bound)
