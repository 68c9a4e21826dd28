"""Audio items -> mono float32 samples at 16 kHz (SPEC section 6), with duration caps before and
while decoding. CPU only, blocking; safe to call from several threads at once.
"""

from __future__ import annotations

import numpy as np

from engine.media.containers import (
    DECODE_ERRORS,
    AudioCollector,
    FloatArray,
    check_complete,
    check_declared,
    declared_seconds,
    open_container,
)
from engine.media.errors import bad_source, too_long, undecodable
from engine.media.limits import SAMPLE_RATE, MediaLimits

AUDIO_CONTAINERS = frozenset({"wav", "mp3", "ogg", "flac", "aac", "mov", "matroska"})


def audio_from_array(samples: object, limits: MediaLimits) -> FloatArray:
    """Validate a Python-API sample array: 1-D (or (1, N)) real numbers, 16 kHz mono, finite."""
    array = np.asarray(samples)
    if array.ndim == 2 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 1 or array.dtype.kind not in "fiu":
        raise bad_source("audio arrays must be 1-D 16 kHz mono samples")
    if array.shape[0] == 0:
        raise bad_source("audio array is empty")
    if array.shape[0] > limits.audio_seconds * SAMPLE_RATE:
        raise too_long(f"audio is longer than {limits.audio_seconds:g} s")
    out = np.ascontiguousarray(array, dtype=np.float32)
    if not np.isfinite(out).all():
        raise bad_source("audio array has non-finite samples")
    return out


def decode_audio(data: bytes, limits: MediaLimits) -> FloatArray:
    """Decode the first audio stream of `data` to mono float32 16 kHz samples.

    Raises `MediaError`: media_undecodable (unknown container, no audio stream, corrupt or truncated
    data, no samples), media_too_long (declared duration above `limits.audio_seconds`, checked before
    decoding, or samples past it while decoding).
    """
    with open_container(data, "audio", AUDIO_CONTAINERS) as container:
        if not container.streams.audio:
            raise undecodable("audio has no audio stream")
        stream = container.streams.audio[0]
        declared = declared_seconds(container, stream)
        check_declared(declared, limits.audio_seconds, "audio")
        collector = AudioCollector(limits.audio_seconds, "audio")
        try:
            for frame in container.decode(stream):
                collector.add(frame)
            samples = collector.finish()
        except DECODE_ERRORS as exc:
            raise undecodable("audio data is corrupt") from exc
    if samples.shape[0] == 0:
        raise undecodable("audio has no samples")
    check_complete(collector.seconds, declared, "audio")
    return samples
