"""Pixels for the Qwen3-Omni vision tower: resize into a pixel window, normalise, cut into patches.

This is the Qwen vision processors' computation (SPEC section 6), owned here rather than called from
transformers because the library's result depends on its version and on whether torchvision is
installed (the PIL backend resizes differently; the video processor's pixel cap changed default in
5.22), while the engine must give the same pixels under every supported version. Only torch is used:
- size: each side rounded to a multiple of `factor` (= patch_size x merge_size); if that leaves the
  window, both sides are scaled by sqrt(area ratio) and floored (too large) or ceiled (too small) to
  multiples of `factor`;
- resize: bicubic with antialiasing on the uint8 RGB pixels, giving uint8 (torch's native uint8 kernel,
  what torchvision runs on CPU);
- normalise: float32 (x - mean/rescale) / (std/rescale), the fused form of rescale-then-normalise;
- patches: rows of C x temporal_patch_size x patch x patch values, ordered by merge window (rows of
  merge windows, then the merge_size x merge_size patches inside one), one row group per temporal
  patch; an image is its own frame repeated temporal_patch_size times.
CPU only, blocking, thread-safe (no state).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

IMAGE_WINDOW = (65_536, 1_048_576)
"""Default image pixel window (shortest_edge, longest_edge) when the release does not give one."""
VIDEO_WINDOW = (131_072, 786_432)
"""The Qwen3-Omni processor's video window; it overrides the release's `video_processor.size`."""
BICUBIC = 3
"""PIL's resample code for bicubic, the only resample the Qwen vision processors use."""


@dataclass(frozen=True, slots=True)
class VisionConfig:
    """Patch geometry, normalisation and pixel windows of the vision processors."""

    patch_size: int = 16
    merge_size: int = 2
    temporal_patch_size: int = 2
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    image_window: tuple[int, int] = IMAGE_WINDOW
    video_window: tuple[int, int] = VIDEO_WINDOW

    @property
    def factor(self) -> int:
        """Both resized sides are multiples of this (one merge window)."""
        return self.patch_size * self.merge_size

    @classmethod
    def from_processor_config(cls, image: dict[str, Any]) -> VisionConfig:
        """Read the release's `image_processor` section; raise ValueError for settings this module does
        not implement (no resize, no rescale/normalise, a resample other than bicubic)."""
        for flag in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb"):
            if not image.get(flag, True):
                raise ValueError(f"image processor setting {flag}=false is not supported")
        if int(image.get("resample", BICUBIC)) != BICUBIC:
            raise ValueError("only bicubic resampling (resample=3) is supported")
        size = image.get("size") or {}
        default = cls()
        mean = tuple(float(x) for x in image.get("image_mean", default.image_mean))
        std = tuple(float(x) for x in image.get("image_std", default.image_std))
        if len(mean) != 3 or len(std) != 3:
            raise ValueError("image_mean and image_std need three values")
        return cls(
            patch_size=int(image.get("patch_size", default.patch_size)),
            merge_size=int(image.get("merge_size", default.merge_size)),
            temporal_patch_size=int(image.get("temporal_patch_size", default.temporal_patch_size)),
            image_mean=(mean[0], mean[1], mean[2]),
            image_std=(std[0], std[1], std[2]),
            rescale_factor=float(image.get("rescale_factor", default.rescale_factor)),
            image_window=(
                int(size.get("shortest_edge", IMAGE_WINDOW[0])),
                int(size.get("longest_edge", IMAGE_WINDOW[1])),
            ),
        )


def window_size(height: int, width: int, factor: int, window: tuple[int, int]) -> tuple[int, int]:
    """(height, width): multiples of `factor` near the source, inside `window` = (min, max) pixels."""
    low, high = window
    new_h = round(height / factor) * factor
    new_w = round(width / factor) * factor
    if new_h * new_w > high:
        beta = math.sqrt(height * width / high)
        new_h = max(factor, math.floor(height / beta / factor) * factor)
        new_w = max(factor, math.floor(width / beta / factor) * factor)
    elif new_h * new_w < low:
        beta = math.sqrt(low / (height * width))
        new_h = math.ceil(height * beta / factor) * factor
        new_w = math.ceil(width * beta / factor) * factor
    return new_h, new_w


def _resize_normalise(frames: torch.Tensor, size: tuple[int, int], cfg: VisionConfig) -> torch.Tensor:
    """(N, 3, H, W) uint8 -> (N, 3, h, w) float32 normalised pixels."""
    if tuple(frames.shape[-2:]) != size:
        frames = torch.nn.functional.interpolate(frames, size=size, mode="bicubic", antialias=True)  # uint8
    scale = 1.0 / cfg.rescale_factor
    mean = (torch.tensor(cfg.image_mean, dtype=torch.float32) * scale).view(1, 3, 1, 1)
    std = (torch.tensor(cfg.image_std, dtype=torch.float32) * scale).view(1, 3, 1, 1)
    return (frames.to(torch.float32) - mean) / std  # (N, 3, h, w)


def _patches(frames: torch.Tensor, cfg: VisionConfig) -> torch.Tensor:
    """(T, 3, h, w) float32 with T a multiple of temporal_patch_size -> (T/tp * gh * gw, 3*tp*p*p)."""
    count, channels, height, width = frames.shape
    p, m, tp = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    gt, gh, gw = count // tp, height // p, width // p
    x = frames.reshape(gt, tp, channels, gh // m, m, p, gw // m, m, p)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)  # (gt, gh/m, gw/m, m, m, C, tp, p, p)
    return x.reshape(gt * gh * gw, channels * tp * p * p)


def _to_tensor(frames: npt.NDArray[np.uint8]) -> torch.Tensor:
    """(N, H, W, 3) uint8 numpy -> contiguous (N, 3, H, W) uint8 tensor (a copy; the input may be a
    read-only view of a PIL image)."""
    return torch.from_numpy(np.array(frames, dtype=np.uint8)).permute(0, 3, 1, 2).contiguous()


def image_pixels(image: npt.NDArray[np.uint8], cfg: VisionConfig) -> tuple[torch.Tensor, list[int]]:
    """One (H, W, 3) uint8 RGB image -> (gh * gw, 3*tp*p*p) float32 rows and its grid [1, gh, gw]."""
    size = window_size(image.shape[0], image.shape[1], cfg.factor, cfg.image_window)
    frame = _resize_normalise(_to_tensor(image[None]), size, cfg)  # (1, 3, h, w)
    frames = frame.expand(cfg.temporal_patch_size, -1, -1, -1)  # the image is every frame of its patch
    return _patches(frames, cfg), [1, size[0] // cfg.patch_size, size[1] // cfg.patch_size]


def video_pixels(frames: npt.NDArray[np.uint8], cfg: VisionConfig) -> tuple[torch.Tensor, list[int]]:
    """(T, H, W, 3) uint8 RGB frames -> (gt * gh * gw, 3*tp*p*p) float32 rows and the grid [gt, gh, gw].

    A frame count that is not a multiple of temporal_patch_size gets the last frame repeated.
    """
    size = window_size(frames.shape[1], frames.shape[2], cfg.factor, cfg.video_window)
    pixels = _resize_normalise(_to_tensor(frames), size, cfg)  # (T, 3, h, w)
    if pad := -pixels.shape[0] % cfg.temporal_patch_size:
        pixels = torch.cat([pixels, pixels[-1:].expand(pad, -1, -1, -1)])
    grid = [pixels.shape[0] // cfg.temporal_patch_size, size[0] // cfg.patch_size, size[1] // cfg.patch_size]
    return _patches(pixels, cfg), grid
