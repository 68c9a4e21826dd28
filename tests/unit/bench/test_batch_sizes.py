"""`bench.batch_sizes`'s CPU parts: the graph buckets of each set it compares, the batches it cuts, and the
threads that keep the GIL busy meanwhile."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

from bench.batch_sizes import Hog, buckets_to, cut_batches
from engine.model.graphs import GRAPH_BUCKETS


@dataclass(frozen=True)
class _Record:
    num_tokens: int


def test_the_old_set_stops_at_4096_and_the_wider_sets_contain_the_product_buckets() -> None:
    assert buckets_to(4096)[-1] == 4096
    assert set(GRAPH_BUCKETS) <= set(buckets_to(16384))
    assert buckets_to(16384)[-1] == 16384
    assert list(buckets_to(32768)) == sorted(set(buckets_to(32768)))


def test_each_batch_stays_within_its_size_and_comes_close_to_it() -> None:
    rng = random.Random(3)
    records = [_Record(rng.randint(200, 1500)) for _ in range(300)]
    for size in (2048, 5120, 16384):
        batches = cut_batches(records, size, 4, random.Random(size))
        assert len(batches) == 4
        for batch in batches:
            tokens = sum(r.num_tokens for r in batch)
            assert size - 1500 < tokens <= size
            assert len({id(r) for r in batch}) == len(batch)  # no record twice in one batch


class _CountingEngine:
    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def prepare(self, request: object) -> None:
        with self._lock:
            self.calls += 1
        time.sleep(0.0005)


def test_the_prepare_threads_stop_on_exit_and_count_every_call() -> None:
    engine = _CountingEngine()
    with Hog(engine, ["a", "b"], threads=2) as hog:
        deadline = time.monotonic() + 5.0
        while engine.calls < 20 and time.monotonic() < deadline:
            time.sleep(0.005)
    stopped_at = engine.calls
    time.sleep(0.02)
    assert engine.calls == stopped_at == hog.prepared >= 20
