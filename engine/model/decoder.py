"""Padding-free forward of the Qwen3-Omni thinker's text decoder over packed records (GPU fast path).

The transformers implementation runs a padded `(batch, length)` layout through generic modules. Here
every record of a batch is concatenated into one token axis `T` and attention is causal within each
record (`engine.kernels.attention`, one Triton kernel over cumulative sequence offsets), so no token ever
attends outside its own record and no compute is spent on padding. `triton_attention = False` runs
torch's variable-length FlashAttention 2 instead (`torch.nn.attention.varlen.varlen_attn`; benchmarks).
The MoE block routes all `T * k` token-expert pairs of the batch through two fused Triton GEMMs
(`engine.kernels.moe`; bf16), or through CUTLASS grouped GEMMs (`torch.nn.functional.grouped_mm`) in FP8 mode
and when `fused_experts` is off. Around them, per MoE layer: the router GEMM, `elementwise.route_topk`, one
counting sort grouping the pairs by expert (`elementwise.group_by_expert`), and the per-token sum of the k
expert outputs folded into the residual add and the next RMSNorm (`elementwise.add_pairs_rms_norm`).

The module holds no weights of its own: it reads the parameters of an existing
`Qwen3OmniMoeThinkerTextModel`, so the strict loader stays the single source of truth. Fused QKV weights
are built once at construction (an extra copy of the attention projections, about 1 GB at full size).

Contract: `forward(...)` must be called under `torch.inference_mode()` on CUDA; it does not support
training, KV caches or sliding windows. Records are independent: the result for a record does not depend
on the other records of the pack beyond floating-point rounding in shared GEMMs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from engine.kernels import attention, elementwise, moe
from engine.kernels import fp8 as fp8_mode


def varlen_available() -> bool:
    """Whether this torch build offers variable-length FlashAttention."""
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return hasattr(F, "grouped_mm") or hasattr(torch, "_grouped_mm")


def _grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """(S, K) rows grouped by `offs` times per-group (G, K, N) -> (S, N)."""
    if hasattr(F, "grouped_mm"):
        return F.grouped_mm(a, b, offs=offs)
    return torch._grouped_mm(a, b, offs=offs)


@dataclass(frozen=True, slots=True)
class PackedInputs:
    """One packed batch on the device.

    `inputs_embeds` (T, hidden); `position_ids` (3, T) multimodal rope positions (identical rows for text);
    `cu_seqlens` (N+1,) int32 record boundaries; `max_seqlen` the longest record (text
    only: media batches take transformers' path, `engine.model.media`).
    """

    inputs_embeds: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int


_rms_norm = elementwise.rms_norm_reference


class PackedTextDecoder:
    """Runs a transformers Qwen3-Omni thinker text model's layers over a packed token axis."""

    def __init__(self, text_model: Any, layers_ahead: int = 3) -> None:
        # Not an nn.Module itself: the text model's parameters stay registered once, in the thinker.
        self.text_model: Any = text_model
        self.layers_ahead = layers_ahead
        cfg: Any = text_model.config
        self.num_heads: int = cfg.num_attention_heads
        self.num_kv_heads: int = cfg.num_key_value_heads
        self.head_dim: int = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps: float = cfg.rms_norm_eps
        self.top_k: int = getattr(cfg, "num_experts_per_tok", 0)
        self.norm_topk: bool = bool(getattr(cfg, "norm_topk_prob", True))
        self._qkv: list[torch.Tensor] = []
        self._fp8: list[fp8_mode.Fp8Experts | None] = []  # per layer, filled by `use_fp8_experts`
        self._fp8_on = False
        self.triton_attention = True
        """Attention through `engine.kernels.attention`'s Triton kernel (False: torch's varlen FlashAttention
        2, kept for comparison in `bench.experts`). Recapture graphs after switching."""
        self.fused_experts = True
        """bf16 experts through `engine.kernels.moe`'s fused Triton kernels (False: gather + CUTLASS grouped
        GEMMs +
        SwiGLU + combine, kept for comparison in `bench.experts`). Recapture graphs after switching."""
        for layer in text_model.layers:
            att = layer.self_attn
            w = torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight], dim=0)
            self._qkv.append(w)  # (q + 2 kv, hidden)

    def _attention(
        self, i: int, layer: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, p: PackedInputs
    ) -> torch.Tensor:
        from torch.nn.attention.varlen import varlen_attn

        att = layer.self_attn
        t = x.shape[0]
        hq, hk, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = F.linear(x, self._qkv[i])  # (T, (hq + 2 hk) d)
        qn, kn = att.q_norm.weight, att.k_norm.weight
        q, k, v = elementwise.qk_norm_rope(qkv, qn, kn, cos, sin, hq, hk, self.eps)
        if x.is_cuda and not (self.triton_attention and attention.supported(d)):
            got = varlen_attn(
                q, k, v, p.cu_seqlens, p.cu_seqlens, p.max_seqlen, p.max_seqlen, window_size=(-1, 0)
            )  # (T, hq, d)
            assert isinstance(got, torch.Tensor)
            out = got
        else:  # the Triton kernel on CUDA, one SDPA call per record on CPU
            out = attention.attention(q, k, v, p.cu_seqlens, p.max_seqlen)  # (T, hq, d)
        return att.o_proj(out.reshape(t, hq * d))  # type: ignore[no-any-return]

    def use_fp8_experts(self, on: bool = True) -> int:
        """Run the experts in FP8 (`on`) or bf16 from the next forward on (see `engine.kernels.fp8`).

        The first call with `on` quantises every MoE layer's experts to e4m3 (blocking, a few seconds at
        full size); the copies are kept, so switching back and forth is free. The bf16 weights stay, for
        the transformers path (media batches). CUDA graphs captured before a switch replay the old mode:
        recapture them (`ClefOmniModel.enable_fast_path` does). Returns the bytes the FP8 copies take.
        """
        self._fp8_on = on
        if on and not self._fp8:
            with torch.inference_mode():
                self._fp8 = [
                    fp8_mode.quantize_experts(layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj)
                    if hasattr(layer.mlp, "experts")
                    else None
                    for layer in self.text_model.layers
                ]
        return sum(q.nbytes for q in self._fp8 if q is not None)

    def _moe(self, i: int, mlp: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The experts' outputs for `x` (T, hidden), not yet summed per token
        (`elementwise.add_pairs_rms_norm`
        sums them into the residual): (T k, hidden) in pair order and None from the fused Triton experts,
        else (S, hidden) in expert order and the (T k,) slot of each pair in it."""
        experts = mlp.experts
        num_experts = experts.gate_up_proj.shape[0]
        k = self.top_k
        # A router bias is honoured when the module has one (the release's has none; benches set one to
        # skew expert load).
        logits = F.linear(x, mlp.gate.weight, getattr(mlp.gate, "bias", None))  # (T, E)
        top_w, top_i = elementwise.route_topk(logits, k, self.norm_topk)  # (T, k) each
        q8 = self._fp8[i] if self._fp8_on else None
        inter = experts.down_proj.shape[2]
        if q8 is None and self.fused_experts and x.is_cuda and moe.supported(x.shape[1], inter):
            # gather, SwiGLU and the inverse permutation inside two Triton GEMMs (`engine.kernels.moe`)
            order, counts = elementwise.group_by_expert(top_i, num_experts)  # (S,) by expert, (E,)
            y = moe.experts_pairs(x, order, counts, top_w, experts.gate_up_proj, experts.down_proj)
            return y, None  # (T k, hidden) pair order
        # (S,) pairs by expert, (E,) cumulative counts (grouped_mm's offs), (S,) sorted slot of each pair
        order, offs, inv = elementwise.group_by_expert_inverse(top_i, num_experts)
        if q8 is not None:
            xq, x_scale = fp8_mode.quantize_rows(x)  # (T, hidden) e4m3, (T,)
            src = order // k  # (S,) token of each sorted pair
            h8 = fp8_mode.grouped_mm(
                fp8_mode.gather_rows(xq, src),
                x_scale.index_select(0, src),
                q8.gate_up,
                q8.gate_up_scale,
                offs,
            )  # (S, 2I) bf16
            aq, a_scale = fp8_mode.swiglu_quantized(h8, top_w.reshape(-1)[order])  # (S, I) e4m3, (S,)
            y8 = fp8_mode.grouped_mm(aq, a_scale, q8.down, q8.down_scale, offs)  # (S, hidden) bf16
            return y8, inv  # (S, hidden) expert order
        xs = x.index_select(0, order // k)  # (S, hidden)
        h = _grouped_mm(xs, experts.gate_up_proj.transpose(-2, -1), offs)  # (S, 2I)
        a = elementwise.swiglu_weighted(h, top_w.reshape(-1)[order])  # (S, I)
        y = _grouped_mm(a, experts.down_proj.transpose(-2, -1), offs)  # (S, hidden)
        return y, inv  # (S, hidden) expert order

    def __call__(self, p: PackedInputs) -> torch.Tensor:
        """Final RMS-normalised hidden states (T, hidden) for every packed token."""
        return self.layers(self.begin(p), p, 0, self.num_layers).h

    @property
    def num_layers(self) -> int:
        return len(self.text_model.layers)

    def begin(self, p: PackedInputs) -> DecoderState:
        """The state before layer 0: embeddings as the residual, their first RMSNorm, the rope tables."""
        tm = self.text_model
        x = p.inputs_embeds  # (T, hidden)
        cos, sin = tm.rotary_emb(x, p.position_ids[:, None, :])  # (1, T, d) each
        h = _rms_norm(x, tm.layers[0].input_layernorm.weight, self.eps)
        return DecoderState(x, h, cos[0].contiguous(), sin[0].contiguous())  # cos, sin (T, d)

    def layers(self, state: DecoderState, p: PackedInputs, start: int, end: int) -> DecoderState:
        """Layers [start, end) applied to `state`; after the last layer `h` is the final normalised output.
        A forward is `layers(begin(p), p, 0, num_layers)`, in any split of that range."""
        tm = self.text_model
        x, h, cos, sin = state.x, state.h, state.cos, state.sin
        layers: list[Any] = list(tm.layers)
        pacer = _LaunchPacer(self.layers_ahead if x.is_cuda else 0)
        for i in range(start, end):
            layer = layers[i]
            pacer.step()
            att = self._attention(i, layer, h, cos, sin, p)
            x, h = elementwise.add_rms_norm(x, att, layer.post_attention_layernorm.weight, self.eps)
            mlp = layer.mlp
            nxt = layers[i + 1].input_layernorm.weight if i + 1 < len(layers) else tm.norm.weight
            if hasattr(mlp, "experts"):  # the per-token sum of the k experts inside the residual add
                rows, inv = self._moe(i, mlp, h)
                x, h = elementwise.add_pairs_rms_norm(x, rows, inv, self.top_k, nxt, self.eps)
            else:
                x, h = elementwise.add_rms_norm(x, mlp(h), nxt, self.eps)
        return DecoderState(x, h, cos, sin)


@dataclass(frozen=True, slots=True)
class DecoderState:
    """Between two layers of a packed forward: the residual stream `x` (T, hidden), its RMSNorm for the next
    layer `h` (T, hidden), and the rope tables `cos`, `sin` (T, head_dim)."""

    x: torch.Tensor
    h: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor


class _LaunchPacer:
    """Keeps eager launches at most `ahead` layers in front of the GPU, waiting without the GIL.

    An eager forward launches ~40 kernels per layer, far faster than the GPU runs them; once the driver's
    launch queue is full, each launch blocks inside a torch op, holding the GIL, for most of the batch.
    That starves the threads tokenizing the next batch. Waiting on an event of an earlier layer instead
    releases the GIL (`Event.synchronize`) while the queue still holds `ahead` layers of work. Off (0)
    on CPU and while a CUDA graph is being captured.
    """

    def __init__(self, ahead: int) -> None:
        self.ahead = ahead if ahead > 0 and not torch.cuda.is_current_stream_capturing() else 0
        self._events: list[torch.cuda.Event] = []

    def step(self) -> None:
        if not self.ahead:
            return
        event = torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]
        event.record()
        self._events.append(event)
        if len(self._events) > self.ahead:
            self._events.pop(0).synchronize()


FIRST_GRAPH_LAYERS = 2
"""Layers in the first graph of a forward: the GPU waits for that graph's launch alone."""
GRAPH_LAYERS = 8
"""Layers in each later graph, launched while the GPU runs the earlier ones."""


def graph_pieces(num_layers: int) -> list[tuple[int, int]]:
    """The layer ranges [start, end) a forward is captured in, one CUDA graph each.

    Launching one graph costs the host time per node before the GPU starts it: 897.5-947.6 us for the
    550 nodes of the whole 48-layer decoder on the H200 (`bench.one_request --trace`), all of it added
    to a lone request's latency. A small first graph starts the GPU after a short launch, and each later
    graph is launched while the GPU runs the ones before it.
    """
    bounds = [0, min(FIRST_GRAPH_LAYERS, num_layers)]
    while bounds[-1] < num_layers:
        bounds.append(min(bounds[-1] + GRAPH_LAYERS, num_layers))
    return [(a, b) for a, b in itertools.pairwise(bounds) if b > a] or [(0, 0)]


SEQLEN_CAPS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
"""Longest-record caps a graph is captured for: the attention kernel sizes its grid by the longest record."""


GRAPH_BUCKETS = (512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096)
"""Token counts graphs are captured for. A replay computes the whole bucket, so the steps bound the padding
(at most 127 tokens below 1,024, 255 below 2,048, 511 above): one 800-token request (807 tokens with its
prompt) replays 896 tokens, not 1,024. Finer steps do not pay: cuBLAS runs the attention layer's two dense
GEMMs no faster at 832 or 864 rows than at 896 (64.8 and 54.1 against 51.2 us per layer, H200,
`bench.moe_kernels --dense-only`), and the expert GEMMs of a lone request are bound by the weight reads."""


def default_buckets(max_tokens: int) -> tuple[int, ...]:
    """Token counts graphs are captured for: the small batches where kernel launches dominate.

    Larger batches run eagerly: their GPU time (hundreds of ms) hides the launches, and capturing a
    graph per large size would cost seconds each and memory for every size a token budget produces.
    """
    return tuple(b for b in GRAPH_BUCKETS if b <= max(512, max_tokens))


def caps_for(bucket: int) -> tuple[int, ...]:
    """The longest-record caps a bucket's graphs are captured for (`SEQLEN_CAPS`, clamped to the bucket)."""
    return tuple(sorted({min(cap, bucket) for cap in SEQLEN_CAPS if cap < 2 * bucket}))


@dataclass(frozen=True, slots=True)
class _Static:
    """Per-bucket input buffers shared by that bucket's graphs (one graph per longest-record cap)."""

    embeds: torch.Tensor  # (bucket, hidden)
    positions: torch.Tensor  # (3, bucket)


class GraphedDecoder:
    """CUDA-graph replay of a `PackedTextDecoder`, one set of graphs per (token bucket, longest-record cap):
    the layer range in pieces (`graph_pieces`), replayed in order.

    Records are packed into the first tokens; the tail of the bucket is padding, split into records of
    at most the cap each (own cu_seqlens segments), so it never touches real records. Graphs are captured
    lazily, largest first is not required, and share one memory pool: replays must not overlap (call
    `run` from one thread, under inference mode) and each result must be consumed before the next `run`.
    Launch overhead vanishes: eager Python launches ~40 kernels per layer, which at large batches
    competes for the GIL with tokenizer threads and at small batches dominates the latency.
    """

    def __init__(self, decoder: PackedTextDecoder, buckets: tuple[int, ...], max_records: int) -> None:
        self.decoder = decoder
        self.buckets = tuple(sorted(buckets))
        self.max_records = max_records
        self._pool: Any = None
        self._static: dict[int, _Static] = {}
        self._graphs: dict[
            tuple[int, int], tuple[tuple[torch.cuda.CUDAGraph, ...], torch.Tensor, torch.Tensor]
        ] = {}

    def capture_all(self, hidden: int, dtype: torch.dtype, device: torch.device) -> int:
        """Capture every (bucket, cap) graph now (service start-up), and replay each once, so no request
        pays for a capture or a graph's first replay (in `bench.stream_probe` the first batch of a stream
        on the graphs took 309.5 ms without that replay and 160.7 ms with it, one run each; the batches
        after it took about 52 ms).

        Returns the number of graphs captured. Blocking: a few hundred ms per graph at full size.
        """
        like = PackedInputs(
            torch.zeros(1, hidden, dtype=dtype, device=device),
            torch.zeros(3, 1, dtype=torch.long, device=device),
            torch.zeros(2, dtype=torch.int32, device=device),
            1,
        )
        warmed: set[int] = set()  # buckets and caps an eager run has covered
        for bucket in self.buckets:
            for cap in sorted(caps_for(bucket), reverse=True):
                if (bucket, cap) not in self._graphs:
                    warm = bucket not in warmed or cap not in warmed
                    graphs, cu, out = self._build(bucket, cap, like, warm=warm)
                    warmed.update((bucket, cap))
                    for graph in graphs:  # a graph's first replay is slow: pay it here, not in a request
                        graph.replay()
                    self._graphs[(bucket, cap)] = (graphs, cu, out)
        torch.cuda.synchronize(like.inputs_embeds.device)
        return len(self._graphs)

    def bucket_for(self, tokens: int) -> int | None:
        """Smallest bucket holding `tokens`, or None when the batch is larger than every bucket."""
        for b in self.buckets:
            if tokens <= b:
                return b
        return None

    def _slots(self, bucket: int, cap: int) -> int:
        # real boundaries (max_records + 1) + padding records of <= cap tokens each
        return self.max_records + 1 + -(-bucket // cap)

    def _build(
        self, bucket: int, cap: int, like: PackedInputs, *, warm: bool = True
    ) -> tuple[tuple[torch.cuda.CUDAGraph, ...], torch.Tensor, torch.Tensor]:
        """Capture the (bucket, cap) graphs. `warm` runs the forward eagerly first (lazy library set-up and
        Triton compiles must not happen inside a capture); `capture_all` skips it once an eager run of the
        same bucket (the dense GEMM shapes and the experts' tile choice) and of the same cap (the attention
        kernel's grid argument) has happened."""
        dev = like.inputs_embeds.device
        static = self._static.get(bucket)
        if static is None:
            static = _Static(
                torch.zeros(bucket, like.inputs_embeds.shape[1], dtype=like.inputs_embeds.dtype, device=dev),
                torch.zeros(3, bucket, dtype=like.position_ids.dtype, device=dev),
            )
            self._static[bucket] = static
        cu = torch.arange(0, bucket + cap, cap, dtype=torch.int32, device=dev).clamp_(max=bucket)
        cu = torch.cat([cu, cu.new_full((self._slots(bucket, cap) - cu.numel(),), bucket)])  # (slots,)
        inputs = PackedInputs(static.embeds, static.positions, cu, cap)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        if warm:
            side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.decoder(inputs)
            torch.cuda.current_stream().wait_stream(side)
        # One graph per piece of the layer range, captured (and replayed) in order in the shared pool: a
        # piece's state tensors are the next one's inputs.
        graphs = []
        state: DecoderState | None = None
        for start, end in graph_pieces(self.decoder.num_layers):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                state = self.decoder.layers(state or self.decoder.begin(inputs), inputs, start, end)
            graphs.append(graph)
        assert state is not None
        return tuple(graphs), cu, state.h

    def run(self, p: PackedInputs) -> torch.Tensor:
        """Hidden states (T, hidden) for the packed records of `p` (T = its real token count)."""
        t = p.inputs_embeds.shape[0]
        n = p.cu_seqlens.shape[0] - 1
        bucket = self.bucket_for(t)
        cap = next((c for c in SEQLEN_CAPS if p.max_seqlen <= c), None)
        if bucket is None or cap is None or n > self.max_records:
            return self.decoder(p)
        cap = min(cap, bucket)
        key = (bucket, cap)
        if key not in self._graphs:
            self._graphs[key] = self._build(bucket, cap, p)
        graphs, cu, out = self._graphs[key]
        static = self._static[bucket]
        static.embeds[:t].copy_(p.inputs_embeds)
        static.embeds[t:].zero_()
        static.positions[:, :t].copy_(p.position_ids)
        pad = bucket - t
        static.positions[:, t:].copy_((torch.arange(pad, device=cu.device) % cap).expand(3, -1))
        # Real boundaries, then padding records of <= cap tokens up to the bucket end, then empty records.
        pad_bounds = torch.arange(t + cap, bucket + cap, cap, dtype=torch.int32, device=cu.device)
        pad_bounds.clamp_(max=bucket)
        cu[: n + 1].copy_(p.cu_seqlens)
        cu[n + 1 : n + 1 + pad_bounds.numel()].copy_(pad_bounds)
        cu[n + 1 + pad_bounds.numel() :].fill_(bucket)
        for graph in graphs:  # the GPU starts on the first piece while the host launches the next
            graph.replay()
        return out[:t]
