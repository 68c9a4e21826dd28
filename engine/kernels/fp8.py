"""Opt-in FP8 expert mode: e4m3 expert weights with per-output-channel scales, FP8 grouped GEMMs on Hopper.

The release is bf16; this mode quantises the MoE experts' weights once when the fast path is enabled
(`ClefOmniModel.enable_fast_path(fp8_experts=True)`), and each forward quantises the activations that feed
the two expert GEMMs per row (one scale per token, dynamic). The GEMMs then read half the weight bytes
(what bounds a lone request) and run on the FP8 tensor cores (what bounds a large batch):

    x (T, H) bf16 --row quant--> (T, H) e4m3 + (T,) scale --gather--> (S, H) e4m3   [S = T * k pairs]
    gate_up: (S, H) x (E, H, 2I) e4m3, scales (S,) x (E, 2I) -> (S, 2I) bf16, gate and up interleaved
    silu(gate) * up * routing weight --row quant--> (S, I) e4m3 + (S,) scale
    down:    (S, I) x (E, I, H) e4m3, scales (S,) x (E, H)   -> (S, H) bf16

The attention projections may run in e4m3 too (`Fp8Linear`, `linear_fp8`; opt-in apart from the experts,
`ClefOmniModel.enable_fast_path(fp8_attention=True)`): the fused QKV and the output projection, weights
per output channel, activations per row, through torch's row-wise scaled GEMM on Hopper:

    x (T, K) bf16 --row quant--> (T, K) e4m3 + (T,) scale;  (T, K) x (K, N) e4m3 -> (T, N) bf16

The attention itself, norms, the router and the head stay bf16. Answers drift from bf16 by quantisation error
(BENCHMARKS.md, "FP8 experts"); batch invariance holds as in bf16, because every scale is per row or per
channel and so never depends on the other records of a batch.

Contract: `quantize_experts` and the GEMM need CUDA with compute capability 9.0 (Hopper) for the fused
kernels (the activations' quantisation kernels are in `engine.kernels.fp8_triton`); on CPU the same
arithmetic runs in float32 (tests). Nothing here allocates per call beyond the outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

try:  # Triton ships with CUDA builds of torch; CPU-only installs fall back to PyTorch.
    import triton

    from engine.kernels.fp8_triton import _row_quant_fp8_kernel, _swiglu_fp8_kernel

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_TRITON = False

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448.0


@dataclass(frozen=True, slots=True)
class Fp8Experts:
    """One MoE layer's experts in e4m3: weights stored (E, N, K) row-major, so (E, K, N) transposed is the
    column-major right operand the grouped GEMM wants; scales are float32 per expert and output channel.

    `gate_up`'s rows interleave the two projections, unlike transformers' (E, 2I, H) with the gate rows
    first: row 2 n is gate channel n and row 2 n + 1 up channel n (`interleave_gate_up`), and its scales
    likewise. The fused gate/up kernel then takes a tile's gate and up columns in one tensor-core product
    of twice the width, which reads the activation tile once instead of twice (`bench.gate_up_il`)."""

    gate_up: torch.Tensor  # (E, 2I, H) e4m3, rows interleaved: 2n gate n, 2n + 1 up n
    gate_up_scale: torch.Tensor  # (E, 2I) float32, interleaved as gate_up's rows
    down: torch.Tensor  # (E, H, I) e4m3
    down_scale: torch.Tensor  # (E, H) float32

    @property
    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for t in (self.gate_up, self.gate_up_scale, self.down, self.down_scale)
        )


@dataclass(frozen=True, slots=True)
class Fp8Linear:
    """One dense projection in e4m3: `weight` (N, K) row-major (its transpose is the column-major right
    operand of `torch._scaled_mm`), `scale` (N,) float32 per output channel, `bias` (N,) or None."""

    weight: torch.Tensor  # (N, K) e4m3
    scale: torch.Tensor  # (N,) float32
    bias: torch.Tensor | None

    @property
    def nbytes(self) -> int:
        tensors = (self.weight, self.scale) if self.bias is None else (self.weight, self.scale, self.bias)
        return sum(t.numel() * t.element_size() for t in tensors)


def linear_supported(out_features: int, in_features: int) -> bool:
    """Whether `linear_fp8` takes this shape: the scaled GEMM wants both sizes in multiples of 16."""
    return out_features % 16 == 0 and in_features % 16 == 0


def quantize_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Fp8Linear:
    """(N, K) weights (and an optional (N,) bias, kept as is) -> `Fp8Linear`. Blocking."""
    q, s = quantize_weight(weight[None])
    return Fp8Linear(q[0].contiguous(), s[0].contiguous(), bias)


def linear_fp8(x: torch.Tensor | None, w: Fp8Linear, xq: Quantized | None = None) -> torch.Tensor:
    """x (T, K) times `w` -> (T, N) in x's dtype (bf16 on CUDA): x quantised per row (dynamic,
    `quantize_rows`, or `xq` when the caller has those already; x may then be None, and the result is
    bf16), one e4m3 GEMM scaled by the row and channel scales (`torch._scaled_mm`, row-wise, on CUDA; the
    float32 twin of the same arithmetic on CPU), then the bias. Every scale belongs to one row or one
    channel, so a row's result does not depend on the other rows beyond the GEMM's accumulation order.
    Raises ValueError when both x and xq are None."""
    if xq is None:
        if x is None:
            raise ValueError("linear_fp8 needs the rows x or their quantised form xq")
        xq = quantize_rows(x)
    xq_, xs = xq  # (T, K) e4m3, (T,)
    dtype = x.dtype if x is not None else torch.bfloat16
    t, n = xq_.shape[0], w.weight.shape[0]
    if not t:
        return xq_.new_empty(0, n, dtype=dtype)
    if xq_.is_cuda:
        out: torch.Tensor = torch._scaled_mm(
            xq_,
            w.weight.t(),
            scale_a=xs[:, None],
            scale_b=w.scale[None, :],
            out_dtype=torch.bfloat16,
            use_fast_accum=True,
        )
    else:
        xf = xq_.float() * xs[:, None]  # (T, K)
        out = (xf @ (w.weight.float() * w.scale[:, None]).T).to(dtype)  # (T, N)
    if w.bias is not None:
        out = out + w.bias
    return out


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E, N, K) weights -> (E, N, K) e4m3 and (E, N) float32 scales (amax over K / 448)."""
    scale = w.float().abs().amax(dim=-1).clamp_min(1e-12) / FP8_MAX  # (E, N)
    q = (w.float() / scale[..., None]).to(FP8)  # (E, N, K)
    return q, scale


def interleave_gate_up(t: torch.Tensor) -> torch.Tensor:
    """(E, 2I, ...) with the I gate rows first, then the I up rows -> the same rows interleaved (row 2 n
    gate n, row 2 n + 1 up n), contiguous."""
    e, two_i = t.shape[:2]
    return t.reshape(e, 2, two_i // 2, *t.shape[2:]).transpose(1, 2).reshape(t.shape).contiguous()


def quantize_experts(gate_up_proj: torch.Tensor, down_proj: torch.Tensor) -> Fp8Experts:
    """Quantise one layer: `gate_up_proj` (E, 2I, H) and `down_proj` (E, H, I), as transformers stores them;
    the result's gate/up rows are interleaved (`Fp8Experts`).

    Blocking; runs one expert at a time so the float32 temporaries stay small (a few MB at full size).
    """
    parts: list[list[torch.Tensor]] = [[], [], [], []]
    for e in range(gate_up_proj.shape[0]):
        for j, w in enumerate((interleave_gate_up(gate_up_proj[e : e + 1]), down_proj[e : e + 1])):
            q, s = quantize_weight(w)
            parts[2 * j].append(q)
            parts[2 * j + 1].append(s)
    gu, gus, dn, dns = (torch.cat(p) for p in parts)
    return Fp8Experts(gu.contiguous(), gus.contiguous(), dn.contiguous(), dns.contiguous())


Quantized = tuple[torch.Tensor, torch.Tensor]
"""Rows in e4m3 and their float32 scales, one per row: ((R, K), (R,)), as `quantize_rows` returns them."""


def quantize_rows(x: torch.Tensor) -> Quantized:
    """(R, K) -> (R, K) e4m3 and (R,) float32 scales, one per row (dynamic, amax / 448)."""
    if HAVE_TRITON and x.is_cuda:
        return _quantize_rows_triton(x)
    xf = x.float()
    scale = xf.abs().amax(dim=-1).clamp_min(1e-12) / FP8_MAX  # (R,)
    return (xf / scale[:, None]).to(FP8), scale


def swiglu_quantized(h: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """silu(gate) * up * w for (S, 2I) rows and (S,) weights, quantised per row: (S, I) e4m3, (S,) scales.
    h's columns interleave gate and up (2 n gate n, 2 n + 1 up n), as a GEMM with `Fp8Experts.gate_up`
    writes them."""
    if HAVE_TRITON and h.is_cuda:
        return _swiglu_quantized_triton(h, w)
    gate, up = h.float()[:, 0::2], h.float()[:, 1::2]
    a = torch.nn.functional.silu(gate) * up * w.float()[:, None]  # (S, I) float32
    scale = a.abs().amax(dim=-1).clamp_min(1e-12) / FP8_MAX
    return (a / scale[:, None]).to(FP8), scale


def _quantize_rows_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # `quantize_rows` in one launch of grid (R,).
    r, n = x.shape
    q = torch.empty(r, n, dtype=FP8, device=x.device)  # (R, K)
    s = torch.empty(r, dtype=torch.float32, device=x.device)  # (R,)
    if r:
        _row_quant_fp8_kernel[(r,)](
            x.contiguous(), q, s, n=n, block=triton.next_power_of_2(n), fp8_max=FP8_MAX, num_warps=4
        )
    return q, s


def _swiglu_quantized_triton(h: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # `swiglu_quantized` in one launch of grid (S,).
    s_rows, two_i = h.shape
    inter = two_i // 2
    q = torch.empty(s_rows, inter, dtype=FP8, device=h.device)  # (S, I)
    s = torch.empty(s_rows, dtype=torch.float32, device=h.device)  # (S,)
    if s_rows:
        _swiglu_fp8_kernel[(s_rows,)](
            h,
            w.contiguous(),
            q,
            s,
            inter=inter,
            block=triton.next_power_of_2(inter),
            fp8_max=FP8_MAX,
            num_warps=4,
        )
    return q, s


def gather_rows(q: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """q[index] for an e4m3 (R, K) tensor (gathered as bytes: index_select has no float8 kernels)."""
    return q.view(torch.uint8).index_select(0, index).view(FP8)


def grouped_mm(
    a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, offs: torch.Tensor
) -> torch.Tensor:
    """(S, K) e4m3 rows grouped by `offs` (E,) times per-group weights `w` (E, N, K) e4m3 -> (S, N) bf16,
    scaled by `a_scale` (S,) and `w_scale` (E, N)."""
    if a.is_cuda:
        out: torch.Tensor = torch._scaled_grouped_mm(
            a, w.transpose(-2, -1), a_scale, w_scale, offs=offs, out_dtype=torch.bfloat16, use_fast_accum=True
        )
        return out
    rows = []
    start = 0
    for e, end in enumerate(offs.tolist()):
        seg = a[start:end].float() * a_scale[start:end, None]  # (n, K)
        rows.append(seg @ (w[e].float() * w_scale[e][:, None]).T)  # (n, N)
        start = end
    return torch.cat(rows).to(torch.bfloat16)
