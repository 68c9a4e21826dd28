"""Video decoding (SPEC 6): frames kept by timestamp at most every 0.5 s (24/30/60 fps, 29.97, 1 and 1.5
fps, VFR), never repeated; frame sizes (scale, half-to-even rounding); odd-count padding; soundtracks;
frame arrays; and the 21 s 720p decode-cost figure."""

from __future__ import annotations

import time
from fractions import Fraction

import numpy as np
import pytest

from engine.media.limits import SAMPLE_RATE, MediaLimits
from engine.media.video import _Sampler, decode_video, frame_size, video_from_array
from tests.unit.engine.media.mediagen import read_index, video_bytes

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


def test_variable_frame_rate_keeps_the_first_frame_at_or_past_each_half_second() -> None:
    times = [0.0, 0.1, 0.15, 0.9, 1.0, 1.7, 2.6, 2.7]
    video = decode_video(video_bytes(times=times), LIMITS)
    # Marks 0, .5, 1, 1.5, 2, 2.5 (frames kept so far x 0.5 s): a gap never repeats a frame.
    assert [read_index(frame) for frame in video.frames] == [0, 3, 4, 5, 6, 7]
    assert video.timestamps == pytest.approx([0.0, 0.9, 1.0, 1.7, 2.6, 2.7], abs=1e-3)


@pytest.mark.parametrize(
    ("fps", "seconds", "kept"),
    [
        (1, 4.0, [0, 1, 2, 3]),  # every frame once: 4 frames, not 8
        (Fraction(3, 2), 4.0, [0, 1, 2, 3, 4, 5]),
        (Fraction(30000, 1001), 2.0, [0, 15, 30, 45]),  # 29.97 fps: 0.5005 s is past the 0.5 s mark
        (7, 2.0, [0, 4, 7, 11]),
    ],
)
def test_low_and_fractional_frame_rates(fps: int | Fraction, seconds: float, kept: list[int]) -> None:
    video = decode_video(video_bytes(fps=fps, seconds=seconds), LIMITS)
    assert [read_index(frame) for frame in video.frames] == kept
    assert len(set(video.timestamps)) == len(kept)


@pytest.mark.parametrize("fps", [Fraction(30000, 1001), 24, 60])
def test_skipping_unkeepable_frames_keeps_the_same_frames(
    fps: int | Fraction, monkeypatch: pytest.MonkeyPatch
) -> None:
    # x264's default preset uses B-frames (non-reference): decoding lets FFmpeg drop those before the next
    # mark; the result must equal decoding every frame.
    clip = video_bytes(fps=fps, seconds=3.0, preset="medium", content="motion", sound=True)
    fast = decode_video(clip, LIMITS)
    counted: list[int] = []

    def decode_all(sampler: _Sampler, pts: int | None, time_base: float) -> bool:
        counted.append(1)
        return False

    monkeypatch.setattr(_Sampler, "cannot_keep", decode_all)
    full = decode_video(clip, LIMITS)
    assert len(counted) >= round(3.0 * fps)  # every packet (plus the flush packet) was asked
    assert fast.timestamps == full.timestamps
    assert np.array_equal(fast.frames, full.frames)
    assert fast.audio is not None
    assert full.audio is not None
    assert np.array_equal(fast.audio, full.audio)


def test_odd_frame_count_is_padded_with_the_last_frame() -> None:
    video = decode_video(video_bytes(fps=30, seconds=1.2), LIMITS)  # marks 0, .5, 1.0 -> 3 frames
    assert [read_index(frame) for frame in video.frames] == [0, 15, 30, 30]
    assert np.array_equal(video.frames[2], video.frames[3])


@pytest.mark.parametrize(
    ("source", "frame"), [((640, 480), (592, 444)), ((1920, 1080), (682, 384)), ((320, 240), (320, 240))]
)
def test_frames_are_scaled_to_the_spec_size(source: tuple[int, int], frame: tuple[int, int]) -> None:
    video = decode_video(video_bytes(fps=24, seconds=1.0, width=source[0], height=source[1]), LIMITS)
    assert video.frames.shape[1:3] == (frame[1], frame[0])


@pytest.mark.parametrize(
    ("width", "height", "expected"),
    [
        (640, 480, (592, 444)),  # may exceed the 262,144 cap slightly (262,848)
        (1280, 720, (682, 384)),
        (4096, 2160, (706, 372)),
        (161, 121, (160, 120)),  # scale 1: 80.5 and 60.5 round half to even, down
        (163, 123, (164, 124)),  # 81.5 and 61.5 round half to even, up (past the source size)
        (8000, 40, (7240, 36)),
        (1, 1, (2, 2)),  # at least 2
    ],
)
def test_frame_size_rule(width: int, height: int, expected: tuple[int, int]) -> None:
    assert frame_size(width, height, 262_144) == expected


def test_frame_arrays_are_taken_as_two_fps_and_padded() -> None:
    frames = np.zeros((3, 720, 1280, 3), dtype=np.uint8)
    frames[1] += 100
    video = video_from_array(frames, LIMITS)
    assert video.frames.shape == (4, 384, 682, 3)
    assert video.audio is None
    assert int(video.frames[1].mean()) == 100
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
