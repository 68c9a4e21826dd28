"""Turn one wire media item (a string) into its encoded bytes, enforcing `MediaPolicy` and byte caps.

Accepted strings, tried in this order:
1. `data:<mime>;base64,<payload>` (the mime type must match the item kind, or be empty/octet-stream);
2. `<scheme>://...` URLs, fetched by `fetch.fetch_url` under the policy (https only, allowlist, ...);
3. bare base64 (only base64 characters and whitespace, at least 64 characters, or anything too long to
   be a path);
4. otherwise a local path, refused unless `policy.media_root` is set, then confined to it.
Raw `bytes` (Python API) pass through with the byte cap. Base64 payloads are refused by length before
any decoding. Blocking (file and network I/O); call from a CPU worker thread.
"""

from __future__ import annotations

import base64
import binascii
import math
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Literal

from engine.media.errors import bad_source, forbidden_path, too_large
from engine.media.fetch import fetch_url
from engine.media.limits import MediaPolicy

Kind = Literal["image", "audio", "video"]
Fetch = Callable[[str, MediaPolicy, int], bytes]
"""(url, policy, max_bytes) -> body; `fetch.fetch_url` by default, a fake in tests."""

_MAX_PATH_CHARS = 4096
_MIN_BASE64_CHARS = 64
_MAX_DATA_HEADER = 256
_URL_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
_BASE64_RE = re.compile(r"[A-Za-z0-9+/=\s]+")
_SPACE_RE = re.compile(r"\s")
_GENERIC_MIME = frozenset({"", "application/octet-stream"})


def base64_limit(max_bytes: int) -> int:
    """Longest unwrapped base64 text whose decoded size can still be within `max_bytes`."""
    return 4 * math.ceil(max_bytes / 3)


def read_source(
    item: str | bytes | bytearray | memoryview,
    kind: Kind,
    max_bytes: int,
    policy: MediaPolicy,
    fetch: Fetch = fetch_url,
) -> bytes:
    """The encoded bytes of one media item (at most `max_bytes` of them).

    Raises `MediaError`: media_too_large (byte cap, checked on base64 length before decoding),
    media_bad_source (malformed data URL or base64, wrong mime type, missing file),
    media_forbidden_url / media_fetch_failed (remote URLs), media_forbidden_path (local paths).
    """
    if isinstance(item, bytes | bytearray | memoryview):
        data = bytes(item)
        if len(data) > max_bytes:
            raise too_large(f"{kind} is larger than {max_bytes} bytes")
        return data
    text = item.strip()
    if not text:
        raise bad_source(f"empty {kind} item")
    if text[:5].lower() == "data:":
        return _data_url(text, kind, max_bytes)
    if _URL_RE.match(text[:64]):
        return fetch(text, policy, max_bytes)
    if len(text) > _MAX_PATH_CHARS or (
        len(text) >= _MIN_BASE64_CHARS and _BASE64_RE.fullmatch(text) is not None
    ):
        return decode_base64(text, kind, max_bytes)
    return read_path(text, policy, kind, max_bytes)


def decode_base64(text: str, kind: str, max_bytes: int) -> bytes:
    """Strict base64 decoding, refusing an oversized payload from its length alone first."""
    limit = base64_limit(max_bytes)
    # Line-wrapped base64 (MIME, PEM) adds at most a few percent of whitespace.
    if len(text) > limit + limit // 16 + 16:
        raise too_large(f"{kind} is larger than {max_bytes} bytes")
    if _SPACE_RE.search(text) is not None:
        text = _SPACE_RE.sub("", text)
    if len(text) > limit:
        raise too_large(f"{kind} is larger than {max_bytes} bytes")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise bad_source(f"{kind} is not valid base64") from exc
    if len(data) > max_bytes:
        raise too_large(f"{kind} is larger than {max_bytes} bytes")
    if not data:
        raise bad_source(f"{kind} is empty")
    return data


def _data_url(text: str, kind: Kind, max_bytes: int) -> bytes:
    comma = text.find(",", 0, _MAX_DATA_HEADER)
    if comma < 0:
        raise bad_source("malformed data URL")
    params = [part.strip().lower() for part in text[5:comma].split(";")]
    mime, flags = params[0], params[1:]
    if "base64" not in flags:
        raise bad_source("data URLs must be base64-encoded")
    if mime not in _GENERIC_MIME and not mime.startswith(f"{kind}/"):
        raise bad_source(f"data URL type does not match a {kind} item")
    return decode_base64(text[comma + 1 :], kind, max_bytes)


def read_path(text: str, policy: MediaPolicy, kind: str, max_bytes: int) -> bytes:
    """Read a local file confined to `policy.media_root`.

    Refuses (media_forbidden_path) when no root is configured, on `..` components, NUL bytes, paths
    outside the root before or after resolving symlinks, and non-regular files. The file is opened by
    walking the resolved components with O_NOFOLLOW from a descriptor of the root, so a symlink swapped
    in after the check cannot redirect the read.
    """
    if policy.media_root is None:
        raise forbidden_path("local media paths are disabled")
    if "\x00" in text:
        raise forbidden_path("media path contains a NUL byte")
    pure = PurePosixPath(text)
    if ".." in pure.parts:
        raise forbidden_path("media path traversal is not allowed")
    try:
        root = Path(policy.media_root).resolve(strict=True)
    except OSError as exc:
        raise forbidden_path("media root is not available") from exc
    candidate = Path(pure) if pure.is_absolute() else root / pure
    if not candidate.is_relative_to(root):
        raise forbidden_path("media path is outside the media root")
    try:
        resolved = candidate.resolve(strict=True)
    except OSError as exc:
        raise bad_source(f"{kind} file not found") from exc
    if not resolved.is_relative_to(root):
        raise forbidden_path("media path resolves outside the media root")
    parts = resolved.relative_to(root).parts
    if not parts:
        raise forbidden_path("media path is not a regular file")
    return _read_confined(root, parts, kind, max_bytes)


def _read_confined(root: Path, parts: tuple[str, ...], kind: str, max_bytes: int) -> bytes:
    dir_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            next_fd = os.open(part, dir_flags, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        file_fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    except OSError as exc:
        raise forbidden_path("media path changed while opening it") from exc
    finally:
        os.close(fd)
    info = os.fstat(file_fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(file_fd)
        raise forbidden_path("media path is not a regular file")
    with os.fdopen(file_fd, "rb") as handle:
        if info.st_size > max_bytes:
            raise too_large(f"{kind} is larger than {max_bytes} bytes")
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise too_large(f"{kind} is larger than {max_bytes} bytes")
    if not data:
        raise bad_source(f"{kind} file is empty")
    return data
