"""`bench.batch_sizes`'s pure parts: the graph buckets of each set it compares and the batches it cuts."""

from __future__ import annotations

import random
from dataclasses import dataclass

from bench.batch_sizes import buckets_to, cut_batches
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
