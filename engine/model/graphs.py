"""CUDA-graph replay of the packed text decoder (`engine.model.decoder.PackedTextDecoder`) for the small
batches where kernel launches dominate: which token counts and longest-record caps get graphs, how a
forward is cut into pieces, and `GraphedDecoder`, which captures and replays them.

Contract: with `CudaGraphCapture` (the product's) capture and replay run on CUDA under
`torch.inference_mode()`, from one thread (the graphs of one `GraphedDecoder` share a memory pool); batches
no graph covers run the decoder eagerly. Another `GraphCapture` (a CPU test's) may replay by recomputing.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from engine.model.decoder import DecoderState, PackedInputs, PackedTextDecoder
from engine.model.packed_ids import PackedIds, host_offsets, packed_inputs
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


def padding_offsets(tokens: int, records: int, bucket: int, cap: int, slots: int) -> list[int]:
    """What follows a replayed batch's own record offsets (0 and the `records` running sums up to
    `tokens`) in its bucket's `slots` offsets: the padding up to `bucket` cut into records of at most `cap`
    tokens (the attention kernel sizes its grid by `cap`), then empty records at `bucket`. Raises
    ValueError when the slots cannot hold them."""
    pad = [min(end, bucket) for end in range(tokens + cap, bucket + cap, cap)]
    empty = slots - records - 1 - len(pad)
    if empty < 0 or tokens > bucket:
        raise ValueError(f"{records} records of {tokens} tokens do not fit {slots} slots of bucket {bucket}")
    return pad + [bucket] * empty


def caps_for(bucket: int) -> tuple[int, ...]:
    """The longest-record caps a bucket's graphs are captured for (`SEQLEN_CAPS`, clamped to the bucket)."""
    return tuple(sorted({min(cap, bucket) for cap in SEQLEN_CAPS if cap < 2 * bucket}))


class GraphCapture(Protocol):
    """How `GraphedDecoder` records and replays its pieces. `CudaGraphCapture` is the product's; a CPU test
    may give one that replays by running the piece again and copying its results into the recorded ones."""

    def warm(self, forward: Callable[[], object]) -> None:
        """Run `forward` once eagerly before any capture of its shapes (lazy library set-up, compiles)."""
        ...

    def capture(self, piece: Callable[[], DecoderState]) -> tuple[Callable[[], None], DecoderState]:
        """Record `piece`; returns its replay and its output state, whose tensors every replay rewrites from
        the inputs the piece read (their contents at replay time)."""
        ...

    def synchronize(self, device: torch.device) -> None:
        """Wait until every replay so far has run."""
        ...


class CudaGraphCapture:
    """CUDA graphs sharing one memory pool: replays must not overlap, and each result must be consumed
    before the next replay of any graph of the pool."""

    def __init__(self) -> None:
        self._pool: Any = None

    def warm(self, forward: Callable[[], object]) -> None:
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            forward()
        torch.cuda.current_stream().wait_stream(side)

    def capture(self, piece: Callable[[], DecoderState]) -> tuple[Callable[[], None], DecoderState]:
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            state = piece()
        return graph.replay, state

    def synchronize(self, device: torch.device) -> None:
        torch.cuda.synchronize(device)


@dataclass(frozen=True, slots=True)
class _Graphs:
    """One (bucket, cap)'s replays (one per piece, in order), its record offsets and its output."""

    replays: tuple[Callable[[], None], ...]
    host: torch.Tensor  # (slots + 1,) int32: the record offsets (`cu`), then the records' token count
    cu: torch.Tensor  # (slots,) int32 view of `host`, read by every piece
    out: torch.Tensor  # (bucket, hidden) final normalised states


class GraphedDecoder:
    """CUDA-graph replay of a `PackedTextDecoder`, one set of graphs per (token bucket, longest-record cap):
    the embedding lookup and the layer range in pieces (`graph_pieces`), replayed in order.

    Records are packed into the first tokens; the tail of the bucket is padding (pad id 0), split into
    records of at most the cap each (own cu_seqlens segments), so it never touches real records, and the
    experts skip it (`PackedInputs.valid`: at 70% load a bucket's tail is about a tenth of its tokens, all
    of one state, so all routed to the same k experts). A replay's inputs take four operations: the ids
    and positions copied into the bucket's buffer, the padding tail from a per-cap template, and the
    record offsets (real and padding) with the records' token count, built on the host and copied once.
    Graphs are captured lazily, largest first is not required, and share one memory pool: replays must not
    overlap (call `run` from one thread, under inference mode) and each result must be consumed before
    the next `run`. Launch overhead vanishes: eager Python launches ~40 kernels per layer, which at large
    batches competes for the GIL with tokenizer threads and at small batches dominates the latency.
    """

    def __init__(
        self,
        decoder: PackedTextDecoder,
        buckets: tuple[int, ...],
        max_records: int,
        capture: GraphCapture | None = None,
    ) -> None:
        self.decoder = decoder
        self.buckets = tuple(sorted(buckets))
        self.max_records = max_records
        self._capture: GraphCapture = capture or CudaGraphCapture()
        self._embed: Callable[[torch.Tensor], torch.Tensor] = decoder.text_model.embed_tokens
        # per bucket, shared by its graphs (one per cap): (4, bucket) int64, row 0 the token ids, rows 1-3
        # the t/h/w rope positions; the graphs embed the ids themselves
        self._tokens: dict[int, torch.Tensor] = {}
        self._tails: dict[int, torch.Tensor] = {}  # per cap: (4, largest bucket) padding ids and positions
        self._graphs: dict[tuple[int, int], _Graphs] = {}

    def capture_all(self, device: torch.device) -> int:
        """Capture every (bucket, cap) graph now (service start-up), and replay each once, so no request
        pays for a capture or for a graph's slow first replay (`bench.stream_probe`; BENCHMARKS.md, "Engine,
        round five").

        Returns the number of graphs captured. Blocking: a few hundred ms per graph at full size.
        """
        warmed: set[int] = set()  # buckets and caps an eager run has covered
        for bucket in self.buckets:
            for cap in sorted(caps_for(bucket), reverse=True):
                if (bucket, cap) not in self._graphs:
                    warm = bucket not in warmed or cap not in warmed
                    graphs = self._build(bucket, cap, device, warm=warm)
                    warmed.update((bucket, cap))
                    for replay in graphs.replays:  # a graph's first replay is slow: pay it here
                        replay()
                    self._graphs[(bucket, cap)] = graphs
        self._capture.synchronize(device)
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

    def _tail(self, cap: int, device: torch.device) -> torch.Tensor:
        """(4, largest bucket) int64: pad id 0, then positions restarting every `cap` tokens (the padding
        records' positions); a bucket's padding of `pad` tokens is its first `pad` columns."""
        tail = self._tails.get(cap)
        if tail is None:
            tail = torch.zeros(4, self.buckets[-1], dtype=torch.int64, device=device)
            tail[1:] = torch.arange(self.buckets[-1], device=device) % cap
            self._tails[cap] = tail
        return tail

    def _build(self, bucket: int, cap: int, device: torch.device, *, warm: bool = True) -> _Graphs:
        """Capture the (bucket, cap) graphs. `warm` runs the forward eagerly first (lazy library set-up and
        Triton compiles must not happen inside a capture); `capture_all` skips it once an eager run of the
        same bucket (the dense GEMM shapes and the experts' tile choice) and of the same cap (the attention
        kernel's grid argument) has happened."""
        tokens = self._tokens.get(bucket)
        if tokens is None:
            tokens = self._tokens[bucket] = torch.zeros(4, bucket, dtype=torch.int64, device=device)
        self._tail(cap, device)  # made here, at capture time, not by a request
        slots = self._slots(bucket, cap)
        # (slots + 1,): padding records only, and the whole bucket counted as records' tokens, so that the
        # warm-up runs the experts on every token (each replay writes its own offsets and count)
        host = host_offsets((), [*padding_offsets(0, 0, bucket, cap, slots), bucket]).to(device)
        cu, valid = host[:slots], host[slots:]

        def inputs() -> PackedInputs:
            return PackedInputs(self._embed(tokens[0]), tokens[1:], cu, cap, valid)

        if warm:
            self._capture.warm(lambda: self.decoder(inputs()))
        # One graph per piece of the layer range, captured (and replayed) in order in the shared pool: a
        # piece's state tensors are the next one's inputs. Only the first piece embeds; the later pieces
        # read the offsets and the cap alone from their `PackedInputs`.
        replays: list[Callable[[], None]] = []
        state: DecoderState | None = None
        for start, end in graph_pieces(self.decoder.num_layers):

            def piece(prev: DecoderState | None = state, a: int = start, b: int = end) -> DecoderState:
                p = inputs() if prev is None else PackedInputs(prev.x, tokens[1:], cu, cap, valid)
                return self.decoder.layers(prev or self.decoder.begin(p), p, a, b)

            replay, state = self._capture.capture(piece)
            replays.append(replay)
        assert state is not None
        return _Graphs(tuple(replays), host, cu, state.h)

    def _graph_for(self, lengths: Sequence[int]) -> tuple[int, int] | None:
        """The (bucket, cap) whose graphs replay records of `lengths` tokens, or None: they run eagerly."""
        bucket = self.bucket_for(sum(lengths))
        cap = next((c for c in SEQLEN_CAPS if max(lengths) <= c), None)
        if bucket is None or cap is None or len(lengths) > records_for(bucket, self.max_records):
            return None
        return bucket, min(cap, bucket)

    def covers(self, lengths: Sequence[int]) -> bool:
        """True when `run` replays graphs for records of `lengths` tokens (no eager layer, no `between`)."""
        return self._graph_for(lengths) is not None

    def run(self, batch: PackedIds, between: Between | None = None) -> torch.Tensor:
        """Hidden states (T, hidden) for the packed records of `batch` (T = its token count). A batch that
        no graph covers (`covers`) runs eagerly and calls `between` between its layers; a graph replay never
        does (its static buffers are shared by every batch of its bucket)."""
        t = sum(batch.lengths)
        n = len(batch.lengths)
        chosen = self._graph_for(batch.lengths)
        if chosen is None:
            return self.decoder(packed_inputs(self._embed, batch), between)
        bucket, cap = chosen
        device = batch.input_ids.device
        graphs = self._graphs.get((bucket, cap))
        if graphs is None:
            graphs = self._graphs[(bucket, cap)] = self._build(bucket, cap, device)
        tokens = self._tokens[bucket]
        tokens[0, :t].copy_(batch.input_ids)
        tokens[1:, :t].copy_(batch.position_ids)
        tokens[:, t:].copy_(self._tail(cap, device)[:, : bucket - t])
        tail = padding_offsets(t, n, bucket, cap, graphs.cu.numel())
        host = host_offsets(batch.lengths, [*tail, t], pinned=device.type == "cuda")
        graphs.host.copy_(host, non_blocking=True)
        for replay in graphs.replays:  # the GPU starts on the first piece while the host launches the next
            replay()
        return graphs.out[:t]
