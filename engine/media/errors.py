"""The one error type media handling raises: a permanent, client-caused refusal with a stable code.

Every refusal (forbidden source, size or duration cap, decompression bomb, undecodable bytes) raises
`MediaError`, a `schemas.errors.RequestError` with HTTP status 400 and a media `DlqReason`, so the HTTP
layer answers it and the Kafka pipeline dead-letters it without knowing anything about media.
Messages never contain payload bytes, URLs' query strings or file contents.
"""

from __future__ import annotations

from schemas.errors import DlqReason, RequestError

MEDIA_REASONS: frozenset[DlqReason] = frozenset(
    {
        DlqReason.media_bad_source,
        DlqReason.media_forbidden_url,
        DlqReason.media_forbidden_path,
        DlqReason.media_fetch_failed,
        DlqReason.media_too_large,
        DlqReason.media_too_long,
        DlqReason.media_bomb,
        DlqReason.media_undecodable,
    }
)
"""The reason codes a `MediaError` may carry."""


class MediaError(RequestError):
    """A media item was refused. `reason` is one of `MEDIA_REASONS`; `status` is always 400.

    `where` names the item (e.g. `images[1]`) once `decode_request_media` has attached it; the
    message then starts with it so a client can tell which attachment failed.
    """

    def __init__(self, reason: DlqReason, message: str, *, where: str | None = None) -> None:
        if reason not in MEDIA_REASONS:
            raise ValueError(f"not a media reason: {reason!r}")
        self.where = where
        super().__init__(reason, f"{where}: {message}" if where else message, status=400)
        self.detail = message

    def at(self, where: str) -> MediaError:
        """A copy of this error located at `where` (the original message kept, location prefixed)."""
        located = MediaError(self.reason, self.detail, where=where)
        located.__cause__ = self.__cause__
        return located


def bad_source(message: str) -> MediaError:
    return MediaError(DlqReason.media_bad_source, message)


def forbidden_url(message: str) -> MediaError:
    return MediaError(DlqReason.media_forbidden_url, message)


def forbidden_path(message: str) -> MediaError:
    return MediaError(DlqReason.media_forbidden_path, message)


def fetch_failed(message: str) -> MediaError:
    return MediaError(DlqReason.media_fetch_failed, message)


def too_large(message: str) -> MediaError:
    return MediaError(DlqReason.media_too_large, message)


def too_long(message: str) -> MediaError:
    return MediaError(DlqReason.media_too_long, message)


def bomb(message: str) -> MediaError:
    return MediaError(DlqReason.media_bomb, message)


def undecodable(message: str) -> MediaError:
    return MediaError(DlqReason.media_undecodable, message)
