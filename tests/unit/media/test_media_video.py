"""Video decoding: 2 fps sampling by timestamps at 24/30/60 fps and VFR, resize bounds, odd-count padding,
soundtracks, frame arrays, and the 21 s 720p decode-cost figure."""

from __future__ import annotations

import time

import numpy as np
import pytest
from mediagen import read_index, video_bytes

from engine.media.limits import SAMPLE_RATE, MediaLimits
from engine.media.video import decode_video, frame_size, video_from_array

LIMITS = MediaLimits()
CODECS = [("mp4", "libx264"), ("mp4", "mpeg4"), ("webm", "libvpx"), ("webm", "libvpx-vp9")]


@pytest.mark.parametrize("fps", [24, 30, 60])
@pytest.mark.parametrize(("fmt", "codec"), CODECS)
@pytest.mark.parametrize("sound", [False, True])
def test_samples_one_frame_per_half_second_whatever_the_rate(
    fps: int, fmt: str, codec: str, sound: bool
) -> None:
    video = decode_video(video_bytes(fps=fps, seconds=3.0, fmt=fmt, codec=codec, sound=sound), LIMITS)
    assert video.fps == 2.0
    assert video.frames.shape == (6, 64, 96, 3)
    assert video.frames.dtype == np.uint8
    assert [read_index(frame) for frame in video.frames] == [round(k * 0.5 * fps) for k in range(6)]
    assert video.timestamps == pytest.approx([k * 0.5 for k in range(6)], abs=1e-3)
    if sound:
        assert video.audio is not None
        assert video.audio.dtype == np.float32
        assert video.audio.ndim == 1
        assert video.audio.shape[0] == pytest.approx(3.0 * SAMPLE_RATE, rel=0.05)
    else:
        assert video.audio is None


def test_variable_frame_rate_keeps_the_frame_on_screen_at_each_grid_time() -> None:
    times = [0.0, 0.1, 0.15, 0.9, 1.0, 1.7, 2.6, 2.7]
    video = decode_video(video_bytes(times=times), LIMITS)
    # Grid 0, .5, 1, 1.5, 2, 2.5 shows frames at 0, .15, 1.0, 1.0, 1.7, 1.7 (a gap repeats its frame).
    assert [read_index(frame) for frame in video.frames] == [0, 2, 4, 4, 5, 5]
    assert video.timestamps == pytest.approx([0.0, 0.15, 1.0, 1.0, 1.7, 1.7], abs=1e-3)


def test_odd_frame_count_is_padded_with_the_last_frame() -> None:
    video = decode_video(video_bytes(fps=30, seconds=1.2), LIMITS)  # grid 0, .5, 1.0 -> 3 frames
    assert [read_index(frame) for frame in video.frames] == [0, 15, 30, 30]
    assert np.array_equal(video.frames[2], video.frames[3])


def test_large_frames_are_downscaled_to_even_sides_within_the_budget() -> None:
    video = decode_video(video_bytes(fps=24, seconds=1.0, width=1920, height=1080), LIMITS)
    _, height, width, _ = video.frames.shape
    assert width * height <= 262_144
    assert width % 2 == 0
    assert height % 2 == 0
    assert width / height == pytest.approx(1920 / 1080, rel=0.01)


def test_small_frames_are_never_upscaled() -> None:
    video = decode_video(video_bytes(fps=24, seconds=1.0, width=320, height=240), LIMITS)
    assert video.frames.shape[1:3] == (240, 320)


@pytest.mark.parametrize(
    ("width", "height"), [(1280, 720), (1921, 1081), (321, 241), (8000, 40), (512, 512), (4096, 2160)]
)
def test_frame_size_bounds(width: int, height: int) -> None:
    new_w, new_h = frame_size(width, height, 262_144)
    assert new_w % 2 == 0
    assert new_h % 2 == 0
    assert new_w * new_h <= 262_144
    assert new_w <= width
    assert new_h <= height
    if width * height > 262_144:
        assert new_w * new_h >= 0.97 * 262_144 or min(new_w, new_h) <= 2 * 40


def test_frame_arrays_are_taken_as_two_fps_and_padded() -> None:
    frames = np.zeros((3, 720, 1280, 3), dtype=np.uint8)
    frames[1] += 100
    video = video_from_array(frames, LIMITS)
    assert video.frames.shape[0] == 4
    assert video.audio is None
    assert video.frames.shape[1] * video.frames.shape[2] <= 262_144
    assert video.timestamps == (0.0, 0.5, 1.0, 1.0)


@pytest.mark.slow
def test_decode_cost_of_a_21_second_720p_clip_with_sound(capsys: pytest.CaptureFixture[str]) -> None:
    clip = video_bytes(
        fps=30, seconds=21.0, width=1280, height=720, sound=True, preset="veryfast", content="motion"
    )
    decode_video(clip, LIMITS)  # warm-up (codec tables, allocator)
    runs = []
    for _ in range(3):
        cpu, wall = time.process_time(), time.perf_counter()
        video = decode_video(clip, LIMITS)
        runs.append((time.process_time() - cpu, time.perf_counter() - wall))
    assert video.frames.shape[0] == 42
    assert video.audio is not None
    best_cpu, best_wall = min(r[0] for r in runs), min(r[1] for r in runs)
    with capsys.disabled():
        print(
            f"\n[media timing] 21 s 1280x720 30 fps h264+aac ({len(clip)} bytes) -> 42 frames "
            f"{video.frames.shape[1:3]} + {video.audio.shape[0]} samples: "
            f"cpu {best_cpu:.3f} s, wall {best_wall:.3f} s (best of 3; runs {runs!r})"
        )
