"""`engine.model.graphs.GraphedDecoder` on CPU, its graphs recorded by a capture that replays a piece by
running it again and writing the results into the recorded state (what a CUDA graph replay does to its
outputs). This checks everything of a replay but CUDA itself: the bucket's shared input buffer, the
padding tail, the record offsets built on the host, the embedding inside the first piece, the pieces
chained through their recorded states, and which batches fall back to the eager decoder. The CUDA graphs
themselves are checked on a GPU (tests/gpu/test_engine_gpu.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from engine.model.decoder import DecoderState, PackedInputs, PackedTextDecoder
from engine.model.graphs import GraphedDecoder, caps_for, graph_pieces, padding_offsets
from engine.model.packed_ids import PackedIds, host_offsets, packed_inputs
from engine.model.release import LoadedModel


class RecomputeCapture:
    """A `GraphCapture` for CPU tests: a replay runs the piece again and copies its state into the state
    the capture returned, so later pieces (and the caller) read results through the recorded tensors."""

    def __init__(self) -> None:
        self.warmed = 0
        self.captured = 0
        self.replayed = 0

    def warm(self, forward: Callable[[], object]) -> None:
        self.warmed += 1
        forward()

    def capture(self, piece: Callable[[], DecoderState]) -> tuple[Callable[[], None], DecoderState]:
        self.captured += 1
        recorded = piece()

        def replay() -> None:
            self.replayed += 1
            for dst, src in zip(_tensors(recorded), _tensors(piece()), strict=True):
                dst.copy_(src)

        return replay, recorded

    def synchronize(self, device: torch.device) -> None:
        pass


def _tensors(state: DecoderState) -> tuple[torch.Tensor, ...]:
    return state.x, state.h, state.cos, state.sin  # (`dataclasses.astuple` would copy them)


BUCKETS = (512, 1024, 2048)


@pytest.fixture
def decoder(loaded: LoadedModel) -> PackedTextDecoder:
    return PackedTextDecoder(loaded.model.text_model)


def _batch(lengths: list[int], seed: int) -> PackedIds:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 800, (sum(lengths),), generator=gen)
    pos = torch.cat([torch.arange(n) for n in lengths])[None].expand(3, -1)
    return PackedIds(ids, pos, tuple(lengths))


def _eager(decoder: PackedTextDecoder, batch: PackedIds) -> torch.Tensor:
    return decoder(packed_inputs(decoder.text_model.embed_tokens, batch))


def test_host_offsets_are_the_running_sums_then_the_tail() -> None:
    assert host_offsets([3, 5, 2]).tolist() == [0, 3, 8, 10]
    assert host_offsets([4], [9, 12, 12]).tolist() == [0, 4, 9, 12, 12]
    assert host_offsets([4]).dtype == torch.int32


def test_padding_is_cut_into_records_of_at_most_the_cap_then_empty_slots() -> None:
    assert padding_offsets(5, 1, 512, 512, 10) == [512] * 8
    assert padding_offsets(1030, 3, 2048, 512, 12) == [1542, 2048] + [2048] * 6
    assert padding_offsets(2048, 2, 2048, 1024, 6) == [2048] * 3  # no padding: empty records only
    assert padding_offsets(0, 0, 1024, 512, 5) == [512, 1024, 1024, 1024]  # a capture's offsets
    for tokens in range(0, 1025, 37):
        cu = host_offsets([tokens] if tokens else [], padding_offsets(tokens, int(tokens > 0), 1024, 256, 8))
        steps = (cu[1:] - cu[:-1]).tolist()
        assert cu[-1] == 1024
        assert len(cu) == 8
        assert min(steps) >= 0
        assert max(steps[1:] or [0]) <= 256  # padding records of at most the cap
    with pytest.raises(ValueError, match="do not fit"):
        padding_offsets(10, 4, 1024, 256, 8)  # 5 offsets + 4 padding records > 8 slots


@pytest.mark.parametrize(
    "lengths",
    [
        [5],  # one short record, bucket 512, one padding record
        [512],  # exactly a bucket: no padding
        [3, 9, 2, 17],  # several records
        [300, 200, 150, 90, 10],  # bucket 1024, cap 512
        [500, 500, 30],  # bucket 2048, cap 512: two padding records
        [1500],  # bucket 2048, cap 2048
        [400, 500, 600],  # bucket 2048, cap 1024 (the longest is 600)
    ],
)
def test_a_replay_gives_the_eager_decoders_states(decoder: PackedTextDecoder, lengths: list[int]) -> None:
    graphed = GraphedDecoder(decoder, BUCKETS, max_records=8, capture=RecomputeCapture())
    batch = _batch(lengths, seed=len(lengths))
    with torch.inference_mode():
        replayed = graphed.run(batch).clone()
        eager = _eager(decoder, batch)
    assert replayed.shape == eager.shape == (sum(lengths), eager.shape[1])
    torch.testing.assert_close(replayed, eager, atol=1e-5, rtol=1e-4)


def test_a_batch_after_a_longer_one_in_its_bucket_reads_nothing_the_longer_one_left(
    decoder: PackedTextDecoder,
) -> None:
    """The bucket's buffer, offsets and outputs are shared by every batch of it: the tail is rewritten
    every time, so a short batch after a long one gives what it gives first, bit for bit."""
    capture = RecomputeCapture()
    graphed = GraphedDecoder(decoder, BUCKETS, max_records=8, capture=capture)
    short, long = _batch([7, 3], seed=1), _batch([50, 60, 11], seed=2)
    with torch.inference_mode():
        first = graphed.run(short).clone()
        graphed.run(long)
        again = graphed.run(short).clone()
        eager = _eager(decoder, short)
    assert torch.equal(first, again)
    torch.testing.assert_close(first, eager, atol=1e-5, rtol=1e-4)
    pieces = len(graph_pieces(decoder.num_layers))
    assert capture.captured == pieces  # one bucket, one cap: captured once, replayed three times
    assert capture.replayed == 3 * pieces


def test_batches_no_graph_covers_run_eagerly_and_only_they_call_between(decoder: PackedTextDecoder) -> None:
    """`covers` names exactly the batches replayed: the others run eagerly and call `between`."""
    capture = RecomputeCapture()
    graphed = GraphedDecoder(decoder, (512,), max_records=2, capture=capture)
    assert [graphed.covers(n) for n in ([5, 5, 5], [300, 300], [5, 5], [512], [513])] == [
        False,
        False,
        True,
        True,
        False,
    ]
    calls: list[int] = []

    def between() -> None:
        calls.append(1)

    with torch.inference_mode():
        too_many = _batch([5, 5, 5], seed=3)  # 3 records > 2 slots
        too_long = _batch([300, 300], seed=4)  # 600 tokens > the largest bucket
        for batch in (too_many, too_long):
            assert torch.equal(graphed.run(batch, between), _eager(decoder, batch))
        assert capture.captured == 0
        assert len(calls) == 2 * (decoder.num_layers - 1)
        graphed.run(_batch([5, 5], seed=5), between)  # replayed: never between the pieces
    assert len(calls) == 2 * (decoder.num_layers - 1)
    assert capture.captured == len(graph_pieces(decoder.num_layers))


def test_capture_all_captures_every_bucket_and_cap_once_and_replays_each_once(
    decoder: PackedTextDecoder,
) -> None:
    capture = RecomputeCapture()
    graphed = GraphedDecoder(decoder, BUCKETS, max_records=4, capture=capture)
    with torch.inference_mode():
        count = graphed.capture_all(torch.device("cpu"))
        pairs = sum(len(caps_for(b)) for b in BUCKETS)
        assert count == pairs
        pieces = len(graph_pieces(decoder.num_layers))
        assert capture.captured == capture.replayed == pairs * pieces
        # an eager warm run per new bucket or cap only: 512 (cap 512), 1024 (cap 1024; its cap 512 was
        # warmed with bucket 512), 2048 (cap 2048; caps 512 and 1024 warmed before)
        assert capture.warmed == 3
        graphed.run(_batch([30, 20], seed=6))
    assert capture.captured == pairs * pieces  # nothing captured by a request


def test_every_piece_of_a_replay_reads_the_records_token_count_and_a_capture_counts_the_whole_bucket(
    decoder: PackedTextDecoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`PackedInputs.valid` is what lets the experts skip the bucket's padding: each piece must read the
    count of the batch being replayed (rewritten with the offsets), and the capture's warm-up the whole
    bucket (every token through the experts, as before the count existed)."""
    seen: list[tuple[int, int]] = []  # (tokens in the state, valid) per layer-range call
    layers = decoder.layers

    def recording(
        state: DecoderState, p: PackedInputs, start: int, end: int, between: object = None
    ) -> DecoderState:
        assert p.valid is not None
        assert p.valid.dtype == torch.int32
        assert p.valid.shape == (1,)
        seen.append((state.x.shape[0], int(p.valid[0])))
        return layers(state, p, start, end)

    monkeypatch.setattr(decoder, "layers", recording)
    graphed = GraphedDecoder(decoder, BUCKETS, max_records=8, capture=RecomputeCapture())
    pieces = len(graph_pieces(decoder.num_layers))
    with torch.inference_mode():
        graphed.run(_batch([300, 200], seed=7))  # bucket 512 (cap 512): warm-up, capture, replay
        assert seen[-pieces:] == [(512, 500)] * pieces
        assert (512, 512) in seen[:-pieces]  # the capture's
        graphed.run(_batch([3, 9, 2], seed=8))
        assert seen[-pieces:] == [(512, 14)] * pieces
