"""Processor inputs and media token expansion against the tiny release, with transformers' own
Qwen3-Omni placeholder expansion as the oracle for M."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer
from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import Qwen3OmniMoeProcessor

from devtools.tiny_release import write_tiny_release
from engine.media import decode_request_media
from engine.media.expand import interleave, media_hook, prepare_media
from engine.media.features import MediaProcessors, audio_output_length
from tests.unit.engine.media.mediagen import Req, audio_bytes, b64, png_bytes, video_bytes


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_release(tmp_path_factory.mktemp("tiny") / "release")


@pytest.fixture(scope="module")
def tokenizer(release: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(release))


@pytest.fixture(scope="module")
def processors(release: Path) -> MediaProcessors:
    return MediaProcessors.from_release(release)


def oracle_ids(
    tokenizer: Any, processors: MediaProcessors, request: Req, inputs: dict[str, torch.Tensor]
) -> list[int]:
    """Expand the SPEC placeholders with transformers' Qwen3OmniMoeProcessor logic, then tokenize.

    That helper is transformers 5.17's (later versions split it up): without it the oracle test is
    skipped; test_media_conformance.py checks the expansion against the vendor fixture on every version.
    """
    if not hasattr(Qwen3OmniMoeProcessor, "replace_multimodal_special_tokens"):
        pytest.skip("this transformers has no Qwen3OmniMoeProcessor.replace_multimodal_special_tokens")
    text = (
        "<|vision_start|><|image_pad|><|vision_end|>\n" * len(request.images)
        + "<|audio_start|><|audio_pad|><|audio_end|>\n" * len(request.audio)
        + "<|vision_start|><|video_pad|><|vision_end|>\n" * len(request.videos)
    )
    fake = SimpleNamespace(
        audio_token="<|audio_pad|>",
        image_token="<|image_pad|>",
        video_token="<|video_pad|>",
        vision_bos_token="<|vision_start|>",
        vision_eos_token="<|vision_end|>",
        audio_bos_token="<|audio_start|>",
        audio_eos_token="<|audio_end|>",
        image_processor=SimpleNamespace(merge_size=processors.merge_size),
        video_processor=SimpleNamespace(merge_size=processors.merge_size),
    )
    mask = inputs.get("feature_attention_mask")
    lengths = [] if mask is None else [audio_output_length(int(n), processors.n_window) for n in mask.sum(-1)]
    use_audio = bool(inputs["use_audio_in_video"]) if "use_audio_in_video" in inputs else False
    expanded = Qwen3OmniMoeProcessor.replace_multimodal_special_tokens(
        fake,
        [text],
        iter(lengths),
        iter(inputs.get("image_grid_thw", torch.zeros(0, 3)).numpy()),
        iter(inputs.get("video_grid_thw", torch.zeros(0, 3)).numpy()),
        video_second_per_grid=iter(inputs.get("video_second_per_grid", torch.zeros(0)).tolist()),
        use_audio_in_video=use_audio,
        position_id_per_seconds=processors.position_id_per_seconds,
        seconds_per_chunk=2.0,
    )[0]
    return list(tokenizer(expanded, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("sound", [True, False])
def test_token_expansion_matches_the_qwen3_omni_processor(
    tokenizer: Any, processors: MediaProcessors, sound: bool
) -> None:
    request = Req(
        images=[b64(png_bytes(400, 300)), b64(png_bytes(50, 40))],
        audio=[b64(audio_bytes(3.0, "wav")), b64(audio_bytes(1.2, "mp3"))],
        videos=[b64(video_bytes(seconds=5.0, sound=sound, width=320, height=240))] * 2,
    )
    prepared = prepare_media(request, tokenizer, processors)
    inputs = prepared.model_inputs
    assert bool(inputs["use_audio_in_video"]) is sound
    assert inputs["input_features"].shape[0] == (4 if sound else 2)
    assert prepared.token_ids == oracle_ids(tokenizer, processors, request, inputs)
    pads = tokenizer.convert_tokens_to_ids(["<|image_pad|>", "<|video_pad|>"])
    image_rows = int(inputs["image_grid_thw"].prod(-1).sum())
    video_rows = int(inputs["video_grid_thw"].prod(-1).sum())
    assert inputs["pixel_values"].shape[0] == image_rows
    assert inputs["pixel_values_videos"].shape[0] == video_rows
    assert prepared.token_ids.count(pads[0]) == image_rows // 4
    assert prepared.token_ids.count(pads[1]) == video_rows // 4
    assert inputs["video_second_per_grid"].tolist() == [1.0, 1.0]


def test_video_patches_keep_each_frame_in_its_temporal_slot(processors: MediaProcessors) -> None:
    frames = np.zeros((2, 256, 256, 3), dtype=np.uint8)
    frames[1] += 200
    media = decode_request_media(Req(videos=[frames]))
    hook_inputs = prepare_media(Req(videos=[frames]), None, processors, tokens=_dummy_tokens()).model_inputs
    rows = hook_inputs["pixel_values_videos"].reshape(-1, 3, processors.temporal_patch_size, 16 * 16)
    assert media.videos[0].frames.shape[0] == 2
    assert torch.allclose(rows[:, :, 0], torch.full_like(rows[:, :, 0], -1.0))
    assert torch.allclose(rows[:, :, 1], torch.full_like(rows[:, :, 1], 200 / 255 * 2 - 1), atol=1e-3)


def _dummy_tokens() -> Any:
    from engine.media.features import MediaTokens

    return MediaTokens(1, 2, 3, 4, 5, 6, 7, (8,))


def test_interleave_orders_by_position_id() -> None:
    # 2 temporal groups of 2 tokens at ids 0 and 13; 15 audio tokens at ids 0..14.
    order = interleave(4, 2, 15, 13.0)
    assert order[:3] == [True, True, False]
    assert order.count(True) == 4
    assert order.count(False) == 15
    assert order.index(True, 2) == 2 + 13  # the second group comes after audio tokens 0..12


def test_text_only_and_hook(tokenizer: Any, processors: MediaProcessors) -> None:
    hook = media_hook(tokenizer, processors)
    assert hook(Req()).token_ids == []
    assert hook(Req(images=[b64(png_bytes(300, 300))])).token_ids[0] == tokenizer.convert_tokens_to_ids(
        "<|vision_start|>"
    )
