"""Images (Pillow: RGB, pixel window) and audio (PyAV: first stream, mono float32 16 kHz)."""

from __future__ import annotations

import numpy as np
import pytest
from mediagen import SINE_HZ, audio_bytes, png_bytes
from PIL import Image

from engine.media.audio import audio_from_array, decode_audio
from engine.media.errors import MediaError
from engine.media.image import decode_image, image_from_object, scaled_size
from engine.media.limits import MediaLimits

LIMITS = MediaLimits()


@pytest.mark.parametrize(
    ("size", "fmt", "mode"),
    [
        ((10, 10), "PNG", "RGB"),
        ((640, 480), "JPEG", "RGB"),
        ((4000, 3000), "PNG", "L"),
        ((300, 200), "PNG", "RGBA"),
    ],
)
def test_images_become_rgb_within_the_pixel_window(size: tuple[int, int], fmt: str, mode: str) -> None:
    image = decode_image(png_bytes(*size, mode=mode, fmt=fmt), LIMITS)
    assert image.mode == "RGB"
    assert 65_536 <= image.width * image.height <= 1_048_576
    assert image.width / image.height == pytest.approx(size[0] / size[1], rel=0.02)


def test_image_already_in_the_window_keeps_its_size() -> None:
    assert decode_image(png_bytes(640, 480), LIMITS).size == (640, 480)


@pytest.mark.parametrize(("width", "height"), [(1, 150), (7, 3), (5000, 3000), (1024, 1025), (256, 256)])
def test_scaled_size_bounds(width: int, height: int) -> None:
    new_w, new_h = scaled_size(width, height, 65_536, 1_048_576)
    assert 65_536 <= new_w * new_h <= 1_048_576 * 1.0001


def test_python_api_images() -> None:
    pil = Image.new("P", (100, 50))
    assert image_from_object(pil, LIMITS).mode == "RGB"
    array = np.zeros((50, 100, 3), dtype=np.uint8)
    assert image_from_object(array, LIMITS).width * image_from_object(array, LIMITS).height >= 65_536
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
    assert float(np.abs(samples).max()) == pytest.approx(0.3, abs=0.03)  # stereo averaged, not summed


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
