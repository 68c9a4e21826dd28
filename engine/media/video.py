"""Video items -> frames kept at (at most) 2 fps of timestamps, plus the soundtrack (SPEC section 6).

One demux pass reads the first video stream and the first audio stream. Video frames come from the
decoder in presentation order; a frame is kept when it has a timestamp and its absolute stream time is
at least (frames kept so far) x 0.5 s (minus 1e-6). Frames are never repeated: a 1 fps clip keeps every
frame, a 30 fps clip one frame per 0.5 s. Non-reference frames stamped before the next mark could never
be kept, so FFmpeg drops them undecoded (`skip_frame`); the kept frames are those of decoding them all.
Each kept frame is converted to RGB24 and scaled by min(1, sqrt(`limits.video_frame_pixels` / (w x h)))
to even sides (2 x round(side x scale / 2), half to even, at least 2) in one PyAV call (bilinear). An
odd count gets the last frame once more. Caps on declared size, frame count and duration are checked
before decoding and again while decoding (headers can lie); kept frames are capped as well.
CPU only, blocking; thread-safe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import av
import numpy as np
import numpy.typing as npt

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
    """`frames` (T, H, W, 3) uint8 RGB with T even, taken as sampled at `fps` (2.0); `timestamps[i]` is
    the absolute stream time (s) of frame i; `audio` the mono 16 kHz soundtrack or None."""

    frames: FrameArray
    timestamps: tuple[float, ...]
    audio: FloatArray | None
    fps: float = VIDEO_FPS

    @property
    def seconds(self) -> float:
        return float(self.frames.shape[0]) / self.fps


def frame_size(width: int, height: int, max_pixels: int) -> tuple[int, int]:
    """(width, height) of a kept frame: scaled by min(1, sqrt(max_pixels / (w x h))), each side
    2 x round(side x scale / 2) (half to even), at least 2. May exceed `max_pixels` slightly
    (640x480 -> 592x444 for 262,144)."""
    scale = min(1.0, math.sqrt(max_pixels / (width * height)))
    return max(2, 2 * round(width * scale / 2)), max(2, 2 * round(height * scale / 2))


def _to_rgb(frame: av.VideoFrame, max_pixels: int) -> FrameArray:
    """One decoded frame -> (h, w, 3) uint8 RGB at `frame_size`, converted and resized in one call."""
    width, height = frame_size(frame.width, frame.height, max_pixels)
    out = frame.reformat(width=width, height=height, format="rgb24", interpolation="BILINEAR")
    return np.ascontiguousarray(out.to_ndarray(), dtype=np.uint8)


def pad_even(frames: list[FrameArray], times: list[float]) -> None:
    """Repeat the last frame (and its timestamp) once when the count is odd."""
    if len(frames) % 2:
        frames.append(frames[-1])
        times.append(times[-1])


def video_from_array(item: object, limits: MediaLimits) -> DecodedVideo:
    """Validate a Python-API video: (T, H, W, 3) uint8 RGB frames taken as already sampled at 2 fps,
    sized like decoded frames (`frame_size`, bilinear) and padded to an even count."""
    array = np.asarray(item)
    if array.ndim != 4 or array.shape[3] != 3 or array.dtype != np.uint8 or array.shape[0] == 0:
        raise bad_source("video arrays must be (T, H, W, 3) uint8 RGB frames")
    count, height, width = int(array.shape[0]), int(array.shape[1]), int(array.shape[2])
    if count / VIDEO_FPS > limits.video_seconds:
        raise too_long(f"video is longer than {limits.video_seconds:g} s")
    check_dimensions(width, height, limits.video_pixels, limits.max_aspect_ratio, "video")
    rgb = (av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24") for frame in array)
    frames = [_to_rgb(frame, limits.video_frame_pixels) for frame in rgb]
    times = [k * STEP for k in range(count)]
    pad_even(frames, times)
    return DecodedVideo(frames=np.stack(frames), timestamps=tuple(times), audio=None)


class _Sampler:
    """Keeps each frame whose time reaches the next 0.5 s mark (SPEC section 6) and converts it once."""

    def __init__(self, base: float, limits: MediaLimits) -> None:
        self.base = base
        self.cap = limits.video_seconds
        self.max_frames = limits.video_max_frames
        self.max_kept = limits.video_max_kept_frames
        self.max_pixels = limits.video_frame_pixels
        self.decoded = 0
        self.packets = 0
        self.end = 0.0
        self.frames: list[FrameArray] = []
        self.times: list[float] = []

    def cannot_keep(self, pts: int | None, time_base: float) -> bool:
        """Count one demuxed packet (raising past the frame cap: skipped frames count too) and tell whether
        a frame stamped `pts` lies before the next mark, so it will never be kept."""
        self.packets += 1
        if self.packets > self.max_frames:
            raise bomb(f"video has more than {self.max_frames} frames")
        return pts is not None and time_base > 0 and pts * time_base < len(self.frames) * STEP - _EPS

    def add(self, frame: av.VideoFrame, fallback_duration: float, time_base: float) -> None:
        """Take the next decoded frame (presentation order); raise past the frame-count or time caps."""
        self.decoded += 1
        if self.decoded > self.max_frames:
            raise bomb(f"video has more than {self.max_frames} frames")
        if frame.time is None:  # no timestamp: never kept
            return
        time = float(frame.time)
        if time - self.base > self.cap + STEP:
            raise too_long(f"video runs past the {self.cap:g} s limit")
        duration = frame.duration * time_base if frame.duration and time_base > 0 else fallback_duration
        self.end = max(self.end, time - self.base + duration)
        if time < len(self.frames) * STEP - _EPS:
            return
        if len(self.frames) >= self.max_kept:
            raise bomb(f"video gives more than {self.max_kept} frames at {VIDEO_FPS:g} fps")
        rgb = _to_rgb(frame, self.max_pixels)
        if self.frames and rgb.shape != self.frames[0].shape:
            raise undecodable("video frame size changes within the stream")
        self.frames.append(rgb)
        self.times.append(time)


def decode_video(data: bytes, limits: MediaLimits) -> DecodedVideo:
    """Decode the first video stream of `data` (frames kept at most every 0.5 s), and its first audio
    stream if any.

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
        sampler = _Sampler(base, limits)
        try:
            for packet in container.demux([stream] if sound is None else [stream, sound]):
                if packet.stream is not stream:
                    for audio_frame in packet.decode():
                        if collector is not None and isinstance(audio_frame, av.AudioFrame):
                            collector.add(audio_frame)
                    continue
                # A non-reference frame that shows before the next 0.5 s mark can never be kept (the mark
                # only moves later), so FFmpeg may drop it undecoded; every other frame is decoded.
                context.skip_frame = "NONREF" if sampler.cannot_keep(packet.pts, time_base) else "DEFAULT"
                for video_frame in context.decode(packet):
                    if isinstance(video_frame, av.VideoFrame):
                        sampler.add(video_frame, fallback, time_base)
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
