"""`engine.kernels.tiles`: the shipped `tiles.json` is what the kernels launch with, and a malformed file is
refused naming the key."""

from __future__ import annotations

import copy
import json
from importlib import resources
from typing import Any

import pytest

from engine.kernels import attention, moe, moe_fp8, tiles


def _raw() -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(
        resources.files("engine.kernels").joinpath("tiles.json").read_text("utf-8")
    )
    return raw


def test_the_op_modules_launch_the_shipped_shapes() -> None:
    shipped = tiles.shipped()
    assert moe.SMALL is shipped.moe_small
    assert moe.LARGE is shipped.moe_large
    assert shipped.moe_large_from_rows_per_expert == moe.LARGE_FROM_ROWS_PER_EXPERT
    assert attention.TILES is shipped.attention
    raw = _raw()
    assert moe.SMALL.gate_up == tiles.Tiles(**raw["moe"]["small"]["gate_up"])
    assert moe.LARGE.down == tiles.Tiles(**raw["moe"]["large"]["down"])
    assert tiles.AttentionTiles(**raw["attention"]) == attention.TILES
    assert moe.LARGE.gate_up.tma  # optional flags are read ...
    assert not moe.SMALL.gate_up.tma  # ... and default to False


def test_tile_regime_switches_at_the_shipped_rows_per_expert() -> None:
    experts = 128
    edge = moe.LARGE_FROM_ROWS_PER_EXPERT * experts
    assert moe.tiles_for(edge - 1, experts) is moe.SMALL
    assert moe.tiles_for(edge, experts) is moe.LARGE


def test_the_fp8_gemms_switch_regime_each_at_its_shipped_rows_per_expert() -> None:
    shipped, experts = tiles.shipped(), 128
    assert moe_fp8.SMALL is shipped.moe_fp8_small
    assert moe_fp8.LARGE is shipped.moe_fp8_large
    gate_up_edge = shipped.moe_fp8_large_from_rows_per_expert * experts
    down_edge = shipped.moe_fp8_down_large_from_rows_per_expert * experts
    assert (gate_up_edge, down_edge) == (192 * experts, 768 * experts) == _fp8_edges(_raw(), experts)
    assert moe_fp8.tiles_for(gate_up_edge - 1, experts) is moe_fp8.SMALL
    assert moe_fp8.tiles_for(gate_up_edge, experts) is moe_fp8.LARGE
    assert moe_fp8.down_tiles_for(down_edge - 1, experts) is moe_fp8.SMALL
    assert moe_fp8.down_tiles_for(down_edge, experts) is moe_fp8.LARGE


def _fp8_edges(raw: dict[str, Any], experts: int) -> tuple[int, int]:
    f8 = raw["moe_fp8"]
    return f8["large_from_rows_per_expert"] * experts, f8["down_large_from_rows_per_expert"] * experts


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (
            ("moe", "small", "gate_up", "block_m"),
            0,
            r"moe\.small\.gate_up\.block_m must be a positive integer",
        ),
        (("moe", "large", "down", "tma"), 1, r"moe\.large\.down\.tma must be true or false"),
        (("attention", "group"), True, r"attention\.group must be a positive integer"),
        (
            ("moe", "large", "gate_up", "spare"),
            1,
            r"moe\.large\.gate_up: missing keys \[\], unknown keys \['spare'\]",
        ),
        (("moe", "large_from_rows_per_expert"), "192", r"moe\.large_from_rows_per_expert must be"),
        (
            ("moe_fp8", "down_large_from_rows_per_expert"),
            0,
            r"moe_fp8\.down_large_from_rows_per_expert must be a positive integer",
        ),
    ],
)
def test_a_malformed_file_is_refused_naming_the_key(
    path: tuple[str, ...], value: object, message: str
) -> None:
    raw = copy.deepcopy(_raw())
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ValueError, match=message):
        tiles.parse(raw)


def test_a_missing_entry_is_refused() -> None:
    raw = copy.deepcopy(_raw())
    del raw["moe"]["small"]["down"]
    with pytest.raises(ValueError, match=r"moe\.small: missing keys \['down'\]"):
        tiles.parse(raw)


def test_a_file_without_the_fp8_down_switch_is_refused() -> None:
    raw = copy.deepcopy(_raw())
    del raw["moe_fp8"]["down_large_from_rows_per_expert"]
    with pytest.raises(ValueError, match=r"moe_fp8: missing keys \['down_large_from_rows_per_expert'\]"):
        tiles.parse(raw)
