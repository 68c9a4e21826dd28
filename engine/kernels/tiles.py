"""Launch shapes of the Triton kernels: the types here, the tuned numbers in `tiles.json` beside this module.

`tiles.json` (package data) holds, per op, the shapes the GPU launches use:

    moe.small, moe.large             `MoeTiles`: the expert kernels' shapes for few / many rows per expert
    moe.large_from_rows_per_expert   average rows per expert from which `moe.large` is used
    moe_fp8.small, moe_fp8.large     the same for the FP8 expert kernels (`engine.kernels.moe_fp8`)
    moe_fp8.large_from_rows_per_expert, moe_fp8.down_large_from_rows_per_expert, moe_fp8.group
                                     the gate/up GEMM's regime switch, the down GEMM's own one, and the
                                     columns per activation scale (the down kernels' k step: their
                                     `block_k` must equal it); the FP8 gate/up kernel loads 2 x block_n
                                     weight rows a step (gate and up interleaved)
    attention                        `AttentionTiles` of the packed attention kernel

The MoE shapes are chosen by `bench.moe_kernels` (BENCHMARKS.md, "Engine, round three"; FP8:
`bench.moe_fp8`, "Engine, round six"), the attention shape by `bench.moe_kernels --packed-attention-only`
("Engine, round four"). `shipped()` reads the file once per process and checks every key and type; a
malformed file raises ValueError at import of the op modules, before any kernel launches.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

DATA_FILE = "tiles.json"


@dataclass(frozen=True, slots=True)
class Tiles:
    """One expert kernel's launch shape: rows, output columns and reduction step per program, warps and
    pipelining stages."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    tma: bool = False
    """Weights (and the down projection's activations) through TMA descriptors instead of pointer loads."""
    ws: bool = False
    """Triton's automatic warp specialisation of the k-loop (with `tma` only)."""


@dataclass(frozen=True, slots=True)
class MoeTiles:
    """Launch shapes of the two expert kernels for one regime."""

    gate_up: Tiles
    down: Tiles


@dataclass(frozen=True, slots=True)
class AttentionTiles:
    """Query rows and key rows per step of one program, warps, software-pipelining stages, and how many
    query heads of one kv head share a program's rows (`block_m / group` tokens each; fewer when a kv head
    has fewer query heads: the greatest common divisor)."""

    block_m: int
    block_n: int
    warps: int
    stages: int
    group: int = 1


@dataclass(frozen=True, slots=True)
class ShippedTiles:
    """The contents of `tiles.json`."""

    moe_small: MoeTiles
    moe_large: MoeTiles
    moe_large_from_rows_per_expert: int
    attention: AttentionTiles
    moe_fp8_small: MoeTiles
    moe_fp8_large: MoeTiles
    moe_fp8_large_from_rows_per_expert: int
    moe_fp8_down_large_from_rows_per_expert: int
    moe_fp8_group: int


def _object(
    raw: object, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> dict[str, object]:
    # A JSON object with every `required` key, perhaps some `optional` ones, and nothing else.
    if not isinstance(raw, dict):
        raise ValueError(f"{DATA_FILE}: {where} must be an object")
    missing = [k for k in required if k not in raw]
    unknown = sorted(set(raw) - set(required) - set(optional))
    if missing or unknown:
        raise ValueError(f"{DATA_FILE}: {where}: missing keys {missing}, unknown keys {unknown}")
    return raw


def _positive(d: Mapping[str, object], key: str, where: str) -> int:
    value = d[key]
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{DATA_FILE}: {where}.{key} must be a positive integer, got {value!r}")
    return value


def _flag(d: Mapping[str, object], key: str, where: str) -> bool:
    value = d.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"{DATA_FILE}: {where}.{key} must be true or false, got {value!r}")
    return value


def _tiles(raw: object, where: str) -> Tiles:
    d = _object(raw, where, ("block_m", "block_n", "block_k", "warps", "stages"), ("tma", "ws"))
    return Tiles(
        block_m=_positive(d, "block_m", where),
        block_n=_positive(d, "block_n", where),
        block_k=_positive(d, "block_k", where),
        warps=_positive(d, "warps", where),
        stages=_positive(d, "stages", where),
        tma=_flag(d, "tma", where),
        ws=_flag(d, "ws", where),
    )


def _moe_tiles(raw: object, where: str) -> MoeTiles:
    d = _object(raw, where, ("gate_up", "down"))
    return MoeTiles(_tiles(d["gate_up"], f"{where}.gate_up"), _tiles(d["down"], f"{where}.down"))


def parse(raw: object) -> ShippedTiles:
    """The shapes of a decoded `tiles.json`. Raises ValueError naming the first key that is wrong."""
    top = _object(raw, "the file", ("moe", "attention", "moe_fp8"))
    moe = _object(top["moe"], "moe", ("small", "large", "large_from_rows_per_expert"))
    att = _object(top["attention"], "attention", ("block_m", "block_n", "warps", "stages", "group"))
    f8_keys = ("small", "large", "large_from_rows_per_expert", "down_large_from_rows_per_expert", "group")
    f8 = _object(top["moe_fp8"], "moe_fp8", f8_keys)
    f8_small, f8_large = _moe_tiles(f8["small"], "moe_fp8.small"), _moe_tiles(f8["large"], "moe_fp8.large")
    group = _positive(f8, "group", "moe_fp8")
    for name, regime in (("small", f8_small), ("large", f8_large)):
        if regime.down.block_k != group or regime.gate_up.block_n % group:
            raise ValueError(
                f"{DATA_FILE}: moe_fp8.{name}: down.block_k must equal moe_fp8.group and gate_up.block_n "
                "be a multiple of it"
            )
    return ShippedTiles(
        moe_small=_moe_tiles(moe["small"], "moe.small"),
        moe_large=_moe_tiles(moe["large"], "moe.large"),
        moe_large_from_rows_per_expert=_positive(moe, "large_from_rows_per_expert", "moe"),
        attention=AttentionTiles(
            block_m=_positive(att, "block_m", "attention"),
            block_n=_positive(att, "block_n", "attention"),
            warps=_positive(att, "warps", "attention"),
            stages=_positive(att, "stages", "attention"),
            group=_positive(att, "group", "attention"),
        ),
        moe_fp8_small=f8_small,
        moe_fp8_large=f8_large,
        moe_fp8_large_from_rows_per_expert=_positive(f8, "large_from_rows_per_expert", "moe_fp8"),
        moe_fp8_down_large_from_rows_per_expert=_positive(f8, "down_large_from_rows_per_expert", "moe_fp8"),
        moe_fp8_group=group,
    )


@functools.cache
def shipped() -> ShippedTiles:
    """The shapes in the installed `tiles.json`, read once (blocking file read on the first call)."""
    text = resources.files("engine.kernels").joinpath(DATA_FILE).read_text(encoding="utf-8")
    return parse(json.loads(text))
