"""DecodedMedia -> the Qwen3-Omni thinker's processor inputs and the expanded media token ids M.

Gives what the Qwen3-Omni processor gives for a prompt whose media placeholders come in SPEC order
(images, audio, videos, each placeholder followed by "\\n"):
- images: `engine.media.vision` in the release's image window -> `pixel_values`, `image_grid_thw`;
  each image's pad token is repeated grid_t*grid_h*grid_w / merge_size**2 times;
- audio: transformers' `WhisperFeatureExtractor` (padding to the longest, attention mask) ->
  `input_features`, `feature_attention_mask`; pad count = the audio encoder's output length;
- videos (already 2 fps, never re-sampled): `engine.media.vision` in the Qwen3-Omni video window ->
  `pixel_values_videos`, `video_grid_thw`, `video_second_per_grid` (temporal_patch_size / 2 fps);
  with soundtracks heard, each video's tokens interleave with its soundtrack's by position id (13 per
  second) inside `<|vision_start|><|audio_start|> ... <|audio_end|><|vision_end|>`, soundtracks
  appended to the audio list after the standalone audio.
CPU only, blocking; thread-safe (the feature extractor holds no per-call state).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.media.decode import DecodedMedia
from engine.media.limits import SAMPLE_RATE, VIDEO_FPS
from engine.media.vision import VisionConfig, image_pixels, video_pixels

SPECIAL = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
AUDIO_SPECIAL = ("<|audio_start|>", "<|audio_end|>", "<|audio_pad|>")


def audio_output_length(feature_frames: int, n_window: int = 50) -> int:
    """Tokens the Qwen3-Omni audio encoder emits for `feature_frames` mel frames (chunks of 2*n_window,
    three stride-2 convolutions per chunk; a full chunk gives 13 tokens)."""
    chunk = n_window * 2
    rest = feature_frames % chunk
    after_first = (rest - 1) // 2 + 1
    tail = ((after_first - 1) // 2 + 1 - 1) // 2 + 1
    return int(tail + (feature_frames // chunk) * 13)


@dataclass(frozen=True, slots=True)
class MediaTokens:
    """Token ids of the media placeholders, read from the release tokenizer."""

    vision_start: int
    vision_end: int
    image_pad: int
    video_pad: int
    audio_start: int
    audio_end: int
    audio_pad: int
    newline: tuple[int, ...]

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> MediaTokens:
        """Raises ValueError when the tokenizer lacks one of the media tokens."""
        ids = {}
        for token in (*SPECIAL, *AUDIO_SPECIAL):
            value = tokenizer.convert_tokens_to_ids(token)
            # A transformers tokenizer returns its `unk_token_id` for a token it lacks; tokenizer-like objects
            # without an unknown token may have no such attribute.
            if not isinstance(value, int) or value < 0 or value == getattr(tokenizer, "unk_token_id", None):
                raise ValueError(f"tokenizer has no {token} token")
            ids[token] = value
        newline = tuple(int(i) for i in tokenizer.encode("\n", add_special_tokens=False))
        return cls(
            vision_start=ids["<|vision_start|>"],
            vision_end=ids["<|vision_end|>"],
            image_pad=ids["<|image_pad|>"],
            video_pad=ids["<|video_pad|>"],
            audio_start=ids["<|audio_start|>"],
            audio_end=ids["<|audio_end|>"],
            audio_pad=ids["<|audio_pad|>"],
            newline=newline,
        )


@dataclass(frozen=True, slots=True)
class MediaProcessors:
    """The release's vision settings (`engine.media.vision`) and audio feature extractor, plus the
    expansion constants. Build once per release with `from_release`; share across threads."""

    vision: VisionConfig
    feature_extractor: Any
    n_window: int = 50
    position_id_per_seconds: float = 13.0

    @property
    def merge_size(self) -> int:
        return self.vision.merge_size

    @property
    def temporal_patch_size(self) -> int:
        return self.vision.temporal_patch_size

    @classmethod
    def from_release(cls, release_dir: str | Path) -> MediaProcessors:
        """Read `processor_config.json` (and `config.json` for n_window / position ids) of a release.

        The video pixel window is the Qwen3-Omni processor's (`vision.VIDEO_WINDOW`), whatever the
        release's `video_processor.size` says (SPEC section 6). Raises OSError, KeyError or ValueError
        for a missing or unsupported processor configuration.
        """
        from transformers import WhisperFeatureExtractor

        feature_cls: Any = WhisperFeatureExtractor
        root = Path(release_dir)
        config = json.loads((root / "processor_config.json").read_text())
        audio_cfg = {k: v for k, v in config["feature_extractor"].items() if not k.endswith("_type")}
        thinker: dict[str, Any] = {}
        if (root / "config.json").exists():
            thinker = json.loads((root / "config.json").read_text()).get("thinker_config", {})
        return cls(
            vision=VisionConfig.from_processor_config(config["image_processor"]),
            feature_extractor=feature_cls(**audio_cfg),
            n_window=int(thinker.get("audio_config", {}).get("n_window", 50)),
            position_id_per_seconds=float(thinker.get("position_id_per_seconds", 13.0)),
        )


def _images(media: DecodedMedia, proc: MediaProcessors) -> dict[str, torch.Tensor]:
    parts = [image_pixels(np.asarray(image, dtype=np.uint8), proc.vision) for image in media.images]
    return {
        "pixel_values": torch.cat([pixels for pixels, _ in parts]),  # (patches, C*tp*p*p)
        "image_grid_thw": torch.tensor([grid for _, grid in parts], dtype=torch.long),  # (images, 3)
    }


def _videos(media: DecodedMedia, proc: MediaProcessors) -> dict[str, torch.Tensor]:
    parts = [video_pixels(video.frames, proc.vision) for video in media.videos]
    per_grid = proc.temporal_patch_size / VIDEO_FPS
    return {
        "pixel_values_videos": torch.cat([pixels for pixels, _ in parts]),  # (patches, C*tp*p*p)
        "video_grid_thw": torch.tensor([grid for _, grid in parts], dtype=torch.long),  # (videos, 3)
        "video_second_per_grid": torch.full((len(media.videos),), per_grid, dtype=torch.float32),
    }


def processor_inputs(media: DecodedMedia, proc: MediaProcessors) -> dict[str, torch.Tensor]:
    """The thinker's media keyword tensors for one record (empty dict for text-only media)."""
    inputs: dict[str, torch.Tensor] = {}
    if media.images:
        inputs.update(_images(media, proc))
    sounds = list(media.audio)
    if media.use_audio_in_video:
        sounds += [v.audio for v in media.videos if v.audio is not None]
    if sounds:
        out = proc.feature_extractor(
            sounds,
            sampling_rate=SAMPLE_RATE,
            padding=True,
            truncation=False,
            return_attention_mask=True,
            return_tensors="pt",
        )
        inputs["input_features"] = out["input_features"]
        inputs["feature_attention_mask"] = out["attention_mask"]
    if media.videos:
        inputs.update(_videos(media, proc))
        inputs["use_audio_in_video"] = torch.tensor(media.use_audio_in_video)
    return inputs
