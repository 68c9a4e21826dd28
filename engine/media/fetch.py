"""Download one `https://` media item under `MediaPolicy`, refusing anything that could reach inside.

Order of checks for the first URL and for every redirect target: URLs enabled, scheme `https`, no user
info, port allowed, host in the allowlist, DNS resolved once, every resolved address public (no private,
loopback, link-local, reserved, multicast, unspecified or shared ranges, IPv4-mapped IPv6 unwrapped).
The connection then goes to the address that was checked (no second lookup, so DNS rebinding cannot
swap it), with TLS verified against the host name. Bodies are streamed with a byte cap and a wall-clock
deadline. Blocking; call from a CPU worker thread, never from the event loop.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from engine.media.errors import bad_source, fetch_failed, forbidden_url, too_large
from engine.media.limits import MediaPolicy

Resolver = Callable[[str, int], Sequence[str]]
"""(host, port) -> IP address strings. Raises OSError when the name does not resolve."""
Connector = Callable[[str, int, str, float], http.client.HTTPConnection]
"""(ip, port, host, timeout) -> an unopened connection to exactly `ip` that speaks for `host`."""
Clock = Callable[[], float]

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class Target:
    """A URL that passed every policy check: connect to `ip`:`port`, ask for `path` on `host`."""

    host: str
    port: int
    ip: str
    path: str


def system_resolver(host: str, port: int) -> list[str]:
    """All addresses `host` resolves to (stream sockets), in resolver order, without duplicates."""
    seen: list[str] = []
    for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        address = str(info[4][0])
        if address not in seen:
            seen.append(address)
    return seen


def address_is_public(address: str) -> bool:
    """True only for globally routable unicast addresses; False for anything unparsable."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is not None and not address_is_public(str(embedded)):
            return False
    blocked = (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_reserved
        or ip.is_multicast
        or ip.is_unspecified
    )
    return ip.is_global and not blocked


def check_url(url: str, policy: MediaPolicy, resolver: Resolver) -> Target:
    """Apply every policy check to `url` and resolve it; raise `MediaError` on the first failure.

    Raises media_forbidden_url for policy refusals, media_bad_source for malformed URLs and
    media_fetch_failed when the name does not resolve. Never opens a connection.
    """
    if not policy.allow_urls:
        raise forbidden_url("remote media URLs are disabled")
    try:
        parts = urlsplit(url)
        port = parts.port or 443
    except ValueError as exc:
        raise bad_source("malformed media URL") from exc
    if parts.scheme.lower() != "https":
        raise forbidden_url("only https media URLs are allowed")
    if parts.username is not None or parts.password is not None:
        raise forbidden_url("media URLs must not carry credentials")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise bad_source("media URL has no host")
    if port not in policy.allowed_ports:
        raise forbidden_url(f"port {port} is not allowed")
    if not policy.host_allowed(host):
        raise forbidden_url("host is not in the media host allowlist")
    try:
        ipaddress.ip_address(host)
        addresses: Sequence[str] = [host]
    except ValueError:
        try:
            addresses = resolver(host, port)
        except (OSError, UnicodeError) as exc:
            raise fetch_failed("media host does not resolve") from exc
    if not addresses:
        raise fetch_failed("media host does not resolve")
    for address in addresses:
        if not address_is_public(address):
            raise forbidden_url("media host resolves to a non-public address")
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return Target(host=host, port=port, ip=addresses[0], path=path)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to a fixed IP: the TCP connection goes to `ip`, SNI and certificate checks use the host."""

    def __init__(self, ip: str, port: int, host: str, timeout: float, context: ssl.SSLContext) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._pinned_ip = ip
        self._pinned_context = context

    def connect(self) -> None:
        sock = socket.create_connection((self._pinned_ip, self.port), self.timeout)
        self.sock = self._pinned_context.wrap_socket(sock, server_hostname=self.host)


def pinned_https_connection(ip: str, port: int, host: str, timeout: float) -> http.client.HTTPConnection:
    """The default `Connector`: verified TLS (system CAs) to `ip`, speaking for `host`."""
    return _PinnedHTTPSConnection(ip, port, host, timeout, ssl.create_default_context())


def fetch_url(
    url: str,
    policy: MediaPolicy,
    max_bytes: int,
    *,
    resolver: Resolver = system_resolver,
    connector: Connector = pinned_https_connection,
    clock: Clock = time.monotonic,
) -> bytes:
    """Download `url` (following at most `policy.max_redirects` re-checked redirects) and return the body.

    Blocking, bounded by `policy.fetch_timeout_s` overall and `max_bytes` of body. Raises `MediaError`:
    media_forbidden_url / media_bad_source from `check_url`, media_too_large when the declared or
    streamed size passes `max_bytes`, media_fetch_failed for network errors, timeouts, non-200 answers,
    compressed bodies and redirect loops.
    """
    deadline = clock() + policy.fetch_timeout_s
    current = url
    for _ in range(policy.max_redirects + 1):
        target = check_url(current, policy, resolver)
        remaining = deadline - clock()
        if remaining <= 0:
            raise fetch_failed("media download timed out")
        conn = connector(target.ip, target.port, target.host, remaining)
        try:
            conn.request(
                "GET",
                target.path,
                headers={"User-Agent": "clef-router", "Accept-Encoding": "identity", "Connection": "close"},
            )
            response = conn.getresponse()
            if response.status in _REDIRECTS:
                location = response.getheader("Location")
                if not location:
                    raise fetch_failed("media redirect without a location")
                current = urljoin(current, location)
                continue
            if response.status != 200:
                raise fetch_failed(f"media URL answered HTTP {response.status}")
            return _read_body(conn, response, max_bytes, deadline, clock)
        except (OSError, http.client.HTTPException) as exc:
            raise fetch_failed(f"media download failed ({type(exc).__name__})") from exc
        finally:
            conn.close()
    raise fetch_failed("too many media redirects")


def _read_body(
    conn: http.client.HTTPConnection,
    response: http.client.HTTPResponse,
    max_bytes: int,
    deadline: float,
    clock: Clock,
) -> bytes:
    encoding = (response.getheader("Content-Encoding") or "identity").strip().lower()
    if encoding != "identity":
        raise fetch_failed("media URL answered with a compressed body")
    declared = response.getheader("Content-Length")
    if declared is not None and declared.strip().isdigit() and int(declared) > max_bytes:
        raise too_large(f"media download declares more than {max_bytes} bytes")
    chunks: list[bytes] = []
    received = 0
    while True:
        remaining = deadline - clock()
        if remaining <= 0:
            raise fetch_failed("media download timed out")
        if conn.sock is not None:
            conn.sock.settimeout(remaining)
        chunk = response.read(min(_CHUNK, max_bytes + 1 - received))
        if not chunk:
            return b"".join(chunks)
        received += len(chunk)
        if received > max_bytes:
            raise too_large(f"media download exceeds {max_bytes} bytes")
        chunks.append(chunk)
