"""Frozen configuration for media handling: size/duration caps (`MediaLimits`) and source policy
(`MediaPolicy`). Both default to SPEC section 6: every cap on, remote URLs and local paths refused.

Settings are read once at the edge (consumer settings) and passed down as these objects; nothing here
reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

MIB = 1024 * 1024
SAMPLE_RATE = 16_000
"""Audio is always handed to the model as mono float32 at this rate."""
VIDEO_FPS = 2.0
"""Videos are sampled at (at most) one frame per 0.5 s of timestamps."""


@dataclass(frozen=True, slots=True)
class MediaLimits:
    """Caps checked before (and, where headers can lie, during) decoding.

    Byte caps apply to the encoded bytes of one item after base64 decoding or download; `total_bytes`
    to all items of one request together. Pixel caps on declared dimensions guard against
    decompression bombs. `video_frame_pixels` is the pixel cap of the decoded video frames handed to
    the vision processing (SPEC section 6: 262,144); the vision pixel windows are the model's, in
    `engine.media.vision`.
    """

    image_bytes: int = 4 * MIB
    image_pixels: int = 16_000_000
    audio_bytes: int = 8 * MIB
    audio_seconds: float = 300.0
    video_bytes: int = 16 * MIB
    video_seconds: float = 60.0
    video_pixels: int = 16_000_000
    video_frame_pixels: int = 262_144
    video_max_source_fps: float = 240.0
    total_bytes: int = 24 * MIB
    max_aspect_ratio: float = 200.0
    max_images: int = 4
    max_audio: int = 4
    max_videos: int = 2

    def __post_init__(self) -> None:
        sizes = {
            "image_bytes": self.image_bytes,
            "audio_bytes": self.audio_bytes,
            "video_bytes": self.video_bytes,
            "total_bytes": self.total_bytes,
            "video_frame_pixels": self.video_frame_pixels,
        }
        for name, value in sizes.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive")

    @property
    def video_max_frames(self) -> int:
        """Most source frames a video may decode to (duration cap x highest plausible frame rate)."""
        return int(self.video_seconds * self.video_max_source_fps) + 1

    @property
    def video_max_kept_frames(self) -> int:
        """Most frames a video may keep at 2 fps. Frames are kept by absolute stream time, so a stream
        that starts late keeps a burst of frames until its clock catches up; 16 frames of slack allow
        a start up to several seconds late (MPEG-TS starts at 1.4 s) without unbounded memory."""
        return int(self.video_seconds * VIDEO_FPS) + 16


@dataclass(frozen=True, slots=True)
class MediaPolicy:
    """Which sources are allowed. Defaults refuse every remote URL and every local path.

    - `allow_urls`: fetch `https://` URLs whose host is in `allowed_hosts` (exact names, `.example.com`
      for any subdomain of example.com, or `*` for any host) on a port in `allowed_ports`; targets must
      resolve to public addresses only. `http://` is never fetched.
    - `fetch_timeout_s`: wall-clock budget for one download (all redirects included).
    - `max_redirects`: redirects followed, each one re-checked like the first URL.
    - `media_root`: directory local paths are confined to (after resolving symlinks); None refuses paths.
    """

    allow_urls: bool = False
    allowed_hosts: frozenset[str] = field(default_factory=frozenset)
    allowed_ports: frozenset[int] = frozenset({443})
    fetch_timeout_s: float = 10.0
    max_redirects: int = 3
    media_root: Path | None = None

    def host_allowed(self, host: str) -> bool:
        """True when `host` (lower-cased, no trailing dot) matches `allowed_hosts`."""
        name = host.lower().rstrip(".")
        for entry in self.allowed_hosts:
            pattern = entry.lower().rstrip(".")
            if pattern == "*" or name == pattern:
                return True
            if pattern.startswith(".") and name.endswith(pattern) and len(name) > len(pattern):
                return True
        return False
