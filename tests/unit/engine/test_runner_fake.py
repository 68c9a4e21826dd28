"""`Engine.decide` failure isolation with a fake model: OOM splitting and unusable model output."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch
from tokenizers import Tokenizer

from engine.batching.collate import Layout, ModelBatch, collate
from engine.kernels import moe_fp8_sm90
from engine.runner import Engine, EngineConfig
from engine.types import Between, EncodedRequest, Ready
from schemas.systemone import DlqReason, RequestError, SystemOneResponse, parse_request


class FakeModel:
    """A CPU `engine.handoff.ModelLike` without a fast path that packs every batch: uniform probabilities;
    OOM for batches over `max_records`; NaN for records whose state has 'nan'."""

    def __init__(self, max_records: int, tokenizer: Tokenizer) -> None:
        self.max_records = max_records
        self.nan_id = tokenizer.encode("nan", add_special_tokens=False).ids
        self.batch_sizes: list[int] = []
        self.answered: list[int] = []
        self.built: dict[str, object] = {}  # what `enable_fast_path` was last asked for (FakeFp8Model)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def fast_path(self) -> bool:
        return False

    @property
    def text_only(self) -> bool:
        return bool(self.built.get("text_only", False))

    def enable_fast_path(
        self,
        *,
        graph_buckets: tuple[int, ...] = (),
        fp8_experts: bool = False,
        text_only: bool = False,
        fp8_attention: bool = False,
        sm90_experts: object = None,
    ) -> bool:
        return False  # CPU: nothing to build (the engine asks on CUDA only)

    def layout_for(self, with_media: bool) -> Layout:
        return "packed"

    def can_pack(self, with_media: bool) -> bool:
        return True  # no transformers attention here: a packed row needs no dense mask

    def collate(self, encoded: Sequence[EncodedRequest], layout: Layout | None = None) -> ModelBatch:
        self._nan = [self._has_nan(rec.input_ids) for rec in encoded]
        return collate(encoded, layout=layout or "packed")

    def _has_nan(self, ids: Sequence[int]) -> bool:
        n = len(self.nan_id)
        return any(list(ids[i : i + n]) == self.nan_id for i in range(len(ids) - n + 1))

    def launch_batch(
        self, batch: ModelBatch, between: Between | None = None
    ) -> Ready[list[list[npt.NDArray[np.float32]]]]:
        return Ready(self.forward_batch(batch, between))

    def queues_whole(self, batch: ModelBatch) -> bool:
        return len(batch.lengths) <= self.max_records  # as if a graph replayed that many records

    def forward_batch(
        self, batch: ModelBatch, between: Between | None = None
    ) -> list[list[npt.NDArray[np.float32]]]:
        self.batch_sizes.append(len(batch.lengths))
        if len(batch.lengths) > self.max_records:
            raise torch.OutOfMemoryError("fake OOM")
        self.answered.append(len(batch.lengths))
        fill = [np.nan if bad else 1.0 for bad in self._nan]
        return [
            [np.full(n, value, dtype=np.float32) for n in counts]
            for counts, value in zip(batch.options_per_question, fill, strict=True)
        ]


def body(state: str) -> dict[str, Any]:
    return {"state": state, "questions": {"q": {"type": "choice", "criteria": {"a": None, "b": None}}}}


def test_oom_halves_the_batch_and_nan_fails_only_its_record(bpe_tokenizer: Tokenizer) -> None:
    fake = FakeModel(max_records=2, tokenizer=bpe_tokenizer)
    engine = Engine(fake, bpe_tokenizer, EngineConfig(device="cpu", dtype="float32"))
    states = ["one", "two", "nan here", "four", "five"]
    results = engine.decide([body(s) for s in states])
    assert fake.batch_sizes[0] == 5  # tried together first, then halved until it fits
    assert max(fake.answered) <= 2
    assert len(fake.batch_sizes) > 2
    for k, result in enumerate(results):
        if k == 2:
            assert isinstance(result, RequestError)
            assert result.reason is DlqReason.engine_failed
            assert result.status == 500
        else:
            assert isinstance(result, SystemOneResponse)
            answer = result.answers["q"]
            assert answer.type == "choice"
            assert answer.probabilities == {"a": 0.5, "b": 0.5}


def test_a_record_that_runs_out_of_memory_alone_gets_an_error(bpe_tokenizer: Tokenizer) -> None:
    fake = FakeModel(max_records=0, tokenizer=bpe_tokenizer)
    engine = Engine(fake, bpe_tokenizer, EngineConfig(device="cpu", dtype="float32"))
    [result] = engine.decide([body("x")])
    assert isinstance(result, RequestError)
    assert result.reason is DlqReason.oom_single_record


class CrashingModel(FakeModel):
    """Like `FakeModel`, but any batch holding a record whose state says 'crash' raises a plain error
    (as a thinker or processor bug would), not an OOM or NaN."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__(max_records=64, tokenizer=tokenizer)
        self.crash_id = tokenizer.encode("crash", add_special_tokens=False).ids

    def collate(self, encoded: Sequence[EncodedRequest], layout: Layout | None = None) -> ModelBatch:
        n = len(self.crash_id)
        self._crash = any(
            list(rec.input_ids[i : i + n]) == self.crash_id
            for rec in encoded
            for i in range(len(rec.input_ids) - n + 1)
        )
        return super().collate(encoded, layout)

    def forward_batch(
        self, batch: ModelBatch, between: Between | None = None
    ) -> list[list[npt.NDArray[np.float32]]]:
        if self._crash:
            self.batch_sizes.append(len(batch.lengths))
            raise RuntimeError("fake thinker failure quoting the payload: crash")
        return super().forward_batch(batch)


def test_an_unexpected_model_error_fails_only_its_record(bpe_tokenizer: Tokenizer) -> None:
    fake = CrashingModel(bpe_tokenizer)
    engine = Engine(fake, bpe_tokenizer, EngineConfig(device="cpu", dtype="float32"))
    states = ["one", "two", "crash now", "four", "five"]
    results = engine.decide([body(s) for s in states])
    assert fake.batch_sizes[0] == 5  # one batch first; the failure is then narrowed down by halving
    for k, result in enumerate(results):
        if k == 2:
            assert isinstance(result, RequestError)
            assert result.reason is DlqReason.engine_failed
            assert result.status == 500
            assert "payload" not in result.message  # only the exception type is reported
            assert "RuntimeError" in result.message
        else:
            assert isinstance(result, SystemOneResponse), k


def test_an_unexpected_prepare_error_fails_only_its_record(bpe_tokenizer: Tokenizer) -> None:
    fake = FakeModel(max_records=64, tokenizer=bpe_tokenizer)
    engine = Engine(fake, bpe_tokenizer, EngineConfig(device="cpu", dtype="float32"))
    prepare = engine.prepare

    def flaky(request: Any) -> Any:
        if request.state == "bad":
            raise KeyError("internal")
        return prepare(request)

    engine.prepare = flaky  # type: ignore[method-assign]
    results = engine.decide([body("good"), body("bad"), body("also good")])
    assert [type(r).__name__ for r in results] == ["SystemOneResponse", "RequestError", "SystemOneResponse"]
    failed = results[1]
    assert isinstance(failed, RequestError)
    assert failed.reason is DlqReason.engine_failed


class FakeFp8Model(FakeModel):
    """`FakeModel` that reports a CUDA device and a fast path that builds, recording its arguments."""

    def __init__(self, max_records: int, tokenizer: Tokenizer) -> None:
        super().__init__(max_records, tokenizer)

    @property
    def device(self) -> torch.device:
        return torch.device("cuda")

    def enable_fast_path(
        self,
        *,
        graph_buckets: tuple[int, ...] = (),
        fp8_experts: bool = False,
        text_only: bool = False,
        fp8_attention: bool = False,
        sm90_experts: object = None,
    ) -> bool:
        self.built = {"fp8_experts": fp8_experts, "text_only": text_only, "fp8_attention": fp8_attention}
        if sm90_experts is not None:
            self.built["sm90_experts"] = sm90_experts
        return True


def test_fp8_text_only_builds_fp8_experts_and_refuses_media_before_decoding_it(
    bpe_tokenizer: Tokenizer,
) -> None:
    def hook(request: object) -> Any:
        raise AssertionError("the media hook must not run in FP8 text-only mode")

    fake = FakeFp8Model(max_records=8, tokenizer=bpe_tokenizer)
    engine = Engine(fake, bpe_tokenizer, EngineConfig(fp8_text_only=True), media_hook=hook)
    assert fake.built == {"fp8_experts": True, "text_only": True, "fp8_attention": False}
    with_media = {**body("see the screenshot"), "images": ["iVBORw0KGgo="]}
    results = engine.decide([with_media, body("text only")])
    assert isinstance(results[0], RequestError)
    assert results[0].reason == DlqReason.media_undecodable
    assert results[0].status == 400
    assert "FP8 text-only" in results[0].message
    assert isinstance(results[1], SystemOneResponse)


def test_a_model_switched_to_text_only_after_the_engine_started_still_refuses_media(
    bpe_tokenizer: Tokenizer,
) -> None:
    # the benches switch the model's fast path after building the engine: the model says it is text-only
    fake = FakeFp8Model(max_records=8, tokenizer=bpe_tokenizer)
    engine = Engine(fake, bpe_tokenizer, EngineConfig())
    with_media = {**body("see the screenshot"), "images": ["iVBORw0KGgo="]}
    before = engine.decide([with_media])[0]
    assert isinstance(before, RequestError)
    assert "FP8 text-only" not in before.message  # no media hook here: "serves text only"
    assert fake.enable_fast_path(fp8_experts=True, text_only=True)
    after = engine.decide([with_media])[0]
    assert isinstance(after, RequestError)
    assert after.status == 400
    assert "FP8 text-only" in after.message


def test_sm90_experts_are_built_for_the_model_and_handed_to_its_fast_path(
    bpe_tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[torch.device] = []
    extension = object()

    def build_for(device: torch.device) -> object:
        built.append(device)
        return extension

    monkeypatch.setattr(moe_fp8_sm90, "build_for", build_for)
    fake = FakeFp8Model(max_records=8, tokenizer=bpe_tokenizer)
    Engine(fake, bpe_tokenizer, EngineConfig(fp8_experts=True, sm90_experts=True))
    assert built == [torch.device("cuda")]
    assert fake.built["sm90_experts"] is extension
    # without FP8 experts there is nothing for the kernels to run: nothing is built
    plain = FakeFp8Model(max_records=8, tokenizer=bpe_tokenizer)
    Engine(plain, bpe_tokenizer, EngineConfig(sm90_experts=True))
    assert built == [torch.device("cuda")]
    assert "sm90_experts" not in plain.built


def test_sm90_experts_that_cannot_run_stop_the_engine_at_start(bpe_tokenizer: Tokenizer) -> None:
    # the fake says CUDA, but this machine's torch sees no Hopper GPU there (CI has none): a clear error
    fake = FakeFp8Model(max_records=8, tokenizer=bpe_tokenizer)
    with pytest.raises(moe_fp8_sm90.Sm90UnavailableError, match="sm90 expert kernels"):
        Engine(fake, bpe_tokenizer, EngineConfig(fp8_text_only=True, sm90_experts=True))
    assert fake.built == {}


def test_only_one_forward_pass_the_model_queues_whole_is_launched_whole(bpe_tokenizer: Tokenizer) -> None:
    """`Engine.queues_whole`: one part that the model queues whole; a batch of two parts (text and media
    apart on the fast path) calls `between` between them, and a part the model runs eagerly is not."""
    fake = FakeModel(max_records=2, tokenizer=bpe_tokenizer)
    engine = Engine(fake, bpe_tokenizer, EngineConfig(device="cpu", dtype="float32"))
    prepared = [engine.prepare(parse_request(body(s))) for s in ("one", "two", "three")]
    assert engine.queues_whole(engine.stage(prepared[:2]))
    assert not engine.queues_whole(engine.stage(prepared))  # three records: the fake runs them eagerly
    one = engine.stage(prepared[:1])
    two_parts = replace(one, parts=one.parts * 2)
    assert not engine.queues_whole(two_parts)
