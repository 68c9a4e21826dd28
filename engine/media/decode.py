"""Decode every media item of one request: `decode_request_media` (alias `load_media`).

Items are decoded in SPEC order (images, then audio, then videos), each under its own byte cap and the
request-wide `limits.total_bytes` (bytes after base64 decoding or download). The first refusal stops
the request with a `MediaError` located at the item (`images[1]`, `videos[0]`, ...). A video soundtrack
is used (`use_audio_in_video`) only when every video of the request has one.
CPU and I/O bound, blocking; call from a CPU worker thread. Thread-safe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np
from PIL import Image

from engine.media.audio import audio_from_array, decode_audio
from engine.media.containers import FloatArray
from engine.media.errors import MediaError, too_large, undecodable
from engine.media.fetch import fetch_url
from engine.media.image import decode_image, image_from_object
from engine.media.limits import MediaLimits, MediaPolicy
from engine.media.sources import Fetch, Kind, read_source
from engine.media.video import DecodedVideo, decode_video, video_from_array

log = logging.getLogger(__name__)
T = TypeVar("T")

_ENCODED = (str, bytes, bytearray, memoryview)


class HasMedia(Protocol):
    """What decoding needs from a request (`schemas` `SystemOneRequest` satisfies it)."""

    @property
    def images(self) -> Sequence[object] | None: ...
    @property
    def audio(self) -> Sequence[object] | None: ...
    @property
    def videos(self) -> Sequence[object] | None: ...


@dataclass(frozen=True, slots=True, eq=False)
class DecodedMedia:
    """A request's media ready for the processor, in SPEC order within each kind.

    `images`: RGB PIL images within the pixel window; `audio`: mono float32 16 kHz arrays; `videos`:
    2 fps frames with their soundtracks; `use_audio_in_video`: every video has a soundtrack (and there
    is at least one video), so soundtracks are heard, interleaved with their video's tokens.
    """

    images: tuple[Image.Image, ...] = ()
    audio: tuple[FloatArray, ...] = ()
    videos: tuple[DecodedVideo, ...] = ()
    use_audio_in_video: bool = False

    @property
    def empty(self) -> bool:
        return not (self.images or self.audio or self.videos)


EMPTY = DecodedMedia()


def soundtracks_heard(videos: Sequence[DecodedVideo]) -> bool:
    """The request-level soundtrack policy: heard only when every video has one (and there are videos)."""
    return bool(videos) and all(video.audio is not None for video in videos)


class _Budget:
    def __init__(self, limits: MediaLimits, policy: MediaPolicy, fetch: Fetch) -> None:
        self.limits = limits
        self.policy = policy
        self.fetch = fetch
        self.used = 0

    def read(self, item: object, kind: Kind, cap: int) -> bytes:
        if not isinstance(item, _ENCODED):
            raise undecodable(f"unsupported {kind} item type {type(item).__name__}")
        left = self.limits.total_bytes - self.used
        if left <= 0:
            raise too_large(f"media together exceed {self.limits.total_bytes} bytes")
        data = read_source(item, kind, min(cap, left), self.policy, self.fetch)
        self.used += len(data)
        return data


def _items(values: Sequence[object] | None, kind: str, most: int) -> Sequence[object]:
    items = values or ()
    if len(items) > most:
        raise too_large(f"at most {most} {kind} items are allowed")
    return items


def _image(item: object, budget: _Budget) -> Image.Image:
    if isinstance(item, Image.Image | np.ndarray):
        return image_from_object(item, budget.limits)
    return decode_image(budget.read(item, "image", budget.limits.image_bytes), budget.limits)


def _audio(item: object, budget: _Budget) -> FloatArray:
    if isinstance(item, np.ndarray):
        return audio_from_array(item, budget.limits)
    return decode_audio(budget.read(item, "audio", budget.limits.audio_bytes), budget.limits)


def _video(item: object, budget: _Budget) -> DecodedVideo:
    if isinstance(item, np.ndarray):
        return video_from_array(item, budget.limits)
    return decode_video(budget.read(item, "video", budget.limits.video_bytes), budget.limits)


def decode_request_media(
    request: HasMedia,
    limits: MediaLimits | None = None,
    policy: MediaPolicy | None = None,
    *,
    fetch: Fetch = fetch_url,
) -> DecodedMedia:
    """Decode the request's `images`, `audio` and `videos` (SPEC section 6).

    Returns `EMPTY` for a text-only request. Raises `MediaError` (a `RequestError`, status 400) with a
    media reason code for the first item refused; any unexpected failure inside a decoder is reported as
    media_undecodable for that item (a bad request never becomes a server error).
    """
    limits = limits or MediaLimits()
    policy = policy or MediaPolicy()
    images = _items(request.images, "image", limits.max_images)
    audio = _items(request.audio, "audio", limits.max_audio)
    videos = _items(request.videos, "video", limits.max_videos)
    if not (images or audio or videos):
        return EMPTY
    budget = _Budget(limits, policy, fetch)
    out_images = tuple(_located(_image, item, budget, f"images[{i}]") for i, item in enumerate(images))
    out_audio = tuple(_located(_audio, item, budget, f"audio[{i}]") for i, item in enumerate(audio))
    out_videos = tuple(_located(_video, item, budget, f"videos[{i}]") for i, item in enumerate(videos))
    return DecodedMedia(out_images, out_audio, out_videos, soundtracks_heard(out_videos))


load_media = decode_request_media
"""The name docs/interfaces.md uses."""


def _located(decoder: Callable[[object, _Budget], T], item: object, budget: _Budget, where: str) -> T:
    try:
        return decoder(item, budget)
    except MediaError as exc:
        raise exc.at(where) from exc
    except Exception as exc:  # decoder bugs or exotic library errors: still this item's fault, never a 5xx
        log.warning("media decoder failed unexpectedly at %s", where, exc_info=True)
        raise undecodable(f"cannot decode ({type(exc).__name__})").at(where) from exc
