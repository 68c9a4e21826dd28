"""The expanded media token ids M (SPEC section 5) and `prepare_media`, the runner's media hook.

M = per image `<|vision_start|>` + image pads + `<|vision_end|>` + "\\n", then per audio
`<|audio_start|>` + audio pads + `<|audio_end|>` + "\\n", then per video `<|vision_start|>` + video pads +
`<|vision_end|>` + "\\n" -- or, when soundtracks are heard, `<|vision_start|><|audio_start|>`, video and
audio pads interleaved by position id, `<|audio_end|><|vision_end|>` + "\\n" (as Qwen3-Omni's processor).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.media.decode import DecodedMedia, HasMedia, decode_request_media
from engine.media.features import MediaProcessors, MediaTokens, audio_output_length, processor_inputs
from engine.media.limits import MediaLimits, MediaPolicy


@dataclass(frozen=True, slots=True, eq=False)
class PreparedMedia:
    """One record's media: the expanded token ids M and the thinker's media tensors."""

    token_ids: list[int]
    model_inputs: dict[str, torch.Tensor]

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        """`model_inputs` under the name `engine.runner.MediaInputLike` reads."""
        return self.model_inputs


def interleave(video_tokens: int, grid_t: int, audio_tokens: int, per_grid_ids: float) -> list[bool]:
    """Order of a video's pads and its soundtrack's pads (True = video): each temporal group's tokens
    carry position id t * per_grid_ids, audio token k carries k; ties go to video."""
    per_t = video_tokens // grid_t
    video_ids = np.repeat(np.arange(grid_t, dtype=np.float64) * per_grid_ids, per_t)
    order: list[bool] = []
    v = a = 0
    while v < len(video_ids) and a < audio_tokens:
        if video_ids[v] <= a:
            order.append(True)
            v += 1
        else:
            order.append(False)
            a += 1
    order.extend([True] * (len(video_ids) - v))
    order.extend([False] * (audio_tokens - a))
    return order


def media_token_ids(
    media: DecodedMedia, inputs: dict[str, torch.Tensor], tokens: MediaTokens, proc: MediaProcessors
) -> list[int]:
    """M for one record, matching `processor_inputs(media, proc)` (see the module docstring)."""
    merge = proc.merge_size**2
    ids: list[int] = []
    nl = list(tokens.newline)
    for grid in inputs.get("image_grid_thw", torch.zeros(0, 3, dtype=torch.long)).tolist():
        count = grid[0] * grid[1] * grid[2] // merge
        ids += [tokens.vision_start, *([tokens.image_pad] * count), tokens.vision_end, *nl]
    mask = inputs.get("feature_attention_mask")
    audio_lengths = [] if mask is None else [audio_output_length(int(n), proc.n_window) for n in mask.sum(-1)]
    for length in audio_lengths[: len(media.audio)]:
        ids += [tokens.audio_start, *([tokens.audio_pad] * length), tokens.audio_end, *nl]
    soundtracks = iter(audio_lengths[len(media.audio) :])
    seconds_per_grid = inputs.get("video_second_per_grid", torch.zeros(0)).tolist()
    for index, grid in enumerate(inputs.get("video_grid_thw", torch.zeros(0, 3, dtype=torch.long)).tolist()):
        count = grid[0] * grid[1] * grid[2] // merge
        if not media.use_audio_in_video:
            ids += [tokens.vision_start, *([tokens.video_pad] * count), tokens.vision_end, *nl]
            continue
        per_grid_ids = seconds_per_grid[index] * proc.position_id_per_seconds
        order = interleave(count, grid[0], next(soundtracks), per_grid_ids)
        body = [tokens.video_pad if is_video else tokens.audio_pad for is_video in order]
        ids += [tokens.vision_start, tokens.audio_start, *body, tokens.audio_end, tokens.vision_end, *nl]
    return ids


def prepare_media(
    request: HasMedia,
    tokenizer: Any,
    processors: MediaProcessors,
    limits: MediaLimits | None = None,
    policy: MediaPolicy | None = None,
    *,
    tokens: MediaTokens | None = None,
) -> PreparedMedia:
    """Decode a request's media and turn it into (M, thinker tensors).

    Blocking, CPU only. Raises `MediaError` (see `decode_request_media`). A text-only request gives
    an empty token list and no tensors.
    """
    media = decode_request_media(request, limits, policy)
    if media.empty:
        return PreparedMedia([], {})
    inputs = processor_inputs(media, processors)
    ids = media_token_ids(media, inputs, tokens or MediaTokens.from_tokenizer(tokenizer), processors)
    return PreparedMedia(ids, inputs)


def media_hook(
    tokenizer: Any,
    processors: MediaProcessors,
    limits: MediaLimits | None = None,
    policy: MediaPolicy | None = None,
) -> Callable[[HasMedia], PreparedMedia]:
    """A `request -> PreparedMedia` callable with the tokenizer's media ids resolved once."""
    tokens = MediaTokens.from_tokenizer(tokenizer)

    def hook(request: HasMedia) -> PreparedMedia:
        return prepare_media(request, tokenizer, processors, limits, policy, tokens=tokens)

    return hook
