"""Tiny media for the end-to-end tests, made here: a PNG (Pillow), a WAV and MP4 clips (PyAV)."""

from __future__ import annotations

import io
from typing import Any

import av
import numpy as np
from PIL import Image

from tests.unit.engine.media.mediagen import b64 as b64  # re-exported for the e2e tests
from tests.unit.engine.media.mediagen import png_header_only

QUESTIONS: dict[str, Any] = {
    "department": {"type": "choice", "criteria": {"net": "network", "db": "database", "sec": "security"}},
    "outage": {"type": "noul"},
    "urgency": {"type": "score", "criteria": ["low", "medium", "high"]},
}


def request(state: str, **media: list[str]) -> dict[str, Any]:
    """A SystemOne request body with the shared three questions."""
    return {"state": state, "questions": QUESTIONS, **media}


def png(width: int = 64, height: int = 48, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode="RGB").save(buffer, format="PNG")
    return buffer.getvalue()


def _tone(seconds: float, rate: int, hz: float) -> np.ndarray:
    t = np.arange(int(seconds * rate), dtype=np.float64) / rate
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def _audio_stream(container: av.container.OutputContainer, codec: str, rate: int) -> av.AudioStream:
    stream = container.add_stream(codec, rate=rate)
    stream.layout = "mono"
    return stream


def _write_audio(
    container: av.container.OutputContainer, stream: av.AudioStream, seconds: float, hz: float
) -> None:
    rate = stream.codec_context.sample_rate
    fmt = stream.codec_context.format.name
    step = stream.codec_context.frame_size or 1024
    wave = _tone(seconds, rate, hz)
    for start in range(0, wave.shape[0], step):
        block = wave[start : start + step]
        data = (block * 32767).astype(np.int16) if fmt.startswith("s16") else block
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(data[None, :]), format=fmt, layout="mono")
        frame.sample_rate = rate
        frame.pts = start
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode(None):
        container.mux(packet)


def wav(seconds: float = 1.2, hz: float = 440.0) -> bytes:
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="wav") as container:
        _write_audio(container, _audio_stream(container, "pcm_s16le", 16000), seconds, hz)
    return buffer.getvalue()


def mp4(seconds: float = 1.0, sound: bool = False, fps: int = 24, width: int = 64, height: int = 48) -> bytes:
    """An H.264 clip (moving colour ramp), with an AAC tone when `sound`."""
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast"}
        audio = _audio_stream(container, "aac", 44100) if sound else None
        ramp = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
        for i in range(round(seconds * fps)):
            rgb = np.broadcast_to((ramp + 20 * i) % 256, (height, width, 3)).astype(np.uint8)
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
        if audio is not None:
            _write_audio(container, audio, seconds, 330.0)
    return buffer.getvalue()


def png_bomb(width: int = 50_000, height: int = 50_000) -> bytes:
    """A valid PNG header declaring `width` x `height` RGB pixels, with no pixel data."""
    return png_header_only(width, height)
