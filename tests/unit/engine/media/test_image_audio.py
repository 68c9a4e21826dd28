"""Images (Pillow: RGB at their own size) and audio (PyAV: first stream, FFmpeg mono downmix, 16 kHz)."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
from PIL import Image

from engine.media.audio import audio_from_array, decode_audio
from engine.media.errors import MediaError
from engine.media.image import decode_image, image_from_object
from engine.media.limits import MediaLimits
from tests.unit.engine.media.mediagen import SINE_HZ, audio_bytes, png_bytes

LIMITS = MediaLimits()


@pytest.mark.parametrize(
    ("size", "fmt", "mode"),
    [
        ((10, 10), "PNG", "RGB"),
        ((640, 480), "JPEG", "RGB"),
        ((4000, 3000), "PNG", "L"),
        ((300, 200), "PNG", "RGBA"),
        ((1600, 1200), "PNG", "P"),
    ],
)
def test_images_become_rgb_at_their_own_size(size: tuple[int, int], fmt: str, mode: str) -> None:
    # No resize here: the vision processing alone resizes, into its pixel window (SPEC 6).
    image = decode_image(png_bytes(*size, mode=mode, fmt=fmt), LIMITS)
    assert image.mode == "RGB"
    assert image.size == size


def test_alpha_is_dropped_not_composited() -> None:
    rgba = np.zeros((8, 8, 4), dtype=np.uint8)
    rgba[..., 0], rgba[..., 3] = 200, 0  # fully transparent red: compositing on white would give white
    buffer = io.BytesIO()
    Image.fromarray(rgba).save(buffer, format="PNG")
    image = decode_image(buffer.getvalue(), LIMITS)
    assert np.asarray(image)[0, 0].tolist() == [200, 0, 0]


def test_exif_orientation_is_not_applied() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW" tag; the pixels must come back as stored
    buffer = io.BytesIO()
    Image.new("RGB", (40, 20), (10, 20, 30)).save(buffer, format="JPEG", exif=exif)
    assert decode_image(buffer.getvalue(), LIMITS).size == (40, 20)


def test_python_api_images() -> None:
    pil = Image.new("P", (100, 50))
    assert image_from_object(pil, LIMITS).mode == "RGB"
    array = np.zeros((50, 100, 3), dtype=np.uint8)
    assert image_from_object(array, LIMITS).size == (100, 50)
    with pytest.raises(MediaError) as info:
        image_from_object(np.zeros((5, 5), dtype=np.float32), LIMITS)
    assert info.value.reason == "media_bad_source"


@pytest.mark.parametrize("fmt", ["wav", "mp3"])
@pytest.mark.parametrize("rate", [44100, 48000, 16000])
def test_audio_is_mono_float32_16k(fmt: str, rate: int) -> None:
    samples = decode_audio(audio_bytes(1.5, fmt, rate=rate), LIMITS)
    assert samples.dtype == np.float32
    assert samples.ndim == 1
    assert samples.shape[0] == pytest.approx(24_000, rel=0.05)
    spectrum = np.abs(np.fft.rfft(samples))
    assert np.argmax(spectrum) * 16_000 / samples.shape[0] == pytest.approx(SINE_HZ, abs=2)
    # Both channels carry the same 0.3 sine: FFmpeg's downmix (L+R)/sqrt(2) gives 0.3 * sqrt(2).
    assert float(np.abs(samples).max()) == pytest.approx(0.3 * np.sqrt(2), abs=0.03)


def _stereo_wav(left: np.ndarray, right: np.ndarray, rate: int = 16_000) -> bytes:
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="wav") as container:
        stream = container.add_stream("pcm_f32le", rate=rate)
        stream.layout = "stereo"
        frame = av.AudioFrame.from_ndarray(
            np.stack([left, right]).astype(np.float32), format="fltp", layout="stereo"
        )
        frame.sample_rate = rate
        frame.pts = 0
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return buffer.getvalue()


def test_stereo_is_ffmpegs_downmix_not_the_channel_mean_and_never_clipped() -> None:
    rng = np.random.default_rng(3)
    left = rng.uniform(-0.9, 0.9, 16_000).astype(np.float32)
    right = np.where(np.arange(16_000) < 8_000, left, -0.5 * left).astype(np.float32)
    samples = decode_audio(_stereo_wav(left, right), LIMITS)
    expected = (left.astype(np.float64) + right) / np.sqrt(2)
    assert samples.shape == (16_000,)
    assert np.abs(samples - expected).max() < 1e-6
    assert float(np.abs(samples).max()) > 1.0  # 0.9 + 0.9 over sqrt(2): kept above 1, not clipped


def test_python_api_audio_arrays() -> None:
    out = audio_from_array(np.zeros(16_000, dtype=np.float64), LIMITS)
    assert out.dtype == np.float32
    assert out.shape == (16_000,)
    for bad, reason in [
        (np.zeros((2, 100), dtype=np.float32), "media_bad_source"),
        (np.array([np.nan, 0.0], dtype=np.float32), "media_bad_source"),
        (np.zeros(16_000 * 301, dtype=np.float32), "media_too_long"),
    ]:
        with pytest.raises(MediaError) as info:
            audio_from_array(bad, LIMITS)
        assert info.value.reason == reason
