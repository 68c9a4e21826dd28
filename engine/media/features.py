"""DecodedMedia -> the Qwen3-Omni thinker's processor inputs and the expanded media token ids M.

Mirrors what transformers' `Qwen3OmniMoeProcessor` does for a prompt whose media placeholders come in
SPEC order (images, audio, videos, each placeholder followed by "\\n"):
- images: `Qwen2VLImageProcessor(Pil)` -> `pixel_values`, `image_grid_thw`; each image's pad token is
  repeated grid_t*grid_h*grid_w / merge_size**2 times;
- audio: `WhisperFeatureExtractor` (padding to the longest, attention mask) -> `input_features`,
  `feature_attention_mask`; pad count = the audio encoder's output length for the mask length;
- videos (already 2 fps): `Qwen2VLVideoProcessor` when torchvision is installed, else the same patch
  layout built from the image processor frame by frame -> `pixel_values_videos`, `video_grid_thw`,
  `video_second_per_grid` (temporal_patch_size / 2 fps); with soundtracks heard, each video's tokens
  interleave with its soundtrack's by position id (13 per second) inside
  `<|vision_start|><|audio_start|> ... <|audio_end|><|vision_end|>`, soundtracks appended to the audio
  list after the standalone audio.
CPU only, blocking; thread-safe as long as the processors are (they hold no per-call state).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from engine.media.decode import DecodedMedia
from engine.media.limits import SAMPLE_RATE, VIDEO_FPS
from engine.media.video import DecodedVideo

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
    """The release's image processor, video processor (None without torchvision) and feature extractor,
    plus the expansion constants. Build once per release with `from_release`; share across threads."""

    image_processor: Any
    video_processor: Any | None
    feature_extractor: Any
    video_min_pixels: int
    video_max_pixels: int
    merge_size: int
    temporal_patch_size: int
    n_window: int = 50
    position_id_per_seconds: float = 13.0

    @classmethod
    def from_release(cls, release_dir: str | Path) -> MediaProcessors:
        """Read `processor_config.json` (and `config.json` for n_window / position ids) of a release."""
        from transformers import WhisperFeatureExtractor
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        feature_cls: Any = WhisperFeatureExtractor
        image_cls: Any = Qwen2VLImageProcessorPil
        root = Path(release_dir)
        config = json.loads((root / "processor_config.json").read_text())
        image_cfg = {k: v for k, v in config["image_processor"].items() if not k.endswith("_type")}
        video_cfg = {k: v for k, v in config["video_processor"].items() if not k.endswith("_type")}
        audio_cfg = {k: v for k, v in config["feature_extractor"].items() if not k.endswith("_type")}
        video_processor: Any | None
        try:
            from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

            video_cls: Any = Qwen2VLVideoProcessor
            video_processor = video_cls(**video_cfg)
        except ImportError:  # transformers' video processors need torchvision
            video_processor = None
        thinker: dict[str, Any] = {}
        if (root / "config.json").exists():
            thinker = json.loads((root / "config.json").read_text()).get("thinker_config", {})
        size = video_cfg.get("size", {})
        return cls(
            image_processor=image_cls(**image_cfg),
            video_processor=video_processor,
            feature_extractor=feature_cls(**audio_cfg),
            video_min_pixels=int(size.get("shortest_edge", 128 * 32 * 32)),
            video_max_pixels=int(size.get("longest_edge", 768 * 32 * 32)),
            merge_size=int(video_cfg.get("merge_size", 2)),
            temporal_patch_size=int(video_cfg.get("temporal_patch_size", 2)),
            n_window=int(thinker.get("audio_config", {}).get("n_window", 50)),
            position_id_per_seconds=float(thinker.get("position_id_per_seconds", 13.0)),
        )


def _video_patches(video: DecodedVideo, proc: MediaProcessors) -> tuple[npt.NDArray[np.float32], list[int]]:
    """One video's (rows, C*tp*p*p) patches and [t, h, w] grid, through the image processor per frame."""
    size = {"shortest_edge": proc.video_min_pixels, "longest_edge": proc.video_max_pixels}
    out = proc.image_processor(images=list(video.frames), size=size, return_tensors="np")
    grid = [int(x) for x in out["image_grid_thw"][0]]
    frames = video.frames.shape[0]
    tp = proc.temporal_patch_size
    rows = np.asarray(out["pixel_values"], dtype=np.float32).reshape(frames, grid[1] * grid[2], 3, tp, -1)
    groups = [
        np.concatenate([rows[g * tp + j][:, :, :1] for j in range(tp)], axis=2) for g in range(frames // tp)
    ]
    patches = np.concatenate(groups, axis=0).reshape(len(groups) * grid[1] * grid[2], -1)
    return patches, [frames // tp, grid[1], grid[2]]


def _videos(media: DecodedMedia, proc: MediaProcessors) -> dict[str, torch.Tensor]:
    if proc.video_processor is not None:
        out = proc.video_processor(
            videos=[v.frames for v in media.videos],
            size={"shortest_edge": proc.video_min_pixels, "longest_edge": proc.video_max_pixels},
            do_sample_frames=False,
            return_tensors="pt",
        )
        pixels, grids = out["pixel_values_videos"], out["video_grid_thw"]
    else:
        parts = [_video_patches(v, proc) for v in media.videos]
        pixels = torch.from_numpy(np.concatenate([p for p, _ in parts]))
        grids = torch.tensor([g for _, g in parts], dtype=torch.long)
    per_grid = proc.temporal_patch_size / VIDEO_FPS
    return {
        "pixel_values_videos": pixels,
        "video_grid_thw": grids,
        "video_second_per_grid": torch.full((len(media.videos),), per_grid, dtype=torch.float32),
    }


def processor_inputs(media: DecodedMedia, proc: MediaProcessors) -> dict[str, torch.Tensor]:
    """The thinker's media keyword tensors for one record (empty dict for text-only media)."""
    inputs: dict[str, torch.Tensor] = {}
    if media.images:
        out = proc.image_processor(images=list(media.images), return_tensors="pt")
        inputs["pixel_values"] = out["pixel_values"]
        inputs["image_grid_thw"] = out["image_grid_thw"]
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
