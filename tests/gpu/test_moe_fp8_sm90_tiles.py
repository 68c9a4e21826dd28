"""The sm90 expert kernels' work-item lookup (`find_tile`, `engine/kernels/csrc/sm90_common.cuh`) on the host.

Each kernel builds a table of every expert's pair tiles (256 sorted rows each; 128 in the down kernel's
ping-pong variant) in shared memory and finds a work item's tile by a binary search of it. The search is
compiled here as host code by nvcc, for both sizes, and checked, over row counts with empty experts at the
start, middle and end and experts of several tiles, against the tiles listed directly from the counts. Needs
nvcc (a CUDA toolkit), not a GPU; marked `gpu` as the SASS tests are, since only the GPU machine has one (CI
never runs them). nvcc links its static CUDA runtime, from the toolkit or from the wheels torch brings (no
device is opened).
"""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

from engine.kernels import moe_fp8_sm90

pytestmark = pytest.mark.gpu

PAIR_ROWS = (256, 128)
"""Sorted rows of one expert per pair tile: two CTAs of `kBlockM` (128) rows, or of 64 (the down kernel's
ping-pong variant)."""

# Built with -DPAIR_ROWS=N. Reads E and E counts; fills the table in expert order (tile_end a running sum,
# rows contiguous); prints, for every p from 0 to two past the last tile, find_tile's expert, first, end row.
DRIVER = r"""
#include <cstdio>
#include "sm90_common.cuh"

int main() {
    static clef::TileTable tab;
    int experts = 0;
    if (std::scanf("%d", &experts) != 1 || experts > clef::kMaxExperts) return 2;
    int tiles = 0, rows = 0;
    for (int e = 0; e < experts; ++e) {
        int c = 0;
        if (std::scanf("%d", &c) != 1) return 2;
        tiles += (c + PAIR_ROWS - 1) / PAIR_ROWS;
        tab.row_begin[e] = rows;
        rows += c;
        tab.row_end[e] = rows;
        tab.tile_end[e] = tiles;
    }
    for (int p = 0; p < tiles + 2; ++p) {
        const clef::Tile t = clef::find_tile<PAIR_ROWS>(tab, experts, p);
        std::printf("%d %d %d\n", t.expert, t.row0, t.row_end);
    }
    return 0;
}
"""


def _cudart_dirs() -> list[Path]:
    """Folders holding `libcudart_static.a` beyond nvcc's own: the toolkit torch finds, the wheels torch
    brings (a toolkit from wheels has nvcc without its runtime)."""
    import importlib.util

    import torch.utils.cpp_extension as ext

    candidates = [Path(ext.CUDA_HOME) / "lib64"] if ext.CUDA_HOME else []
    spec = importlib.util.find_spec("nvidia")
    if spec is not None and spec.submodule_search_locations is not None:
        candidates += [Path(p) / "cu13" / "lib" for p in spec.submodule_search_locations]
    return [d for d in candidates if (d / "libcudart_static.a").is_file()]


@pytest.fixture(scope="module", params=PAIR_ROWS, ids=lambda rows: f"pair-{rows}")
def driver(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """The driver built for one pair-tile size, and that size."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc (a CUDA toolkit)")
    folder = tmp_path_factory.mktemp("tiles")
    source = folder / "tiles.cu"
    source.write_text(DRIVER)
    binary = folder / "tiles"
    libs = [f"-L{d}" for d in _cudart_dirs()]
    rows = int(request.param)
    define = f"-DPAIR_ROWS={rows}"
    command = [
        nvcc,
        "-std=c++17",
        define,
        *libs,
        "-I",
        str(moe_fp8_sm90.CSRC),
        "-o",
        str(binary),
        str(source),
    ]
    built = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stderr
    return binary, rows


def _expected(counts: list[int], pair_rows: int) -> list[tuple[int, int, int]]:
    """Every pair tile in order as (expert, first row, the expert's end row), then past the last one twice
    (expert = E, rows 0)."""
    out: list[tuple[int, int, int]] = []
    begin = 0
    for e, c in enumerate(counts):
        out += [(e, begin + i * pair_rows, begin + c) for i in range(-(-c // pair_rows))]
        begin += c
    return out + [(len(counts), 0, 0)] * 2


def _cases() -> list[list[int]]:
    rng = random.Random(7)
    cases = [
        [0, 5, 0, 300, 0],  # empty first, middle and last; one expert of two tiles
        [256, 257, 1, 512, 0, 0, 0, 1],  # exactly one tile, one row over, the last expert alone
        [0] * 63 + [1000],  # only the last of 64 experts has rows (four tiles)
        [800] + [0] * 127,  # only the first of 128
    ]
    cases += [[rng.choice([0, 0, 1, 50, 192, 255, 256, 600]) for _ in range(n)] for n in (8, 33, 128, 256)]
    return cases


@pytest.mark.parametrize("counts", _cases(), ids=lambda c: f"{len(c)}-experts")
def test_find_tile_gives_every_pair_tile_in_order_then_past_the_last(
    driver: tuple[Path, int], counts: list[int]
) -> None:
    binary, pair_rows = driver
    stdin = f"{len(counts)} {' '.join(map(str, counts))}\n"
    ran = subprocess.run([str(binary)], input=stdin, capture_output=True, text=True, timeout=60, check=False)
    assert ran.returncode == 0, ran.stderr
    got = [tuple(int(v) for v in line.split()) for line in ran.stdout.splitlines()]
    assert got == _expected(counts, pair_rows)
