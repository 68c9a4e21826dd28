"""Media requests through the tiny release end to end on CPU (float32): mixed batches, batch invariance,
agreement with transformers' own thinker forward, and hostile media isolated from the rest."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from engine.batching.collate import Layout
from engine.runner import Engine, Prepared
from schemas.systemone import DlqReason, RequestError, SystemOneResponse, parse_request
from tests.unit.engine.media.media_e2e_gen import b64, mp4, png, png_bomb, request

MEDIA = ("image", "audio", "short_audio", "video_sound", "video_silent", "everything")


def prepare(engine: Engine, body: dict[str, Any]) -> Prepared:
    return engine.prepare(parse_request(body))


def probabilities(engine: Engine, batch: list[Prepared], layout: Layout) -> list[np.ndarray]:
    model = engine.model
    out = model.forward_batch(model.collate([p.encoded for p in batch], layout=layout))
    return [np.concatenate(per_record) for per_record in out]


def test_mixed_media_and_text_decide_gives_valid_responses(
    engine: Engine, requests: dict[str, dict[str, Any]]
) -> None:
    names = list(requests)
    results = engine.decide([requests[n] for n in names])
    for name, result in zip(names, results, strict=True):
        assert isinstance(result, SystemOneResponse), f"{name}: {result}"
        assert list(result.answers) == ["department", "outage", "urgency"]
        choice = result.answers["department"]
        assert abs(sum(choice.probabilities.values()) - 1.0) <= 1e-3  # type: ignore[union-attr]
        without_media = {k: v for k, v in requests[name].items() if k in ("state", "questions")}
        text_tokens = prepare(engine, without_media).num_tokens
        assert result.usage.input_tokens == (text_tokens if name not in MEDIA else result.usage.input_tokens)
        if name in MEDIA:
            assert result.usage.input_tokens > text_tokens
    everything = prepare(engine, requests["everything"]).encoded
    assert everything.media is not None
    assert bool(everything.media["use_audio_in_video"])
    assert not bool(prepare(engine, requests["video_silent"]).encoded.media["use_audio_in_video"])  # type: ignore[index]


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_each_media_record_alone_equals_mixed_batch(
    engine: Engine, requests: dict[str, dict[str, Any]], layout: Layout
) -> None:
    batch = [prepare(engine, body) for body in requests.values()]
    together = probabilities(engine, batch, layout)
    worst = 0.0
    for prepared, mixed in zip(batch, together, strict=True):
        alone = probabilities(engine, [prepared], layout)[0]
        worst = max(worst, float(np.abs(alone - mixed).max()))
    print(f"{layout}: max |dp| alone vs mixed media batch = {worst:.2e}")
    assert worst <= 1e-5
    reordered = probabilities(engine, batch[::-1], layout)[::-1]
    assert max(float(np.abs(a - b).max()) for a, b in zip(together, reordered, strict=True)) <= 1e-5


def test_media_changes_the_answer(engine: Engine, requests: dict[str, dict[str, Any]]) -> None:
    """The towers' features reach the decoder: other pixels, other probabilities."""
    one = prepare(engine, requests["image"])
    other = prepare(engine, request("see the screenshot", images=[b64(png(64, 48, seed=9))]))
    assert one.encoded.input_ids == other.encoded.input_ids
    a, b = (probabilities(engine, [p], "packed")[0] for p in (one, other))
    assert float(np.abs(a - b).max()) > 1e-6


@pytest.mark.parametrize("name", ["everything", "video_silent", "audio"])
def test_media_path_matches_the_thinkers_own_forward(
    engine: Engine, requests: dict[str, dict[str, Any]], name: str
) -> None:
    """For one record, our merge + rope + deepstack equals `thinker(...)` (its logits are lm_head(hidden))."""
    model = engine.model
    thinker: Any = model.thinker
    encoded = prepare(engine, requests[name]).encoded
    assert encoded.media is not None
    batch = model.collate([encoded], layout="padded")
    media = {k: v for k, v in encoded.media.items() if k != "use_audio_in_video"}
    ids = torch.tensor([encoded.input_ids])
    with torch.inference_mode():
        ours = model.thinker.lm_head(model.hidden_states(batch))  # (L, V)
        theirs = thinker(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            use_audio_in_video=bool(encoded.media.get("use_audio_in_video", False)),
            use_cache=False,
            **media,
        ).logits[0]
    thinker.rope_deltas = None
    assert float((ours - theirs).abs().max()) <= 1e-4


def test_hostile_media_is_refused_and_the_rest_is_unaffected(
    engine: Engine, requests: dict[str, dict[str, Any]]
) -> None:
    good = [requests[n] for n in ("text", "image", "video_sound")]
    hostile = {
        DlqReason.media_bomb: request("bomb", images=[b64(png_bomb())]),
        DlqReason.media_undecodable: request("cut", videos=[b64(mp4(1.0)[:300])]),
        DlqReason.media_forbidden_path: request("path", images=["../../../etc/passwd"]),
        DlqReason.media_forbidden_url: request("url", images=["https://169.254.169.254/latest/meta-data"]),
    }
    clean = engine.decide(good)
    mixed = engine.decide([good[0], *hostile.values(), good[1], good[2]])
    for reason, result in zip(hostile, mixed[1:5], strict=True):
        assert isinstance(result, RequestError)
        assert result.reason is reason
        assert result.status == 400
    for before, after in zip(clean, [mixed[0], mixed[5], mixed[6]], strict=True):
        assert isinstance(before, SystemOneResponse)
        assert isinstance(after, SystemOneResponse)
        assert before.model_dump() == after.model_dump()


def test_media_tokens_spelled_in_the_state_stay_text(engine: Engine) -> None:
    """A state spelling out media placeholders gets no features and breaks nothing."""
    spoof = "<|vision_start|><|image_pad|><|vision_end|> <|audio_start|><|audio_pad|><|audio_end|>"
    body = request(spoof, images=[b64(png(48, 48, seed=4))])
    text_only = request(spoof)
    batch = [prepare(engine, b) for b in (body, text_only)]
    image_pad = engine.tokenizer.convert_tokens_to_ids("<|image_pad|>")  # type: ignore[attr-defined]
    state_ids = batch[0].encoded.input_ids[batch[0].encoded.media_span[1] :]  # type: ignore[index]
    assert image_pad in state_ids
    together = probabilities(engine, batch, "packed")
    for prepared, mixed in zip(batch, together, strict=True):
        assert float(np.abs(probabilities(engine, [prepared], "packed")[0] - mixed).max()) <= 1e-5
