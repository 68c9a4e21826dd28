"""decode_request_media: SPEC order, the soundtrack policy, Python-API objects and SystemOne requests."""

from __future__ import annotations

import numpy as np
from PIL import Image

from engine.media import EMPTY, DecodedVideo, decode_request_media, soundtracks_heard
from schemas.request import SystemOneRequest
from tests.unit.engine.media.mediagen import Req, audio_bytes, b64, png_bytes, video_bytes


def test_text_only_request_is_empty() -> None:
    assert decode_request_media(Req()) is EMPTY
    assert EMPTY.empty


def test_soundtracks_heard_only_when_every_video_has_one() -> None:
    with_sound = b64(video_bytes(seconds=1.0, sound=True))
    silent = b64(video_bytes(seconds=1.0, sound=False))
    both = decode_request_media(Req(videos=[with_sound, with_sound]))
    assert both.use_audio_in_video
    assert all(v.audio is not None for v in both.videos)
    mixed = decode_request_media(Req(videos=[with_sound, silent]))
    assert not mixed.use_audio_in_video
    assert not decode_request_media(Req(videos=[silent])).use_audio_in_video
    arrays = decode_request_media(Req(videos=[np.zeros((2, 64, 64, 3), dtype=np.uint8), with_sound]))
    assert not arrays.use_audio_in_video
    assert not soundtracks_heard([])


def test_all_kinds_in_order_with_data_urls_and_python_objects() -> None:
    request = Req(
        images=["data:image/png;base64," + b64(png_bytes(400, 300)), Image.new("RGB", (50, 50))],
        audio=["data:audio/mpeg;base64," + b64(audio_bytes(1.0, "mp3")), np.zeros(8000, dtype=np.float32)],
        videos=["data:video/webm;base64," + b64(video_bytes(seconds=1.0, fmt="webm", codec="libvpx"))],
    )
    media = decode_request_media(request)
    assert next(image.size for image in media.images) == (400, 300)
    assert [a.shape[0] for a in media.audio][1] == 8000
    assert isinstance(media.videos[0], DecodedVideo)
    assert media.videos[0].frames.shape[0] == 2


def test_systemone_request_objects_are_accepted() -> None:
    request = SystemOneRequest.model_validate(
        {
            "state": "disk full on db-3",
            "questions": {"outage": {"type": "noul"}},
            "images": [b64(png_bytes(256, 256))],
        }
    )
    media = decode_request_media(request)
    assert len(media.images) == 1
    assert not media.audio
    assert not media.videos
