"""Vision pixels (engine.media.vision): pixel windows, the uint8 bicubic resize, normalisation and the
patch layout, against the vendor fixture's grids and transformers' own Qwen2-VL image processor."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil, smart_resize

from engine.media.vision import VIDEO_WINDOW, VisionConfig, image_pixels, video_pixels, window_size

CFG = VisionConfig()


@pytest.mark.parametrize(
    ("height", "width", "window", "expected"),
    [
        # Grids of the conformance fixture's images and video frames (x 16 pixels).
        (48, 64, CFG.image_window, (224, 320)),  # upscaled into the window
        (240, 320, CFG.image_window, (256, 320)),
        (150, 200, CFG.image_window, (224, 320)),
        (1200, 1600, CFG.image_window, (864, 1152)),  # downscaled
        (120, 160, VIDEO_WINDOW, (320, 448)),  # video frames use the Qwen3-Omni video window
        (444, 592, VIDEO_WINDOW, (448, 576)),
        (384, 682, VIDEO_WINDOW, (384, 672)),
        (300, 400, VIDEO_WINDOW, (320, 448)),
    ],
)
def test_window_sizes_of_the_fixture(
    height: int, width: int, window: tuple[int, int], expected: tuple[int, int]
) -> None:
    assert window_size(height, width, 32, window) == expected


@pytest.mark.parametrize(("height", "width"), [(1, 150), (7, 3), (3000, 5000), (1025, 1024), (33, 6000)])
def test_window_size_agrees_with_transformers(height: int, width: int) -> None:
    low, high = CFG.image_window
    assert window_size(height, width, 32, CFG.image_window) == smart_resize(height, width, 32, low, high)


def test_image_patches_match_the_qwen2_vl_image_processor_without_resize() -> None:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (256, 320, 3), dtype=np.uint8)  # already on the window grid: no resize
    ours, grid = image_pixels(image, CFG)
    reference = Qwen2VLImageProcessorPil(
        size={"shortest_edge": 65_536, "longest_edge": 1_048_576},
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )(images=[image], return_tensors="pt")
    assert grid == reference["image_grid_thw"][0].tolist() == [1, 16, 20]
    assert ours.dtype == torch.float32
    assert ours.shape == reference["pixel_values"].shape
    assert torch.allclose(ours, reference["pixel_values"], atol=1e-6, rtol=0)


def test_resize_is_uint8_bicubic_then_exact_normalisation() -> None:
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (500, 700, 3), dtype=np.uint8)  # resized to 512x704
    small = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)  # upscaled to 224x320
    for source in (image, small):
        rows, _ = image_pixels(source, CFG)
        levels = rows * 127.5 + 127.5  # (x - 127.5) / 127.5 of uint8 values: whole numbers again
        assert torch.equal(levels, levels.round())
        assert float(levels.min()) >= 0
        assert float(levels.max()) <= 255
    expected = torch.nn.functional.interpolate(
        torch.from_numpy(small).permute(2, 0, 1)[None].contiguous(),
        size=(224, 320),
        mode="bicubic",
        antialias=True,
    )
    rows, grid = image_pixels(small, CFG)
    assert grid == [1, 14, 20]
    # Row 0 is the top-left 16x16 patch, channel-major, its temporal copies side by side.
    first = rows[0].reshape(3, 2, 16, 16)[:, 0] * 127.5 + 127.5
    assert torch.equal(first.round().to(torch.uint8), expected[0, :, :16, :16])


def test_video_frames_fill_temporal_slots_and_odd_counts_repeat_the_last() -> None:
    frames = np.stack([np.full((120, 160, 3), v, dtype=np.uint8) for v in (0, 100, 200)])
    rows, grid = video_pixels(frames, CFG)
    assert grid == [2, 20, 28]
    slots = rows.reshape(2, 20 * 28, 3, 2, 256) * 127.5 + 127.5  # (gt, patches, C, tp, p*p)
    assert [round(float(slots[t, :, :, s].mean())) for t in range(2) for s in range(2)] == [0, 100, 200, 200]


@pytest.mark.parametrize(
    ("setting", "value"),
    [("resample", 2), ("do_resize", False), ("do_normalize", False), ("image_mean", [0.5])],
)
def test_unsupported_processor_settings_are_refused(setting: str, value: object) -> None:
    with pytest.raises(ValueError, match=r"supported|three"):
        VisionConfig.from_processor_config({setting: value})
