"""Hostile inputs: every case is refused with its own reason code, cheaply, and nothing else breaks."""

from __future__ import annotations

import base64
import http.client
import os
import time
from pathlib import Path

import pytest

from engine.media import MediaLimits, MediaPolicy, decode_request_media
from engine.media.errors import MediaError
from engine.media.sources import read_source
from tests.unit.engine.media.mediagen import (
    Req,
    audio_bytes,
    b64,
    png_bytes,
    png_header_only,
    streamed_webm,
    video_bytes,
    wav_header_only,
)

PUBLIC = "93.184.216.34"


def refused(request: Req, policy: MediaPolicy | None = None, limits: MediaLimits | None = None) -> MediaError:
    with pytest.raises(MediaError) as info:
        decode_request_media(request, limits, policy)
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (Req(images=[b64(png_bytes(400, 300)[:300])]), "media_undecodable"),
        (Req(images=[b64(b"GIF00000" + os.urandom(200))]), "media_undecodable"),
        (Req(images=[b64(b"\x00" * 128)]), "media_undecodable"),
        (Req(audio=[b64(audio_bytes(2.0, "mp3")[:200])]), "media_undecodable"),
        (Req(audio=[b64(b"RIFX" + os.urandom(300))]), "media_undecodable"),
        (Req(audio=[b64(png_bytes(64, 64))]), "media_undecodable"),
        (Req(videos=[b64(video_bytes(seconds=2.0)[:2000])]), "media_undecodable"),
        (Req(videos=[b64(audio_bytes(1.0, "wav"))]), "media_undecodable"),
        (
            Req(videos=[b64(b"#EXTM3U\n#EXT-X-TARGETDURATION:1\nfile:///etc/passwd\n" * 4)]),
            "media_undecodable",
        ),
        (Req(videos=[b64(png_bytes(64, 64))]), "media_undecodable"),
    ],
)
def test_truncated_and_wrong_magic_bytes(request_: Req, reason: str) -> None:
    assert refused(request_).reason == reason


def test_truncated_video_body_is_refused_not_shortened() -> None:
    clip = video_bytes(seconds=4.0, fmt="webm", codec="libvpx")
    assert refused(Req(videos=[b64(clip[: len(clip) // 2])])).reason == "media_undecodable"


def test_png_bomb_header_is_refused_before_decoding() -> None:
    bomb = png_header_only(50_000, 50_000)
    assert len(bomb) < 100
    started = time.process_time()
    assert refused(Req(images=[b64(bomb)])).reason == "media_bomb"
    assert refused(Req(images=[b64(png_header_only(5000, 4000))])).reason == "media_bomb"  # 20 MP > 16 MP
    assert time.process_time() - started < 0.5


def test_ten_hour_video_header_is_refused_cheaply() -> None:
    clip = video_bytes(fps=1, times=[0.0, 36_000.0])  # two frames, ten hours apart
    started = time.process_time()
    error = refused(Req(videos=[b64(clip)]))
    assert error.reason == "media_too_long"
    assert time.process_time() - started < 0.2


def test_video_declared_frame_size_is_refused_before_decoding() -> None:
    clip = video_bytes(seconds=1.0, width=320, height=240)
    assert refused(Req(videos=[b64(clip)]), limits=MediaLimits(video_pixels=50_000)).reason == "media_bomb"


def test_video_frame_counts_are_capped_declared_and_decoded() -> None:
    limits = MediaLimits(video_seconds=2.0, video_max_source_fps=5.0)  # at most 11 source frames
    declared = video_bytes(fps=30, seconds=1.0)  # mp4 declares its 30 frames
    assert refused(Req(videos=[b64(declared)]), limits=limits).reason == "media_bomb"
    undeclared = streamed_webm(1.5, fps=30)  # no frame count in the header: caught while decoding
    assert refused(Req(videos=[b64(undeclared)]), limits=limits).reason == "media_bomb"


def test_late_starting_stream_keeps_a_bounded_burst_of_frames() -> None:
    # Frames are kept by absolute time, so a stream starting at 100 s keeps every frame until its
    # clock catches up; the kept-frame cap (video_seconds x 2 + 16) bounds that memory.
    clip = video_bytes(times=[100 + i / 30 for i in range(60)])
    assert decode_request_media(Req(videos=[b64(clip)])).videos[0].frames.shape[0] == 60
    error = refused(Req(videos=[b64(clip)]), limits=MediaLimits(video_seconds=10.0))
    assert error.reason == "media_bomb"
    assert "36 frames" in str(error)


def test_long_audio_header_is_refused_before_decoding() -> None:
    real = wav_header_only(301.0, rate=8000, body=301 * 8000)  # 2.4 MB of real 8 kHz samples
    started = time.process_time()
    assert refused(Req(audio=[b64(real)])).reason == "media_too_long"
    assert time.process_time() - started < 0.2


def test_ten_hour_wav_header_over_a_tiny_body_costs_nothing() -> None:
    # FFmpeg bounds a WAV's duration by the bytes present, so this decodes to its 1,000 real samples.
    media = decode_request_media(Req(audio=[b64(wav_header_only(36_000.0))]))
    assert media.audio[0].shape[0] == 2000  # 1,000 samples at 8 kHz -> 16 kHz


def test_lying_header_is_caught_while_decoding() -> None:
    clip = streamed_webm(3.0)  # no declared duration at all
    error = refused(Req(videos=[b64(clip)]), limits=MediaLimits(video_seconds=1.0))
    assert error.reason == "media_too_long"


def test_oversized_base64_is_refused_by_length_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_args: object, **_kwargs: object) -> bytes:
        raise AssertionError("decoded an oversized payload")

    monkeypatch.setattr(base64, "b64decode", boom)
    huge = "A" * (6 * 1024 * 1024)
    assert refused(Req(images=[huge])).reason == "media_too_large"
    assert refused(Req(images=["data:image/png;base64," + huge])).reason == "media_too_large"
    assert refused(Req(images=["!" * (6 * 1024 * 1024)])).reason == "media_too_large"


def test_total_decoded_bytes_cap() -> None:
    item = b64(png_bytes(200, 200))
    limits = MediaLimits(total_bytes=len(base64.b64decode(item)) + 10)
    error = refused(Req(images=[item, item]), limits=limits)
    assert error.reason == "media_too_large"
    assert "images[1]" in error.message


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/a.png",
        "https://169.254.169.254/latest/meta-data/",
        "https://10.0.0.1/a.png",
        "http://example.com/a.png",
        "file:///etc/passwd",
    ],
)
def test_urls_are_refused_by_default(url: str) -> None:
    request = Req(images=[url])
    with pytest.raises(MediaError) as info:
        decode_request_media(request, None, None, fetch=read_fetch_guard)
    assert info.value.reason == "media_forbidden_url"


def read_fetch_guard(url: str, policy: MediaPolicy, max_bytes: int) -> bytes:
    from engine.media.fetch import fetch_url

    def no_connect(ip: str, port: int, host: str, timeout: float) -> http.client.HTTPConnection:
        raise AssertionError("connection attempted")

    return fetch_url(url, policy, max_bytes, resolver=lambda host, port: [PUBLIC], connector=no_connect)


@pytest.fixture
def media_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "ok.png").write_bytes(png_bytes(300, 300))
    (tmp_path / "secret.png").write_bytes(png_bytes(300, 300))
    (root / "escape.png").symlink_to(tmp_path / "secret.png")
    (root / "inside.png").symlink_to(root / "sub" / "ok.png")
    (root / "subdir-link").symlink_to(tmp_path)
    os.mkfifo(root / "fifo.png")
    return root


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("../secret.png", "media_forbidden_path"),
        ("sub/../../secret.png", "media_forbidden_path"),
        ("escape.png", "media_forbidden_path"),
        ("subdir-link/secret.png", "media_forbidden_path"),
        ("fifo.png", "media_forbidden_path"),
        ("sub", "media_forbidden_path"),
        ("missing.png", "media_bad_source"),
    ],
)
def test_local_paths_are_confined(media_root: Path, path: str, reason: str) -> None:
    assert refused(Req(images=[path]), MediaPolicy(media_root=media_root)).reason == reason


def test_absolute_paths_outside_root_and_paths_without_root(media_root: Path) -> None:
    secret = str(media_root.parent / "secret.png")
    assert refused(Req(images=[secret]), MediaPolicy(media_root=media_root)).reason == "media_forbidden_path"
    assert refused(Req(images=["sub/ok.png"])).reason == "media_forbidden_path"  # no media_root configured


def test_paths_inside_root_are_read(media_root: Path) -> None:
    policy = MediaPolicy(media_root=media_root)
    media = decode_request_media(
        Req(images=["sub/ok.png", "inside.png", str(media_root / "sub/ok.png")]), None, policy
    )
    assert len(media.images) == 3


def test_path_size_cap_uses_fstat(media_root: Path) -> None:
    (media_root / "big.wav").write_bytes(b"RIFF" + b"\x00" * 2000)
    with pytest.raises(MediaError) as info:
        read_source("big.wav", "audio", 1000, MediaPolicy(media_root=media_root))
    assert info.value.reason == "media_too_large"


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        ("data:image/png,rawbytes", "media_bad_source"),
        ("data:video/mp4;base64," + b64(png_bytes(10, 10)), "media_bad_source"),
        ("data:image/png;base64,@@@@", "media_bad_source"),
        ("=" * 80, "media_bad_source"),
        (12345, "media_undecodable"),
    ],
)
def test_malformed_sources(item: object, reason: str) -> None:
    assert refused(Req(images=[item])).reason == reason


def test_error_names_the_item_and_carries_no_payload() -> None:
    payload = b64(png_bytes(400, 300)[:300])
    error = refused(Req(images=[b64(png_bytes(300, 300)), payload]))
    assert error.message.startswith("images[1]:")
    assert payload[:40] not in error.message
    assert payload[:40] not in str(error.body())
