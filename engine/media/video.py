"""Video items -> frames sampled at 2 fps of timestamps, plus the soundtrack (SPEC section 6).

One demux pass reads the first video stream and the first audio stream. For every grid time
t_k = k * 0.5 s (relative to the stream start) the frame on screen at t_k is kept: the last frame whose
timestamp is <= t_k. Whatever the source rate (24, 30, 60 fps or variable), the output is one frame per
0.5 s, so frame index / 2 is its time. Packets whose display interval [pts, pts + duration) holds no grid
time are decoded only when other frames reference them (FFmpeg `skip_frame=NONREF`), and only kept
frames are converted to RGB and downscaled (never up) to at most `limits.video_frame_pixels` with even
sides. Odd frame counts are padded by repeating the last frame. Caps on declared size, frame count and
duration are checked before decoding and again while decoding (headers can lie).
CPU only, blocking; thread-safe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import av
import numpy as np
import numpy.typing as npt
from PIL import Image

from engine.media.containers import (
    DECODE_ERRORS,
    AudioCollector,
    FloatArray,
    check_complete,
    check_declared,
    declared_seconds,
    open_container,
)
from engine.media.errors import bad_source, bomb, too_long, undecodable
from engine.media.image import check_dimensions
from engine.media.limits import VIDEO_FPS, MediaLimits

VIDEO_CONTAINERS = frozenset({"mov", "matroska", "avi", "mpegts"})
STEP = 1.0 / VIDEO_FPS
_EPS = 1e-6
FrameArray = npt.NDArray[np.uint8]


@dataclass(frozen=True, slots=True, eq=False)
class DecodedVideo:
    """`frames` (T, H, W, 3) uint8 RGB with T even, sampled at `fps` (2.0); `timestamps[i]` is the source
    time (s, from the stream start) of frame i; `audio` the mono 16 kHz soundtrack or None."""

    frames: FrameArray
    timestamps: tuple[float, ...]
    audio: FloatArray | None
    fps: float = VIDEO_FPS

    @property
    def seconds(self) -> float:
        return float(self.frames.shape[0]) / self.fps


def frame_size(width: int, height: int, max_pixels: int) -> tuple[int, int]:
    """Even (width, height) with the aspect ratio kept, at most `max_pixels`, never larger than the source."""
    scale = min(1.0, math.sqrt(max_pixels / (width * height)))
    new_w = max(2, math.floor(width * scale) // 2 * 2)
    new_h = max(2, math.floor(height * scale) // 2 * 2)
    while new_w * new_h > max_pixels:
        if new_w >= new_h:
            new_w -= 2
        else:
            new_h -= 2
    return new_w, new_h


def pad_even(frames: list[FrameArray], times: list[float]) -> None:
    """Repeat the last frame (and its timestamp) once when the count is odd."""
    if len(frames) % 2:
        frames.append(frames[-1])
        times.append(times[-1])


def video_from_array(item: object, limits: MediaLimits) -> DecodedVideo:
    """Validate a Python-API video: (T, H, W, 3) uint8 RGB frames taken as already sampled at 2 fps."""
    array = np.asarray(item)
    if array.ndim != 4 or array.shape[3] != 3 or array.dtype != np.uint8 or array.shape[0] == 0:
        raise bad_source("video arrays must be (T, H, W, 3) uint8 RGB frames")
    count, height, width = int(array.shape[0]), int(array.shape[1]), int(array.shape[2])
    if count / VIDEO_FPS > limits.video_seconds:
        raise too_long(f"video is longer than {limits.video_seconds:g} s")
    check_dimensions(width, height, limits.video_pixels, limits.max_aspect_ratio, "video")
    size = frame_size(width, height, limits.video_frame_pixels)
    frames: list[FrameArray] = []
    for frame in array:
        if size != (width, height):
            frame = np.asarray(Image.fromarray(frame, mode="RGB").resize(size, Image.Resampling.BICUBIC))
        frames.append(np.ascontiguousarray(frame))
    times = [k * STEP for k in range(count)]
    pad_even(frames, times)
    return DecodedVideo(frames=np.stack(frames), timestamps=tuple(times), audio=None)


class _Sampler:
    """Keeps the frame on screen at each grid time k * STEP; converts each kept frame to RGB once."""

    def __init__(self, base: float, size: tuple[int, int], limits: MediaLimits) -> None:
        self.base = base
        self.size = size
        self.cap = limits.video_seconds
        self.max_frames = limits.video_max_frames
        self.decoded = 0
        self.end = 0.0
        self.frames: list[FrameArray] = []
        self.times: list[float] = []
        self._prev: av.VideoFrame | None = None
        self._prev_time = 0.0
        self._prev_rgb: FrameArray | None = None

    def _emit_prev(self) -> None:
        if self._prev_rgb is None:
            assert self._prev is not None
            width, height = self.size
            out = self._prev.reformat(width=width, height=height, format="rgb24", interpolation="BILINEAR")
            self._prev_rgb = np.ascontiguousarray(out.to_ndarray(), dtype=np.uint8)
        self.frames.append(self._prev_rgb)
        self.times.append(self._prev_time)

    def _close_grid_before(self, time: float) -> None:
        # Every grid time strictly before `time` shows the previous frame.
        while len(self.frames) * STEP + _EPS < time:
            self._emit_prev()

    def add(self, frame: av.VideoFrame, fallback_duration: float, time_base: float) -> None:
        """Take the next decoded frame (presentation order); raise past the frame-count or time cap."""
        self.decoded += 1
        if self.decoded > self.max_frames:
            raise bomb(f"video has more than {self.max_frames} frames")
        duration = frame.duration * time_base if frame.duration and time_base > 0 else fallback_duration
        if frame.time is not None:
            time = float(frame.time) - self.base
        else:
            time = self._prev_time + fallback_duration if self._prev is not None else 0.0
        if time > self.cap + STEP:
            raise too_long(f"video runs past the {self.cap:g} s limit")
        if self._prev is not None:  # a late first frame also stands for the grid times before it
            self._close_grid_before(time)
        self._prev, self._prev_time, self._prev_rgb = frame, time, None
        self.end = max(self.end, time + duration)

    def finish(self) -> None:
        """Fill the grid up to the end of the last frame (within the cap)."""
        if self._prev is None:
            return
        self._close_grid_before(min(self.end, self.cap))
        if not self.frames:
            self._emit_prev()


def decode_video(data: bytes, limits: MediaLimits) -> DecodedVideo:
    """Decode the first video stream of `data` at 2 fps, and its first audio stream if any.

    Raises `MediaError`: media_bomb (declared frame size above `limits.video_pixels` or frame count above
    `limits.video_max_frames`, before decoding; too many decoded frames), media_too_long (declared or
    decoded duration above `limits.video_seconds`, soundtrack included), media_undecodable (unknown
    container, no video stream, corrupt or truncated data, no frames).
    """
    with open_container(data, "video", VIDEO_CONTAINERS) as container:
        if not container.streams.video:
            raise undecodable("video has no video stream")
        stream = container.streams.video[0]
        context = stream.codec_context
        check_dimensions(context.width, context.height, limits.video_pixels, limits.max_aspect_ratio, "video")
        if stream.frames and stream.frames > limits.video_max_frames:
            raise bomb(f"video declares {stream.frames} frames, more than {limits.video_max_frames}")
        declared = declared_seconds(container, stream)
        check_declared(declared, limits.video_seconds, "video")
        sound = container.streams.audio[0] if container.streams.audio else None
        collector: AudioCollector | None = None
        if sound is not None:
            check_declared(declared_seconds(container, sound), limits.video_seconds, "video soundtrack")
            collector = AudioCollector(limits.video_seconds, "video soundtrack")
        stream.thread_type = "AUTO"
        time_base = float(stream.time_base) if stream.time_base is not None else 0.0
        base = stream.start_time * time_base if stream.start_time is not None else 0.0
        fallback = 1.0 / float(stream.average_rate) if stream.average_rate else 1.0 / 25
        sampler = _Sampler(base, frame_size(context.width, context.height, limits.video_frame_pixels), limits)
        try:
            for packet in container.demux([stream] if sound is None else [stream, sound]):
                if packet.stream is not stream:
                    for audio_frame in packet.decode():
                        if collector is not None and isinstance(audio_frame, av.AudioFrame):
                            collector.add(audio_frame)
                    continue
                context.skip_frame = "DEFAULT" if _needed(packet, time_base, base) else "NONREF"
                for video_frame in context.decode(packet):
                    if isinstance(video_frame, av.VideoFrame):
                        sampler.add(video_frame, fallback, time_base)
            sampler.finish()
            audio = collector.finish() if collector is not None else None
        except DECODE_ERRORS as exc:
            raise undecodable("video data is corrupt") from exc
    if not sampler.frames:
        raise undecodable("video has no frames")
    check_complete(sampler.end, declared, "video")
    frames, times = sampler.frames, sampler.times
    pad_even(frames, times)
    soundtrack = audio if audio is not None and audio.shape[0] > 0 else None
    return DecodedVideo(frames=np.stack(frames), timestamps=tuple(times), audio=soundtrack)


def _needed(packet: av.Packet[Any], time_base: float, base: float) -> bool:
    """False only when the packet's display interval [pts, pts + duration) provably holds no grid time."""
    if packet.pts is None or not packet.duration or time_base <= 0:
        return True
    start = packet.pts * time_base - base
    end = start + packet.duration * time_base
    if start < 0:
        return True
    first_k = math.ceil(start / STEP - _EPS)
    return first_k * STEP < end - _EPS
