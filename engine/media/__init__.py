"""Media handling for clef-router (SPEC section 6): sources, security policy, limits and decoding.

Public API:
- `decode_request_media(request, limits, policy) -> DecodedMedia` (alias `load_media`), raising
  `MediaError` (a `schemas.errors.RequestError`, status 400) with a media `DlqReason`;
- `MediaLimits`, `MediaPolicy` frozen configs (defaults = SPEC defaults: URLs and paths refused);
- `DecodedMedia`, `DecodedVideo`; `soundtracks_heard` (the request-level soundtrack policy).
Processor inputs and media token expansion live in `engine.media.features`.
"""

from engine.media.decode import (
    EMPTY,
    DecodedMedia,
    HasMedia,
    decode_request_media,
    load_media,
    soundtracks_heard,
)
from engine.media.errors import MEDIA_REASONS, MediaError
from engine.media.limits import SAMPLE_RATE, VIDEO_FPS, MediaLimits, MediaPolicy
from engine.media.video import DecodedVideo

__all__ = [
    "EMPTY",
    "MEDIA_REASONS",
    "SAMPLE_RATE",
    "VIDEO_FPS",
    "DecodedMedia",
    "DecodedVideo",
    "HasMedia",
    "MediaError",
    "MediaLimits",
    "MediaPolicy",
    "decode_request_media",
    "load_media",
    "soundtracks_heard",
]
