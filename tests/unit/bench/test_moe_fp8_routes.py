"""`bench.moe_fp8 --routes`: the routing profiles `bench.one_request` writes (`bench.routing.load_profiles`,
on a small random release on the CPU) and how the kernel bench picks and runs them."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest

from bench.level_release import load_engine
from bench.moe_fp8 import chosen_profiles, layered
from bench.routing import load_profiles, probe_batch
from tests.support.small_release import write_small_release


@pytest.mark.slow
def test_load_profiles_count_every_tokens_k_choices_per_layer(tmp_path: Path) -> None:
    engine = load_engine(write_small_release(tmp_path / "r").path, "cpu")  # 3 MoE layers, 8 experts, top 2
    batch = probe_batch(engine, records=4, tokens=64)
    tokens = int(batch.input_ids.numel())
    profiles = load_profiles(engine, batch)
    assert [len(p) for p in profiles] == [8, 8, 8]
    assert [sum(p) for p in profiles] == [2 * tokens] * 3
    assert all(min(p) >= 0 for p in profiles)


def test_chosen_profiles_spread_from_the_most_even_layer_to_the_least(tmp_path: Path) -> None:
    layers = [[5, 5, 6, 8], [9, 3, 6, 6], [4, 4, 4, 12], [6, 6, 6, 6], [7, 7, 5, 5]]
    path = tmp_path / "routes.json"
    path.write_text(json.dumps({"levelled": True, "pairs": 24, "layers": layers}))
    assert chosen_profiles(path, 3) == [[6, 6, 6, 6], [5, 5, 6, 8], [4, 4, 4, 12]]
    assert chosen_profiles(path, 1) == [[5, 5, 6, 8]]  # the median layer by its busiest expert
    assert chosen_profiles(path, 9) == sorted(layers, key=max)  # no more than the file has
    assert chosen_profiles(None, 4) == [None]  # uniform routing


def test_layered_runs_every_call_with_the_same_keywords_and_returns_the_last() -> None:
    seen: list[tuple[str, object]] = []

    def call(name: str, tiles: object = None) -> str:
        seen.append((name, tiles))
        return name

    out = layered([partial(call, "a"), partial(call, "b"), partial(call, "c")], tiles="T")
    assert out == "c"
    assert seen == [("a", "T"), ("b", "T"), ("c", "T")]
