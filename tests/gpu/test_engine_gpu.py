"""GPU: the tiny release on CUDA in bf16 keeps every record's probabilities within 2e-3 in any batch."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from devtools.tiny_release import write_tiny_release
from engine.batching.collate import Layout, collate
from engine.model.release import load_release_model
from engine.runner import RunResult, StagedBatch
from engine.types import EncodedRequest
from schemas.systemone import SystemOneRequest, parse_request

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _record(rng: random.Random, length: int, num_questions: int) -> EncodedRequest:
    questions, options = [], []
    pos = 3
    for _ in range(num_questions):
        questions.append((pos, pos + 3))
        pos += 4
        spans = []
        for _ in range(rng.randrange(2, 8)):
            width = rng.randrange(1, 6)
            spans.append((pos, pos + width))
            pos += width + 1
        options.append(tuple(spans))
    length = max(length, pos + 2)
    return EncodedRequest(
        input_ids=tuple(rng.randrange(858) for _ in range(length)),
        question_ids=tuple(f"q{k}" for k in range(num_questions)),
        question_types=tuple(rng.randrange(3) for _ in range(num_questions)),
        question_spans=tuple(questions),
        option_spans=tuple(options),
    )


def test_batch_invariance_bf16_cuda(tmp_path: Path) -> None:
    """The transformers path (no fast path) in the layout the engine picks for it on CUDA: padded, as
    attention is dense SDPA. (Transformers' packed row under dense SDPA, a block-diagonal (T, T) mask,
    is never picked on CUDA; records there moved 1.45e-03 to 2.11e-03 from alone, in the decoder: the
    same head is at 5.96e-08 padded. Packed text runs on the fast path, tested below.)"""
    loaded = load_release_model(write_tiny_release(tmp_path / "tiny"), device="cuda", dtype=torch.bfloat16)
    model = loaded.model
    assert next(model.thinker.parameters()).dtype == torch.bfloat16
    layout: Layout = model.preferred_layout
    assert layout == "padded"
    rng = random.Random(5)
    records = [_record(rng, n, q) for n, q in ((30, 1), (700, 3), (220, 2), (1500, 4), (64, 1), (400, 3))]
    alone = [model.forward_batch(collate([r], layout=layout, device="cuda"))[0] for r in records]
    together = model.forward_batch(collate(records, layout=layout, device="cuda"))
    worst = 0.0
    for rec_alone, rec_together in zip(alone, together, strict=True):
        for a, b in zip(rec_alone, rec_together, strict=True):
            assert a.dtype == np.float32
            assert abs(float(b.sum()) - 1.0) <= 1e-4
            worst = max(worst, float(np.abs(a - b).max()))
    print(f"{layout}: max |dp| alone vs batch = {worst:.2e}")
    assert worst <= 2e-3


@pytest.mark.parametrize("graphs", [False, True])
def test_fast_path_batch_invariance_and_accuracy_bf16_cuda(tmp_path: Path, graphs: bool) -> None:
    """The packed varlen decoder (eager and CUDA-graph replay) keeps records independent within the SPEC
    tolerance, and its bf16 error against a float32 reference stays of the order of transformers' own
    bf16 decoder's (a wrong norm, rope or routing gives errors orders of magnitude larger)."""
    release = write_tiny_release(tmp_path / "tiny")
    model = load_release_model(release, device="cuda", dtype=torch.bfloat16).model
    model32 = load_release_model(release, device="cuda", dtype=torch.float32).model
    rng = random.Random(7)
    records = [_record(rng, n, q) for n, q in ((30, 1), (700, 3), (220, 2), (1500, 4), (64, 1), (400, 3))]
    exact = model32.forward_batch(collate(records, layout="padded", device="cuda"))
    reference = model.forward_batch(collate(records, layout="padded", device="cuda"))
    assert model.enable_fast_path(graph_buckets=(512, 4096) if graphs else ())
    alone = [model.forward_batch(collate([r], layout="packed", device="cuda"))[0] for r in records]
    together = model.forward_batch(collate(records, layout="packed", device="cuda"))
    worst_batch = err_fast = err_ref = 0.0
    for rec in zip(alone, together, reference, exact, strict=True):
        for a, b, r, e in zip(*rec, strict=True):
            assert abs(float(b.sum()) - 1.0) <= 1e-4
            worst_batch = max(worst_batch, float(np.abs(a - b).max()))
            err_fast = max(err_fast, float(np.abs(b - e).max()))
            err_ref = max(err_ref, float(np.abs(r - e).max()))
    print(
        f"fast path (graphs={graphs}): max |dp| alone vs batch = {worst_batch:.2e}; vs float32: "
        f"fast bf16 {err_fast:.2e}, transformers bf16 {err_ref:.2e}"
    )
    assert worst_batch <= 2e-3
    assert err_fast <= max(2e-3, 2.0 * err_ref)


@pytest.mark.parametrize("lane", [False, True], ids=["same-stream", "lane-stream"])
def test_an_urgent_batch_between_layers_changes_no_answer_cuda(tmp_path: Path, lane: bool) -> None:
    """`Engine.run(staged, between)`: a large text batch runs eagerly layer by layer, an urgent batch (a
    CUDA-graph replay) runs inside it at a layer boundary; both give exactly their answers run alone.
    The urgent batch is staged on another thread inside `Engine.lane()` and run inside it, as the service's
    urgent lane does; with `lane` (`EngineConfig.lane_stream`) that is the engine's high-priority stream,
    while the big batch's launched layers are still queued on the default one."""
    from concurrent.futures import ThreadPoolExecutor

    from engine import Engine, EngineConfig
    from engine.batching.cut import BatchLimits

    release = write_tiny_release(tmp_path / "tiny")
    limits = BatchLimits(65_536, 256)
    config = EngineConfig(device="cuda", limits=limits, graph_buckets=(512,), lane_stream=lane)
    engine = Engine.from_release(release, config=config)
    stream = engine._lane.stream
    if lane:
        assert stream is not None
        assert stream.priority < torch.cuda.current_stream().priority
    else:
        assert stream is None  # the lane is a no-op context: the urgent batch shares the big one's stream
    rng = random.Random(9)
    big = [engine.prepare(_request(rng, 1200)) for _ in range(6)]  # 7k tokens: beyond the graph bucket
    small = [engine.prepare(_request(rng, 200))]
    big_alone = engine.run(engine.stage(big))
    small_alone = engine.run(engine.stage(small))
    inside: list[RunResult] = []

    def stage_in_lane() -> StagedBatch:
        with engine.lane():
            return engine.stage(small)

    with ThreadPoolExecutor(1) as urgent_thread:  # staged on a thread of its own, as the service does
        staged_small = urgent_thread.submit(stage_in_lane).result()

    def between() -> None:
        if not inside:
            with engine.lane():
                inside.append(engine.run(staged_small))

    big_interleaved = engine.run(engine.stage(big), between)
    assert len(inside) == 1
    assert _same(big_interleaved, big_alone)
    assert _same(inside[0], small_alone)


@pytest.mark.parametrize("lane", [False, True], ids=["same-stream", "lane-stream"])
def test_batches_launched_ahead_give_their_answers_alone_cuda(tmp_path: Path, lane: bool) -> None:
    """`Engine.launch`: three batches of one CUDA-graph bucket launched back to back before any is waited
    for (the graph's buffers are shared by the bucket), and an urgent batch of that bucket launched inside
    the lane while they are queued, give exactly their answers run alone; the device seconds are timed.
    Those batches are queued whole (`Engine.queues_whole`); a batch above the largest bucket is not."""
    from engine import Engine, EngineConfig
    from engine.batching.cut import BatchLimits

    release = write_tiny_release(tmp_path / "tiny")
    config = EngineConfig(
        device="cuda", limits=BatchLimits(65_536, 256), graph_buckets=(512,), lane_stream=lane
    )
    engine = Engine.from_release(release, config=config)
    rng = random.Random(11)
    batches = [[engine.prepare(_request(rng, rng.randrange(40, 120))) for _ in range(2)] for _ in range(3)]
    urgent = [engine.prepare(_request(rng, 60))]
    alone = [engine.run(engine.stage(b)) for b in [*batches, urgent]]
    staged = [engine.stage(b) for b in batches]
    with engine.lane():
        staged_urgent = engine.stage(urgent)
    assert all(engine.queues_whole(s) for s in staged)  # replayed from the 512-token bucket's graphs
    eager = [engine.prepare(_request(rng, 400)) for _ in range(2)]
    assert sum(p.num_tokens for p in eager) > 512
    assert not engine.queues_whole(engine.stage(eager))  # above the largest bucket: eager layers
    launched = [engine.launch(s) for s in staged]
    with engine.lane():
        urgent_launched = engine.launch(staged_urgent)
    results = [x.wait() for x in [*launched, urgent_launched]]
    for (got, seconds), want in zip(results, alone, strict=True):
        assert _same(got, want)
        assert seconds is not None
        assert seconds > 0.0


def _request(rng: random.Random, words: int) -> SystemOneRequest:
    text = " ".join(rng.choice(("disk", "full", "on", "db", "replica", "lag", "alert")) for _ in range(words))
    return parse_request(
        {
            "state": {"message": text},
            "questions": {
                "department": {
                    "type": "choice",
                    "instructions": "Team?",
                    "criteria": {"db": None, "net": None},
                },
                "outage": {"type": "noul", "instructions": "Outage?"},
            },
        }
    )


def _same(a: RunResult, b: RunResult) -> bool:
    """Bit-equal probabilities, record by record, question by question."""
    return all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
        for x, y in zip(a.probabilities, b.probabilities, strict=True)
    )


def test_route_topk_kernel_matches_softmax_topk_cuda() -> None:
    from engine.kernels import moe

    torch.manual_seed(0)
    logits = torch.randn(5000, 128, device="cuda", dtype=torch.bfloat16)
    for normalize in (True, False):
        w, i = moe.route_topk(logits, 8, normalize)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        ref_w, _ = torch.topk(probs, 8, dim=-1)
        if normalize:
            ref_w = ref_w / ref_w.sum(dim=-1, keepdim=True)
        # bf16 logits tie often; a tie may pick another expert id, never a smaller probability.
        assert torch.allclose(w, ref_w, atol=1e-6, rtol=0)
        chosen = torch.gather(probs, 1, i.long())
        assert torch.equal(chosen, torch.topk(probs, 8, dim=-1).values)
        assert bool((i.long().sort(dim=-1).values.diff(dim=-1) > 0).all()), "ids are distinct"
    print(f"route_topk: max |dw| = {float((w - ref_w).abs().max()):.2e}")


def test_packed_host_to_device_copy_keeps_every_tensor_cuda() -> None:
    rng = random.Random(3)
    records = [_record(rng, n, q) for n, q in ((30, 1), (700, 3), (220, 2))]
    for layout in ("packed", "padded"):
        host = collate(records, layout=layout)
        dev = host.to("cuda")
        torch.cuda.synchronize()
        assert torch.equal(dev.input_ids.cpu(), host.input_ids)
        assert torch.equal(dev.position_ids.cpu(), host.position_ids)
        for name in ("attention_mask", "token_gather"):
            a, b = getattr(dev, name), getattr(host, name)
            assert (a is None) == (b is None)
            if a is not None:
                assert torch.equal(a.cpu(), b)
        for f in host.index.__dataclass_fields__:
            a, b = getattr(dev.index, f), getattr(host.index, f)
            if isinstance(b, torch.Tensor):
                assert a.device.type == "cuda", f
                assert a.dtype == b.dtype, f
                assert torch.equal(a.cpu(), b), f
            else:
                assert a == b, f


def test_to_host_copies_after_the_streams_work_on_the_default_and_a_side_stream_cuda() -> None:
    from engine.model.clef import to_host

    for dtype in (torch.bfloat16, torch.float32):
        a = torch.rand(2048, 2048, device="cuda", dtype=dtype)
        for stream in (torch.cuda.current_stream(), torch.cuda.Stream()):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                values = (a @ a).sum(dim=1)  # (2048,) still running when the copy is queued
                got = to_host(values)
                want = values.float().cpu().numpy()
            assert got.dtype == np.float32
            assert got.shape == (2048,)
            assert np.array_equal(got, want)


def test_graph_replays_match_the_eager_decoder_and_share_their_buffers_safely_cuda(tmp_path: Path) -> None:
    """`GraphedDecoder` with real CUDA graphs: every batch shape (padding records, several records, no
    padding, caps below the bucket) close to the eager decoder on the same ids, and a short batch replayed
    after a longer one of its bucket gives its first result bit for bit (the bucket's buffers, offsets and
    output are shared). The same checks run on CPU through a recomputing capture
    (tests/unit/engine/model/test_graphed_decoder.py)."""
    from engine.model.decoder import PackedTextDecoder
    from engine.model.graphs import GraphedDecoder
    from engine.model.packed_ids import PackedIds, packed_inputs

    loaded = load_release_model(write_tiny_release(tmp_path / "tiny"), device="cuda", dtype=torch.bfloat16)
    decoder = PackedTextDecoder(loaded.model.text_model)
    graphed = GraphedDecoder(decoder, (512, 1024, 2048), max_records=8)
    gen = torch.Generator().manual_seed(11)

    def batch(lengths: list[int]) -> PackedIds:
        ids = torch.randint(1, 800, (sum(lengths),), generator=gen).cuda()
        pos = torch.cat([torch.arange(n) for n in lengths])[None].expand(3, -1).cuda()
        return PackedIds(ids, pos, tuple(lengths))

    with torch.inference_mode():
        assert graphed.capture_all(torch.device("cuda")) == 6
        short = batch([7, 3])
        first = graphed.run(short).clone()
        for lengths in ([5], [512], [3, 9, 2, 17], [300, 200, 150, 90, 10], [500, 500, 30], [400, 500, 600]):
            b = batch(lengths)
            replayed = graphed.run(b).float()
            eager = decoder(packed_inputs(decoder.text_model.embed_tokens, b)).float()
            err = (replayed - eager).norm(dim=-1) / eager.norm(dim=-1)  # (T,) per token
            off = float((err > 2e-2).float().mean())
            print(f"graphs vs eager {lengths}: worst token {float(err.max()):.2e}, share over 2e-2 {off:.4f}")
            # bf16 GEMMs of T rows against bucket rows may differ in a last bit, and a rare router tie may
            # then flip for a token; a layout slip (offsets, positions, ids) spoils whole records
            assert off <= 0.01, lengths
        assert torch.equal(graphed.run(short), first)
