"""PyAV plumbing shared by audio and video decoding: container sniffing, safe opening, declared
durations and a bounded mono 16 kHz audio collector.

Containers are recognised from their magic bytes and opened with that demuxer forced, so FFmpeg's
probing never hands hostile bytes to playlist-style demuxers (HLS, concat, ...) that open further
files or URLs; nested opens are refused outright as a second line of defence.
"""

from __future__ import annotations

import io
from typing import Any, NoReturn

import av
import numpy as np
import numpy.typing as npt

from engine.media.errors import too_long, undecodable
from engine.media.limits import SAMPLE_RATE

FloatArray = npt.NDArray[np.float32]

DECODE_ERRORS: tuple[type[BaseException], ...] = (av.FFmpegError, ValueError, EOFError, OSError)
"""What PyAV raises for bytes it cannot demux or decode."""

_SLACK_SECONDS = 0.1
"""Tolerance past a duration cap for frame/sample rounding (a 300.0 s file decodes to 300.02 s)."""


def sniff_container(data: bytes) -> str | None:
    """FFmpeg demuxer name for `data` from its magic bytes, or None when it is no supported container."""
    head = data[:16]
    if len(head) >= 12 and head[4:8] == b"ftyp":
        return "mov"
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return "matroska"
    if head.startswith(b"RIFF") and head[8:12] == b"WAVE":
        return "wav"
    if head.startswith(b"RIFF") and head[8:12] == b"AVI ":
        return "avi"
    if head.startswith(b"OggS"):
        return "ogg"
    if head.startswith(b"fLaC"):
        return "flac"
    if head.startswith(b"ID3"):
        return "mp3"
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xF6 == 0xF0:
        return "aac"
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:
        return "mp3"
    if len(data) > 188 * 2 and data[0] == 0x47 and data[188] == 0x47 and data[376] == 0x47:
        return "mpegts"
    return None


def _refuse_nested_open(*_args: Any, **_kwargs: Any) -> NoReturn:
    raise PermissionError("media containers may not open other files or URLs")


def open_container(data: bytes, kind: str, allowed: frozenset[str]) -> av.container.InputContainer:
    """Open `data` with its sniffed demuxer; raise media_undecodable for unknown or corrupt bytes."""
    fmt = sniff_container(data)
    if fmt is None or fmt not in allowed:
        raise undecodable(f"{kind} is not in a supported container format")
    try:
        return av.open(
            io.BytesIO(data),
            mode="r",
            format=fmt,
            metadata_errors="ignore",
            io_open=_refuse_nested_open,
        )
    except DECODE_ERRORS as exc:
        raise undecodable(f"{kind} container cannot be read") from exc


def declared_seconds(container: av.container.InputContainer, stream: av.stream.Stream | None) -> float | None:
    """The duration the headers declare for `stream` (else for the container), in seconds, or None."""
    if stream is not None and stream.duration is not None and stream.time_base is not None:
        seconds = float(stream.duration * stream.time_base)
        if seconds > 0:
            return seconds
    if container.duration is not None and container.duration > 0:
        return float(container.duration) / av.time_base
    return None


def check_declared(seconds: float | None, cap: float, kind: str) -> None:
    """Refuse (media_too_long) a declared duration above `cap` before any decoding."""
    if seconds is not None and seconds > cap + _SLACK_SECONDS:
        raise too_long(f"{kind} declares {seconds:.1f} s, more than the {cap:g} s limit")


def check_complete(decoded: float, declared: float | None, kind: str) -> None:
    """Refuse (media_undecodable) a stream that ended well before its declared duration: truncated."""
    if declared is not None and decoded < declared - max(1.0, 0.1 * declared):
        raise undecodable(f"{kind} is truncated ({decoded:.1f} s of {declared:.1f} s decoded)")


class AudioCollector:
    """Resample decoded audio frames to packed float32 mono at 16 kHz, refusing past `cap_seconds`.

    One FFmpeg resampler does rate, format and channel layout at once (SPEC section 6), so stereo
    becomes FFmpeg's downmix (L+R)/sqrt(2), not the channel mean; samples are neither normalised nor
    clipped. Feed frames with `add`, then call `finish` (which flushes the resampler). The cap is
    enforced on samples actually produced, so a header that understates the duration is caught while
    decoding, not after.
    """

    def __init__(self, cap_seconds: float, kind: str) -> None:
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        self._chunks: list[FloatArray] = []
        self._samples = 0
        self._max_samples = int((cap_seconds + _SLACK_SECONDS) * SAMPLE_RATE)
        self._cap = cap_seconds
        self._kind = kind

    def add(self, frame: av.AudioFrame | None) -> None:
        """Resample one frame (None flushes the resampler); raise media_too_long past the cap."""
        for out in self._resampler.resample(frame):
            chunk = np.asarray(out.to_ndarray(), dtype=np.float32).reshape(-1)  # packed mono: (1, samples)
            self._samples += chunk.shape[0]
            if self._samples > self._max_samples:
                raise too_long(f"{self._kind} runs past the {self._cap:g} s limit")
            self._chunks.append(chunk)

    @property
    def seconds(self) -> float:
        return self._samples / SAMPLE_RATE

    def finish(self) -> FloatArray:
        """All samples so far (after flushing), as one contiguous float32 array (maybe empty)."""
        self.add(None)
        if not self._chunks:
            return np.zeros(0, dtype=np.float32)
        return np.ascontiguousarray(np.concatenate(self._chunks), dtype=np.float32)
