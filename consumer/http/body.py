"""Reading an HTTP request body under a size limit, with optional request compression.

The limit applies twice: to the bytes on the wire (a declared `Content-Length` over it is refused before
any byte is read; a chunked body is counted as it arrives) and to the decompressed body, so a small
compressed body cannot expand into a large one. `Content-Encoding: gzip` and `deflate` are always
understood, and `zstd` (what the official SDK sends when zstd is available to it) through
`compression.zstd` (Python 3.14+) or the `backports.zstd` package (a dependency before 3.14).
Decompression runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import importlib
import zlib
from collections.abc import Callable
from typing import Any

from starlette.requests import Request


class BodyError(Exception):
    """The body cannot be read: `status` 413 (too large), 415 (unknown encoding) or 400 (corrupt)."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type


def _zstd_module() -> Any:
    for name in ("compression.zstd", "backports.zstd"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


_ZSTD = _zstd_module()


def _inflate(wbits: int) -> Callable[[bytes, int], bytes]:
    def run(data: bytes, limit: int) -> bytes:
        d = zlib.decompressobj(wbits)
        out = d.decompress(data, limit + 1)
        if len(out) > limit:
            raise BodyError(413, "request_too_large", f"decompressed body larger than {limit} bytes")
        if not d.eof:
            raise BodyError(400, "bad_request", "truncated compressed body")
        return out

    return run


def _unzstd(data: bytes, limit: int) -> bytes:
    d = _ZSTD.ZstdDecompressor()
    out: bytes = d.decompress(data, max_length=limit + 1)
    if len(out) > limit:
        raise BodyError(413, "request_too_large", f"decompressed body larger than {limit} bytes")
    if not d.eof:
        raise BodyError(400, "bad_request", "truncated compressed body")
    return out


_DECODERS: dict[str, Callable[[bytes, int], bytes]] = {"gzip": _inflate(31), "deflate": _inflate(15)}
if _ZSTD is not None:
    _DECODERS["zstd"] = _unzstd


def supported_encodings() -> list[str]:
    """The `Content-Encoding` values this process can decode (besides `identity`)."""
    return sorted(_DECODERS)


def _decode(decoder: Callable[[bytes, int], bytes], data: bytes, limit: int) -> bytes:
    try:
        return decoder(data, limit)
    except BodyError:
        raise
    except Exception as exc:  # zlib.error, ZstdError: corrupt input
        raise BodyError(400, "bad_request", f"cannot decompress the body: {type(exc).__name__}") from None


async def read_body(request: Request, limit: int) -> bytes:
    """The whole request body, decompressed; at most `limit` bytes on the wire and after decompression.

    Raises `BodyError`; may raise `starlette.requests.ClientDisconnect` when the client goes away.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyError(413, "request_too_large", f"body larger than {limit} bytes")
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    decoder = None
    if encoding not in ("", "identity"):
        decoder = _DECODERS.get(encoding)
        if decoder is None:
            raise BodyError(
                415,
                "unsupported_media_type",
                f"Content-Encoding {encoding[:40]!r} not "
                f"supported; use one of {', '.join(['identity', *supported_encodings()])}",
            )
    chunks = bytearray()
    async for chunk in request.stream():
        chunks += chunk
        if len(chunks) > limit:
            raise BodyError(413, "request_too_large", f"body larger than {limit} bytes")
    if decoder is None:
        return bytes(chunks)
    return await asyncio.to_thread(_decode, decoder, bytes(chunks), limit)
