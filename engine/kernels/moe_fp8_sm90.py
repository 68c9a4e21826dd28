"""The FP8 expert block's two GEMMs as CUDA kernels for Hopper (sm_90a), for large batches.

`csrc/moe_gate_up_fp8_sm90.cu` and `csrc/moe_down_fp8_sm90.cu`: two CTAs of a cluster take one expert's two
128-row tiles and share its 256-row weight tile, each loading half of it through TMA and multicasting it to
both (Triton 3.6 cannot multicast: BENCHMARKS.md, "Engine, round twelve"). Warp-specialised pipelines: one
warpgroup loads (the gate/up kernel gathers the token rows with cp.async), two multiply with wgmma.

- `gate_up_fp8`: the outputs of `engine.kernels.moe_fp8.activations_fp8(..., row_pass=False)` with a
  128-channel scale group: (S, I) e4m3 and (S, I / 128) float32 scales, rows in expert order.
- `down_fp8`: `down_pairs_fp8(..., way="row_pass")` on row-scaled activations: (T k, H) bf16 in pair order.
- `experts_pairs_fp8`: the block, gate/up, the Triton requantising pass, down: the values of
  `engine.kernels.moe_fp8.experts_pairs_fp8` up to the gate/up epilogue's rounding.
- `experts_pairs_fp8_down`: the block with Triton's gate/up and row pass, then the CUDA down kernel.

Contract: `build` compiles the extension with torch's builder (nvcc and ninja needed; about half a minute)
into `build_dir` and returns it; the kernels take contiguous CUDA tensors on a Hopper GPU with H a multiple
of 256 and I of 128, no host sync, static grids (CUDA-graph capturable). `build_for` is the engine's
build (`EngineConfig.sm90_experts`, opt-in), which checks the GPU and the toolchain first; the engine then
runs both GEMMs of the expert calls `takes` accepts here (`experts_pairs_fp8`), and the down GEMM of those
`takes_down` accepts (`experts_pairs_fp8_down`). Measured by `bench.gate_up_sm90_probe`, `bench.fp8_modes
--sm90`, `bench.one_request --sm90`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Literal, Protocol, cast

import torch

from engine.kernels.fp8 import FP8, Fp8Experts, Quantized, quantize_rows
from engine.kernels.moe_fp8 import activations_fp8, requant_rows

CSRC = Path(__file__).parent / "csrc"
GROUP = 128
"""Channels per activation scale: half the gate/up kernel's 256 interleaved weight rows."""
SOURCES = ("moe_fp8_sm90_ext.cpp", "moe_gate_up_fp8_sm90.cu", "moe_down_fp8_sm90.cu")
CUDA_FLAGS = ("-O3", "-gencode=arch=compute_90a,code=sm_90a")
"""nvcc's flags for the kernels: an explicit -gencode keeps torch from adding sm_90 without the "a" features
(wgmma, setmaxnreg)."""
FROM_ROWS_PER_EXPERT = 1024
"""Average rows per expert from which `takes` hands both GEMMs of a call to these kernels: 16,384 tokens of
the full-size thinker (128 experts, 8 a token). On one H100 (BENCHMARKS.md, "Engine, round eighteen") the CUDA
gate/up kernel took more time than Triton's up to 8,192 tokens with uniform routing (one full-size layer) and
up to 12,809 with levelled routing in the engine (+7.0% at 3,222 tokens, +0.6% at 12,809), less at 16,384
(848.7 against 885.0 and 885.2 against 945.9 us) and 65,536 (uniform). Through the service at 70% load (about
3,000-token batches) both kernels from 64 rows an expert raised the p99."""


DOWN_FROM_ROWS_PER_EXPERT = 256
"""Average rows per expert from which `takes_down` hands a call's down GEMM alone to the CUDA kernel, after
Triton's gate/up and its row pass (4,096 tokens at full size). In the engine with levelled routing on one
H100 (`bench.one_request --sm90-from-rows 64`, BENCHMARKS.md "Engine, round eighteen") the CUDA down kernel
took 4.3% less time than Triton's at 4,816 tokens, 5.3% at 8,034 and 8.4% at 12,809, and the same at 3,222,
while the CUDA gate/up kernel took 6.4%, 4.4% and 0.6% more."""


class Sm90UnavailableError(RuntimeError):
    """The kernels cannot run here: not a Hopper GPU, or no nvcc or ninja to build them."""


def toolchain_problem() -> str | None:
    """What keeps `build` from compiling here (no nvcc on PATH or under CUDA_HOME, no ninja), or None. Reads
    the environment only."""
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None or not (Path(cpp_extension.CUDA_HOME) / "bin" / "nvcc").exists():
        return "no nvcc (the CUDA toolkit: put nvcc on PATH or set CUDA_HOME)"
    if not cpp_extension.is_ninja_available():
        return "no ninja on PATH"
    return None


def problem_for(device: torch.device) -> str | None:
    """Why the kernels cannot run for an engine on `device` (not a Hopper GPU: compute capability 9.0,
    which sm_90a code needs; no nvcc; no ninja), or None. Reads the environment and the device only."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return f"the sm90 expert kernels need a Hopper GPU; {device} is none"
    capability = torch.cuda.get_device_capability(device)
    if capability != (9, 0):
        name = f"{torch.cuda.get_device_name(device)} (sm_{capability[0]}{capability[1]})"
        return f"the sm90 expert kernels need a Hopper GPU (sm_90), not {name}"
    if problem := toolchain_problem():
        return f"cannot build the sm90 expert kernels: {problem}"
    return None


def build_for(device: torch.device, build_dir: Path | None = None) -> Extension:
    """The extension for the engine on `device` (blocking: half a minute to compile, a second to load an
    up-to-date build in `build_dir`; None: torch's per-user folder, not a shared temporary one whose build
    another user could have placed). Raises `Sm90UnavailableError` with `problem_for(device)`'s reason where
    it finds one."""
    if problem := problem_for(device):
        raise Sm90UnavailableError(problem)
    return build(build_dir)


def path_for(pairs: int, experts: int, hidden: int, inter: int) -> Literal["both", "down"] | None:
    """Which GEMMs of a call of `pairs` token-expert pairs over `experts` experts of these sizes run here:
    "both" (`experts_pairs_fp8`) from `FROM_ROWS_PER_EXPERT` rows an expert, "down" alone after Triton's
    gate/up (`experts_pairs_fp8_down`) from `DOWN_FROM_ROWS_PER_EXPERT`, else None (Triton's kernels; also
    for sizes the kernels do not take: H a multiple of 256, I of 128)."""
    if hidden % 256 or inter % GROUP:
        return None
    if pairs >= FROM_ROWS_PER_EXPERT * experts:
        return "both"
    return "down" if pairs >= DOWN_FROM_ROWS_PER_EXPERT * experts else None


def takes(pairs: int, experts: int, hidden: int, inter: int) -> bool:
    """Whether such a call runs both GEMMs here (`path_for` "both")."""
    return path_for(pairs, experts, hidden, inter) == "both"


def takes_down(pairs: int, experts: int, hidden: int, inter: int) -> bool:
    """Whether such a call runs its down GEMM here, alone or with the gate/up one (`path_for` not None)."""
    return path_for(pairs, experts, hidden, inter) is not None


class Extension(Protocol):
    """The compiled module's one function (`csrc/moe_fp8_sm90_ext.cpp`)."""

    def gate_up_fp8(
        self,
        x: torch.Tensor,
        x_scale: torch.Tensor,
        w: torch.Tensor,
        w_scale: torch.Tensor,
        order: torch.Tensor,
        counts: torch.Tensor,
        top_w: torch.Tensor,
        q: torch.Tensor,
        q_scale: torch.Tensor,
        clusters: int,
        solo: bool,
        ablate: int,
    ) -> None: ...

    def down_fp8(
        self,
        q: torch.Tensor,
        row_scale: torch.Tensor,
        w: torch.Tensor,
        w_scale: torch.Tensor,
        order: torch.Tensor,
        counts: torch.Tensor,
        y: torch.Tensor,
        clusters: int,
        solo: bool,
        ablate: int,
    ) -> None: ...

    def clusters_fit(self) -> tuple[int, int]: ...


VARIANTS = {
    "early_release": "-DCLEF_SM90_EARLY_RELEASE=1",
    "bulk_store": "-DCLEF_SM90_BULK_STORE=1",
    "pingpong": "-DCLEF_SM90_PINGPONG=1",
}
"""Pipeline variants the benches build beside the default, each by one nvcc flag, with the same functions and
outputs: `early_release` frees each stage as soon as its products are done (`kEarlyRelease`,
`csrc/sm90_common.cuh`); `bulk_store` has the down kernel store each output row from shared memory by one bulk
async copy instead of the multipliers' own stores (`kBulkStore`, `csrc/moe_down_fp8_sm90.cu`); `pingpong`
has each kernel's two multiplier warpgroups take alternate 64-row items, one's epilogue under the other's k
loop (`kPingPong`, `csrc/sm90_common.cuh`)."""
BUILD_DIR = Path(tempfile.gettempdir()) / "clef-sm90-ext"
"""Where the benches and the GPU tests build the extension (an up-to-date build there is loaded, not
rebuilt); the engine's build goes to torch's per-user folder (`build_for`)."""


def cuda_flags(variant: str | None = None) -> tuple[str, ...]:
    """nvcc's flags for the kernels as `build` compiles them (`CUDA_FLAGS`, plus the flag of `variant`, a key
    of `VARIANTS`)."""
    return (*CUDA_FLAGS, VARIANTS[variant]) if variant else CUDA_FLAGS


def build(build_dir: Path | None, *, verbose: bool = False, variant: str | None = None) -> Extension:
    """Compile (or reuse a build in `build_dir`) and load the extension for sm_90a. `build_dir` None: torch's
    own per-user folder for extensions (`TORCH_EXTENSIONS_DIR`, default under ~/.cache). `variant` (a key of
    `VARIANTS`, with a `build_dir`) builds that variant, a module of its own in `build_dir / variant` (same
    functions, same outputs; benches compare it with the default)."""
    from torch.utils import cpp_extension

    if build_dir is not None:
        if variant:
            build_dir = build_dir / variant
        build_dir.mkdir(parents=True, exist_ok=True)
    module = cpp_extension.load(
        name=f"clef_moe_fp8_sm90_{variant}" if variant else "clef_moe_fp8_sm90",
        sources=[str(CSRC / name) for name in SOURCES],
        extra_cflags=["-O3"],
        extra_cuda_cflags=list(cuda_flags(variant)),
        build_directory=None if build_dir is None else str(build_dir),
        verbose=verbose,
    )
    return cast(Extension, module)


def gate_up_fp8(
    ext: Extension,
    x: torch.Tensor,
    order: torch.Tensor,
    counts: torch.Tensor,
    top_w: torch.Tensor,
    q8: Fp8Experts,
    xq: Quantized | None = None,
    clusters: int = 0,
    solo: bool = False,
    ablate: int = 0,
) -> Quantized:
    """`activations_fp8(x, order, counts, top_w, q8, row_pass=False, xq=xq)` through the CUDA kernel: the
    same arguments (`order`, `counts` int32; `top_w` (T, k) float32), (S, I) e4m3 and (S, I / 128) scales.
    `clusters`: 0 runs as many two-CTA clusters as fit at once, each looping over its work items
    (persistent); N > 0 at most N (a large N: one cluster per item). `solo`: no clusters, twice as many lone
    CTAs each loading its whole weight tile (no multicast). `ablate` (benches; the results are then wrong): 1
    drops the tensor-core products, 2 the loads, 3 the epilogue (nothing is written)."""
    t = x.shape[0]
    inter = q8.gate_up.shape[1] // 2
    pairs = t * top_w.shape[1]
    act = torch.empty(pairs, inter, dtype=FP8, device=x.device)  # expert order
    act_s = torch.empty(pairs, inter // GROUP, dtype=torch.float32, device=x.device)
    if not t:
        return act, act_s
    xq_, xs = xq if xq is not None else quantize_rows(x)
    w, ws = q8.gate_up, q8.gate_up_scale
    ext.gate_up_fp8(xq_, xs, w, ws, order, counts, top_w, act, act_s, clusters, solo, ablate)
    return act, act_s


def down_fp8(
    ext: Extension,
    act: torch.Tensor,
    row_s: torch.Tensor,
    order: torch.Tensor,
    counts: torch.Tensor,
    q8: Fp8Experts,
    clusters: int = 0,
    solo: bool = False,
    ablate: int = 0,
) -> torch.Tensor:
    """`down_pairs_fp8(act, row_s, order, counts, q8, T, k, way="row_pass")` through the CUDA kernel: `act`
    (S, I) e4m3 in expert order with one scale per row `row_s` (S,) -> (S, H) bf16 in pair order.
    `clusters`, `solo` and `ablate` as `gate_up_fp8`'s."""
    y = torch.empty(act.shape[0], q8.down.shape[1], dtype=torch.bfloat16, device=act.device)
    ext.down_fp8(act, row_s, q8.down, q8.down_scale, order, counts, y, clusters, solo, ablate)
    return y


def experts_pairs_fp8(
    ext: Extension,
    x: torch.Tensor,
    order: torch.Tensor,
    counts: torch.Tensor,
    top_w: torch.Tensor,
    q8: Fp8Experts,
    xq: Quantized | None = None,
    clusters: int = 0,
    solo: bool = False,
) -> torch.Tensor:
    """`engine.kernels.moe_fp8.experts_pairs_fp8` (same arguments) with both GEMMs through the CUDA kernels
    and the Triton requantising pass between: (T k, H) bf16 in pair order. `clusters` and `solo` as
    `gate_up_fp8`'s."""
    act, act_s = gate_up_fp8(ext, x, order, counts, top_w, q8, xq, clusters, solo)
    return down_fp8(ext, act, requant_rows(act, act_s), order, counts, q8, clusters, solo)


def experts_pairs_fp8_down(
    ext: Extension,
    x: torch.Tensor,
    order: torch.Tensor,
    counts: torch.Tensor,
    top_w: torch.Tensor,
    q8: Fp8Experts,
    xq: Quantized | None = None,
) -> torch.Tensor:
    """`engine.kernels.moe_fp8.experts_pairs_fp8` (same arguments) with the Triton gate/up kernel and its
    row pass, then the CUDA down kernel: (T k, H) bf16 in pair order, the bytes of the Triton down kernel
    on the same rows ("row_pass"; the row ways give the same values)."""
    act, row_s = activations_fp8(x, order, counts, top_w, q8, row_pass=True, xq=xq)
    return down_fp8(ext, act, row_s, order, counts, q8)
