"""CUDA-graph replay of the packed text decoder (`engine.model.decoder.PackedTextDecoder`) for the small
batches where kernel launches dominate: which token counts and longest-record caps get graphs, how a
forward is cut into pieces, and `GraphedDecoder`, which captures and replays them.

Contract: capture and replay run on CUDA under `torch.inference_mode()`, from one thread (the graphs of
one `GraphedDecoder` share a memory pool); batches no graph covers run the decoder eagerly.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch

from engine.model.decoder import DecoderState, PackedInputs, PackedTextDecoder
from engine.types import Between

FIRST_GRAPH_LAYERS = 2
"""Layers in the first graph of a forward: the GPU waits for that graph's launch alone."""
GRAPH_LAYERS = 8
"""Layers in each later graph, launched while the GPU runs the earlier ones."""


def graph_pieces(num_layers: int) -> list[tuple[int, int]]:
    """The layer ranges [start, end) a forward is captured in, one CUDA graph each.

    Launching one graph holds the host for time that grows with its node count, and the GPU starts the
    graph only when the launch returns: a small first graph starts the GPU after a short launch, and each
    later graph is launched while the GPU runs the ones before it (`bench.one_request --trace`;
    BENCHMARKS.md, "Engine, round five").
    """
    bounds = [0, min(FIRST_GRAPH_LAYERS, num_layers)]
    while bounds[-1] < num_layers:
        bounds.append(min(bounds[-1] + GRAPH_LAYERS, num_layers))
    return [(a, b) for a, b in itertools.pairwise(bounds) if b > a] or [(0, 0)]


SEQLEN_CAPS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
"""Longest-record caps a graph is captured for: the attention kernel sizes its grid by the longest record."""


GRAPH_BUCKETS = (
    *(512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096),
    *(4608, 5120, 5632, 6144, 7168, 8192),
)
"""Token counts graphs are captured for. A replay computes the whole bucket, so the steps bound the padding
(at most 127 tokens below 1,024, 255 below 2,048, 511 below 6,144, 1,023 above): one 800-token request
(807 tokens with its prompt) replays 896 tokens, not 1,024. Finer steps do not pay (`bench.moe_kernels
--dense-only`; BENCHMARKS.md, "Engine, round four", "Measured and dropped"). The buckets above 4,096
hold the service's batches at moderate load (4-6 records at 70% of capacity, bursts more), which eagerly
ran up to 2x slower while a prepare thread held the GIL (`bench.batch_sizes`; BENCHMARKS.md, "Priority
classes, round five")."""

RECORD_TOKENS = 256
"""A bucket's graphs hold `max(max_records, bucket // RECORD_TOKENS)` record slots (8,192 tokens: 32; 4,096
and less: the default 16). Each slot is a program of the attention grid even when empty, so small buckets
keep few; a batch with more records than its bucket holds runs eagerly."""


def default_buckets(max_tokens: int) -> tuple[int, ...]:
    """Token counts graphs are captured for: the small and moderate batches where kernel launches (and the
    GIL they need) dominate or compete with the GPU time.

    Larger batches run eagerly: their GPU time (hundreds of ms) hides the launches, and capturing a
    graph per large size would cost seconds each and memory for every size a token budget produces.
    """
    return tuple(b for b in GRAPH_BUCKETS if b <= max(512, max_tokens))


def records_for(bucket: int, max_records: int) -> int:
    """The most records a batch may hold to replay `bucket`'s graphs: `max_records`, or one per
    `RECORD_TOKENS` tokens of the bucket where that is more."""
    return max(max_records, bucket // RECORD_TOKENS)


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
        pays for a capture or for a graph's slow first replay (`bench.stream_probe`; BENCHMARKS.md, "Engine,
        round five").

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
        # real boundaries (records + 1) + padding records of <= cap tokens each
        return records_for(bucket, self.max_records) + 1 + -(-bucket // cap)

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

    def run(self, p: PackedInputs, between: Between | None = None) -> torch.Tensor:
        """Hidden states (T, hidden) for the packed records of `p` (T = its real token count). A batch that
        no graph covers runs eagerly and calls `between` between its layers; a graph replay never does (its
        static buffers are shared by every batch of its bucket)."""
        t = p.inputs_embeds.shape[0]
        n = p.cu_seqlens.shape[0] - 1
        bucket = self.bucket_for(t)
        cap = next((c for c in SEQLEN_CAPS if p.max_seqlen <= c), None)
        if bucket is None or cap is None or n > records_for(bucket, self.max_records):
            return self.decoder(p, between)
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
