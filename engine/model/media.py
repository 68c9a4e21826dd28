"""The thinker's media path: 3D rope positions per record and media-merged input embeddings.

Uses transformers' Qwen3-Omni thinker methods (`get_rope_index`, `get_image_features`,
`get_video_features`, `get_audio_features`) and runs its text model with `inputs_embeds`, the rope
position ids and the deepstack visual embeddings, as the thinker's own forward does -- minus the
language-model head over every token, which Clef never needs.

Works across transformers 5.x: the caller passes the text model (`ClefOmniModel.text_model`, found by
`engine.model.thinker.part_paths`); vision features come back as one tensor or as per-item tuples
(`_flat` joins either); placeholder masks are computed here from the config's token ids rather than
through `get_placeholder_mask`, which moved off the thinker.

Batch invariance: vision towers see every image/video of the batch in one call (their attention is
block-diagonal per item); the audio tower runs once per `MediaBatch.audio_groups` group, so a clip's
chunk padding is the one it gets alone. Plain PyTorch, inference only; call under `inference_mode`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from engine.batching.collate import ModelBatch
from engine.batching.collate_media import MediaBatch
from engine.types import EncodedRequest


def rope_positions(thinker: Any, record: EncodedRequest) -> torch.Tensor:
    """(3, L) int64 t/h/w rope positions of one media record (CPU).

    The rope index runs on the media tokens M alone (shifted by the prefix length); text before M
    counts 0.., text after M continues from M's largest position + 1 -- what `get_rope_index` gives
    for the whole record when the state holds no media tokens, and robust when it does. Raises
    ValueError for a record without media or a non-integral position (a video timing the
    checkpoint was not trained with).
    """
    media, span = record.media, record.media_span
    if not media or span is None:
        raise ValueError("rope_positions needs a record with media and a media span")
    start, end = span
    ids = torch.tensor(record.input_ids[start:end], dtype=torch.int64)[None, :]  # (1, M)
    mask = media.get("feature_attention_mask")
    use_audio = media.get("use_audio_in_video")
    positions, _ = thinker.get_rope_index(
        ids,
        image_grid_thw=media.get("image_grid_thw"),
        video_grid_thw=media.get("video_grid_thw"),
        attention_mask=torch.ones_like(ids),
        use_audio_in_video=bool(use_audio) if use_audio is not None else False,
        audio_seqlens=None if mask is None else mask.sum(-1),
        second_per_grids=media.get("video_second_per_grid"),
    )
    inner = positions[:, 0, :].to(torch.float64)  # (3, M)
    if not torch.equal(inner, inner.round()):
        raise ValueError("media rope positions are not integral")
    middle = inner.round().to(torch.int64) + start  # (3, M)
    after = int(middle.max()) + 1
    head = torch.arange(start, dtype=torch.int64)[None, :].expand(3, start)  # (3, start)
    tail = torch.arange(after, after + record.num_tokens - end, dtype=torch.int64)[None, :]  # (1, L - end)
    return torch.cat([head, middle, tail.expand(3, -1)], dim=1)  # (3, L)


def _flat(features: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    """One (tokens, H) tensor from a tensor or a sequence of per-item tensors."""
    return features if isinstance(features, torch.Tensor) else torch.cat(list(features))


def _placeholder_masks(thinker: Any, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows, cols, 1) bool masks of the image, video and audio pad tokens in `ids`."""
    config = thinker.config
    image = (ids == int(config.image_token_id))[..., None]
    video = (ids == int(config.video_token_id))[..., None]
    audio = (ids == int(config.audio_token_id))[..., None]
    return image, video, audio


def _audio_features(thinker: Any, media: MediaBatch) -> torch.Tensor:
    """(audio tokens, H) audio features, rows in `input_features` order."""
    assert media.input_features is not None
    assert media.feature_attention_mask is not None
    per_row: list[torch.Tensor | None] = [None] * len(media.audio_tokens)
    for group in media.audio_groups:
        rows = torch.tensor(group, dtype=torch.int64, device=media.input_features.device)
        mask = media.feature_attention_mask[rows]  # (g, F)
        out = thinker.get_audio_features(media.input_features[rows], mask, return_dict=True)
        sizes = [media.audio_tokens[r] for r in group]
        for r, part in zip(group, torch.split(out.last_hidden_state, sizes), strict=True):
            per_row[r] = part
    return torch.cat([p for p in per_row if p is not None])  # (A_tokens, H)


def _visual(
    thinker: Any, pixels: torch.Tensor, grid: torch.Tensor, video: bool
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(tokens, H) merged features and the per-deepstack-layer (tokens, H) features of a vision call."""
    get = thinker.get_video_features if video else thinker.get_image_features
    out = get(pixels, grid, return_dict=True)
    return _flat(out.pooler_output), [_flat(layer) for layer in out.deepstack_features]


def _merge_deepstack(
    image: torch.Tensor | None,
    video: torch.Tensor | None,
    image_deep: list[torch.Tensor],
    video_deep: list[torch.Tensor],
) -> tuple[torch.Tensor | None, list[torch.Tensor] | None]:
    """The visual position mask (rows, cols) and each deepstack layer's features in flat token order."""
    if image is None and video is None:
        return None, None
    if image is None or video is None:
        only = image if image is not None else video
        assert only is not None
        return only, image_deep or video_deep
    visual = image | video  # (rows, cols)
    is_image = image[visual]  # (V,) which visual tokens are image tokens
    layers = []
    for img, vid in zip(image_deep, video_deep, strict=True):
        joint = img.new_empty(is_image.shape[0], img.shape[-1])  # (V, H)
        joint[is_image] = img
        joint[~is_image] = vid
        layers.append(joint)
    return visual, layers


def media_hidden_states(thinker: Any, text: Any, batch: ModelBatch) -> torch.Tensor:
    """(rows, cols, H) final normalised hidden states of a batch that carries media, through the thinker's
    towers and its text model `text` (`ClefOmniModel.text_model`)."""
    media = batch.media
    assert media is not None
    embeds: torch.Tensor = text.embed_tokens(batch.input_ids)  # (rows, cols, H)
    ids = media.placeholder_ids.to(embeds.device)
    image_mask, video_mask, audio_mask = _placeholder_masks(thinker, ids)  # 3 x (rows, cols, 1)
    if media.input_features is not None:
        audio = _audio_features(thinker, media).to(embeds.device, embeds.dtype)  # (A_tokens, H)
        _check_count(audio_mask, audio, "audio")
        embeds = embeds.masked_scatter(audio_mask, audio)
    image_pos = video_pos = None
    image_deep: list[torch.Tensor] = []
    video_deep: list[torch.Tensor] = []
    if media.pixel_values is not None and media.image_grid_thw is not None:
        image, image_deep = _visual(thinker, media.pixel_values, media.image_grid_thw, video=False)
        _check_count(image_mask, image, "image")
        embeds = embeds.masked_scatter(image_mask, image.to(embeds.dtype))
        image_pos = image_mask[..., 0]
    if media.pixel_values_videos is not None and media.video_grid_thw is not None:
        video, video_deep = _visual(thinker, media.pixel_values_videos, media.video_grid_thw, video=True)
        _check_count(video_mask, video, "video")
        embeds = embeds.masked_scatter(video_mask, video.to(embeds.dtype))
        video_pos = video_mask[..., 0]
    visual_pos, deepstack = _merge_deepstack(image_pos, video_pos, image_deep, video_deep)
    out = text(
        inputs_embeds=embeds,
        position_ids=batch.position_ids,
        attention_mask=batch.attention_mask,
        use_cache=False,
        visual_pos_masks=visual_pos,
        deepstack_visual_embeds=deepstack,
    )
    hidden: torch.Tensor = out.last_hidden_state  # (rows, cols, H)
    return hidden


def _check_count(mask: torch.Tensor, features: torch.Tensor, kind: str) -> None:
    """Placeholders and features must match one to one (a mismatch is a collate/processor bug)."""
    tokens = int(mask[..., 0].sum())
    if tokens != features.shape[0]:
        raise ValueError(f"{kind}: {tokens} placeholder tokens but {features.shape[0]} feature rows")
