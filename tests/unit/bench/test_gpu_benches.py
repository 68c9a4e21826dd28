"""The GPU-only benchmarks import on a CPU machine and their sweep tables are well-formed (they run on
the H200 only; see BENCHMARKS.md)."""

from __future__ import annotations

import importlib

import pytest

from bench import moe_kernels
from engine.kernels import moe
from engine.kernels.tiles import Tiles


@pytest.mark.parametrize(
    "module",
    [
        "bench.cuda_ext_probe",
        "bench.experts",
        "bench.fp8_down_probe",
        "bench.fp8_gemm_probe",
        "bench.head_probe",
        "bench.moe_glue",
        "bench.moe_kernels",
        "bench.one_request",
    ],
)
def test_gpu_bench_modules_import_without_a_gpu(module: str) -> None:
    assert callable(importlib.import_module(module).main)


@pytest.mark.parametrize("kind", ["gate_up", "down"])
def test_sweep_candidates_fit_the_layer_and_hopper_shared_memory(kind: str) -> None:
    shipped = (
        {moe.SMALL.gate_up, moe.LARGE.gate_up} if kind == "gate_up" else {moe.SMALL.down, moe.LARGE.down}
    )
    tiles = moe_kernels.candidates(kind)
    assert shipped <= set(tiles)  # the shipped shapes are among those the sweep measures
    n_dim = moe_kernels.INTER if kind == "gate_up" else moe_kernels.HIDDEN
    for t in tiles:
        assert n_dim % t.block_n == 0
        b_cols = 2 * t.block_n if kind == "gate_up" else t.block_n
        assert t.stages * (t.block_m * t.block_k + b_cols * t.block_k) * 2 <= 227 * 1024
        assert not t.ws or t.tma


def test_sweep_sizes_match_the_regimes() -> None:
    narrow, wide = Tiles(64, 64, 64, 4, 4), Tiles(128, 128, 64, 8, 3)
    assert moe_kernels.useful(narrow, 800)
    assert not moe_kernels.useful(wide, 800)
    assert moe_kernels.useful(wide, 65536)
    assert not moe_kernels.useful(narrow, 65536)
