"""The sm90 expert kernels' machine code (`engine/kernels/csrc/*.cu`), read from the SASS ptxas makes of them.

Two slow forms were found only by reading it (BENCHMARKS.md, "Engine, round thirteen"): a GPU-scope fence
before every stage release (`mbarrier.arrive.release.cluster`), and a dummy tensor-core product that ptxas
committed after each k step's group once the group's size was a run-time count, so that `wgmma.wait_group 1`
waited for the step's own products. These tests keep both out. They need a CUDA toolkit (nvcc and nvdisasm;
cuobjdump calls nvdisasm too), not a GPU; marked `gpu` because only the GPU machine has one (CI never runs
them).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from engine.kernels import moe_fp8_sm90

pytestmark = pytest.mark.gpu

KERNELS = ("moe_gate_up_fp8_sm90.cu", "moe_down_fp8_sm90.cu")
BUILDS = [(kernel, variant) for kernel in KERNELS for variant in (None, *moe_fp8_sm90.VARIANTS)]
"""Each kernel as `build` compiles it by default and as each variant."""


def _tool(name: str) -> str | None:
    """`name` on PATH, else in the bin folder of the toolkit torch's extension builder finds."""
    from torch.utils.cpp_extension import CUDA_HOME

    found = shutil.which(name)
    if found is None and CUDA_HOME:
        candidate = Path(CUDA_HOME) / "bin" / name
        found = str(candidate) if candidate.is_file() else None
    return found


@pytest.fixture(scope="module", params=BUILDS, ids=[f"{k.split('.')[0]}-{v or 'default'}" for k, v in BUILDS])
def compiled(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(ptxas's verbose log, the SASS listing) of one kernel source compiled with `build`'s nvcc flags (and
    the variant's flag)."""
    nvcc = _tool("nvcc")
    disasm = _tool("nvdisasm")
    if nvcc is None or disasm is None:
        pytest.skip("needs nvcc and nvdisasm (a CUDA toolkit)")
    kernel, variant = request.param
    source = moe_fp8_sm90.CSRC / kernel
    cubin = tmp_path_factory.mktemp("sass") / (source.stem + ".cubin")
    flags = moe_fp8_sm90.cuda_flags(variant)
    command = [nvcc, *flags, "-std=c++17", "-cubin", "-Xptxas", "-v", "-o", str(cubin)]
    built = subprocess.run([*command, str(source)], capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stderr
    listing = subprocess.run([disasm, "-c", str(cubin)], capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0, listing.stderr
    return built.stdout + built.stderr, listing.stdout


def _instructions(sass: str) -> list[str]:
    """The listing's instructions in order, without addresses and encodings."""
    return [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", sass)]


def test_the_only_gpu_scope_fences_are_the_cluster_barriers(compiled: tuple[str, str]) -> None:
    """Every `MEMBAR.ALL.GPU` belongs to a `barrier.cluster.arrive` (a `UCGABAR_ARV` follows it within a
    few instructions): none guards a stage release in a k loop."""
    code = _instructions(compiled[1])
    assert any("HGMMA" in i or "QGMMA" in i for i in code), "no tensor-core instruction in the listing"
    fences = [n for n, i in enumerate(code) if i.startswith("MEMBAR.ALL.GPU")]
    stray = [n for n in fences if not any("UCGABAR_ARV" in i for i in code[n + 1 : n + 5])]
    assert not stray, [code[max(n - 3, 0) : n + 4] for n in stray]


def test_every_k_step_commits_its_products_as_one_whole_group(compiled: tuple[str, str]) -> None:
    """No dummy product (a GMMA into RZ) and no ptxas notice that it injected wgmma fences or serialised
    the products (C7519, C7510): each step's `wait_group 1` waits for the previous step only (with
    early release, `wait_group 0` for the step's own, by design)."""
    log, sass = compiled
    code = _instructions(sass)
    dummies = [i for i in code if re.match(r"[HQIB]GMMA\.\S+ RZ,", i)]
    assert not dummies, dummies
    notices = [line for line in log.splitlines() if "C7519" in line or "C7510" in line]
    assert not notices, notices


def test_no_register_spills(compiled: tuple[str, str]) -> None:
    """The 128 accumulator registers per thread of each multiplier fit without spilling."""
    log = compiled[0]
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log
