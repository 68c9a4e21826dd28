"""Media made by the tests themselves: images (Pillow), videos and audio (PyAV encoders).

Video frames carry their own index in two flat colour channels (robust to lossy coding), so a test
can read back which source frame the 2 fps sampler kept.
"""

from __future__ import annotations

import base64
import io
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import av
import numpy as np
import numpy.typing as npt
from PIL import Image

SINE_HZ = 440.0


@dataclass
class Req:
    """Stands in for a request's media lists (`images`, `audio`, `videos`) in the decoder tests."""

    images: list[object] = field(default_factory=list)
    audio: list[object] = field(default_factory=list)
    videos: list[object] = field(default_factory=list)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def png_bytes(width: int, height: int, mode: str = "RGB", fmt: str = "PNG") -> bytes:
    """A real encoded image of the given size (gradient content)."""
    xs = np.linspace(0, 255, width, dtype=np.float32)[None, :]
    ys = np.linspace(0, 255, height, dtype=np.float32)[:, None]
    rgb = np.stack([xs + 0 * ys, ys + 0 * xs, (xs + ys) / 2], axis=-1).astype(np.uint8)
    image = Image.fromarray(rgb, mode="RGB").convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A tiny PNG whose IHDR declares `width` x `height` (8-bit RGB) with one empty IDAT: a bomb header."""

    def chunk(kind: bytes, payload: bytes) -> bytes:
        crc = zlib.crc32(kind + payload) & 0xFFFFFFFF
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    )


def index_frame(index: int, width: int, height: int) -> npt.NDArray[np.uint8]:
    """Flat frame encoding `index` (0..255) as R = low nibble, G = high nibble, 16 levels each."""
    frame = np.empty((height, width, 3), dtype=np.uint8)
    frame[..., 0] = (index % 16) * 16 + 8
    frame[..., 1] = (index // 16 % 16) * 16 + 8
    frame[..., 2] = 128
    return frame


def read_index(frame: npt.NDArray[np.uint8]) -> int:
    """Inverse of `index_frame` on a decoded (possibly resized, lossy) frame."""
    h, w = frame.shape[0] // 2, frame.shape[1] // 2
    red, green = float(frame[h, w, 0]), float(frame[h, w, 1])
    return round((red - 8) / 16) + 16 * round((green - 8) / 16)


def sine(seconds: float, rate: int, channels: int = 1) -> npt.NDArray[np.float32]:
    t = np.arange(int(seconds * rate), dtype=np.float64) / rate
    wave = (0.3 * np.sin(2 * np.pi * SINE_HZ * t)).astype(np.float32)
    return np.ascontiguousarray(np.stack([wave] * channels))


def _add_audio(container: av.container.OutputContainer, codec: str, rate: int) -> av.AudioStream:
    stream = container.add_stream(codec, rate=rate)
    stream.layout = "stereo"
    return stream


def _encode_audio(
    container: av.container.OutputContainer, stream: av.AudioStream, seconds: float, rate: int
) -> None:
    codec = stream.codec_context.name
    samples = sine(seconds, rate, channels=2)
    fmt = "s16" if codec == "pcm_s16le" else stream.codec_context.format.name
    step = stream.codec_context.frame_size or 1024
    for start in range(0, samples.shape[1], step):
        block = samples[:, start : start + step]
        if fmt.startswith("s16"):
            data: npt.NDArray[np.generic] = (block * 32767).astype(np.int16)
        elif fmt.startswith("s32"):
            data = (block * 2147483647.0).astype(np.int32)
        else:
            data = block
        if not fmt.endswith("p"):
            data = np.ascontiguousarray(data.T.reshape(1, -1))
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(data), format=fmt, layout="stereo")
        frame.sample_rate = rate
        frame.pts = start
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode(None):
        container.mux(packet)


def video_bytes(
    *,
    fps: int | Fraction = 30,
    seconds: float = 2.0,
    width: int = 96,
    height: int = 64,
    sound: bool = False,
    fmt: str = "mp4",
    codec: str = "libx264",
    times: Sequence[float] | None = None,
    preset: str = "ultrafast",
    content: str = "index",
) -> bytes:
    """Encode a clip: CFR at `fps` for `seconds`, or VFR with frames at `times` (seconds).

    `fmt` "mp4" (h264/mpeg4 + aac) or "webm" (vp8/vp9 + opus). Frame i shows `index_frame(i)`
    (or moving gradients with `content="motion"`, for realistic decode cost).
    """
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=fmt) as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if codec == "libx264":
            stream.options = {"preset": preset}
        audio_codec, rate = ("libopus", 48000) if fmt == "webm" else ("aac", 44100)
        audio = _add_audio(container, audio_codec, rate) if sound else None
        if times is not None:
            stream.codec_context.time_base = Fraction(1, 1000)
        stamps = list(times) if times is not None else [float(i / fps) for i in range(round(seconds * fps))]
        scene = _scene(width, height) if content == "motion" else None
        for i, stamp in enumerate(stamps):
            if scene is not None:  # a textured scene panning diagonally, built straight in YUV 4:2:0
                luma = scene[i % 200 : i % 200 + height, 2 * i % 400 : 2 * i % 400 + width]
                chroma = np.full((height // 2, width), 128 + (i % 32), dtype=np.uint8)
                frame = av.VideoFrame.from_ndarray(np.concatenate([luma, chroma]), format="yuv420p")
            else:
                frame = av.VideoFrame.from_ndarray(index_frame(i, width, height), format="rgb24")
            if times is not None:
                frame.pts = round(stamp * 1000)
                frame.time_base = Fraction(1, 1000)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
        if audio is not None:
            duration = stamps[-1] + float(1 / fps) if stamps else seconds
            _encode_audio(container, audio, duration, rate)
    return buffer.getvalue()


def _scene(width: int, height: int) -> npt.NDArray[np.uint8]:
    rng = np.random.default_rng(5)
    yy, xx = np.mgrid[0 : height + 200, 0 : width + 400]
    shapes = 96 + 64 * np.sin(xx / 37.0) * np.cos(yy / 23.0) + 40 * ((xx // 80 + yy // 60) % 2)
    return np.clip(shapes + rng.normal(0, 6, shapes.shape), 0, 255).astype(np.uint8)


def audio_bytes(seconds: float = 1.5, fmt: str = "wav", rate: int = 44100) -> bytes:
    """A 440 Hz stereo sine as WAV (pcm_s16le) or MP3 (libmp3lame)."""
    codec = {"wav": "pcm_s16le", "mp3": "libmp3lame"}[fmt]
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=fmt) as container:
        _encode_audio(container, _add_audio(container, codec, rate), seconds, rate)
    return buffer.getvalue()


def wav_header_only(seconds: float, rate: int = 8000, body: int = 1000) -> bytes:
    """A WAV whose header declares `seconds` of 8-bit mono audio but carries `body` samples."""
    declared = int(seconds * rate)
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate, 1, 8)
    fields = b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", declared)
    return b"RIFF" + struct.pack("<I", min(36 + declared, 0xFFFFFFFF)) + b"WAVE" + fields + b"\x80" * body


class NonSeekable(io.RawIOBase):
    """A write-only sink without seek, so muxers cannot go back to write durations."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        self.data.extend(b)
        return len(b)


def streamed_webm(seconds: float, fps: int = 10, width: int = 64, height: int = 48) -> bytes:
    """A VP8 WebM written to a non-seekable sink: its header declares no duration at all."""
    sink = NonSeekable()
    with av.open(sink, mode="w", format="webm") as container:
        stream = container.add_stream("libvpx", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(int(seconds * fps)):
            frame = av.VideoFrame.from_ndarray(index_frame(i % 256, width, height), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return bytes(sink.data)
