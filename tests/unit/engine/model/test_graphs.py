"""The CUDA graphs' sizes (`engine.model.graphs`): which token buckets get graphs by default, the padding a
bucket's replay may add, and how many records a bucket's graphs hold. Pure functions: no GPU needed."""

from __future__ import annotations

import itertools

from engine.model.graphs import GRAPH_BUCKETS, RECORD_TOKENS, default_buckets, records_for


def test_the_default_buckets_reach_the_moderate_batches_and_stop_at_the_token_budget() -> None:
    assert default_buckets(65_536)[-1] == 8192  # a few records: what 70% of capacity batches hold
    assert default_buckets(65_536) == GRAPH_BUCKETS
    assert default_buckets(4096)[-1] == 4096
    assert default_buckets(6000)[-1] == 5632  # never a bucket over the budget
    assert default_buckets(100) == (512,)  # the smallest bucket always


def test_a_replay_pads_at_most_a_bounded_share_of_its_bucket() -> None:
    assert list(GRAPH_BUCKETS) == sorted(set(GRAPH_BUCKETS))
    for smaller, bucket in itertools.pairwise(GRAPH_BUCKETS):
        padding = bucket - smaller - 1  # one token over the smaller bucket replays this one
        assert padding <= (
            127 if bucket <= 1024 else 255 if bucket <= 2048 else 511 if bucket <= 6144 else 1023
        )


def test_large_buckets_hold_one_record_per_record_tokens_small_ones_the_floor() -> None:
    assert records_for(896, 16) == 16
    assert records_for(2048, 16) == 16
    assert records_for(4096, 16) == 16
    assert records_for(8192, 16) == 8192 // RECORD_TOKENS == 32
    assert records_for(512, 40) == 40
