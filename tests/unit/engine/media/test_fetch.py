"""Remote URL policy: refusals happen before any connection (fake resolver, recording connector); the
download path (redirects re-checked, byte cap, timeouts) runs against a loopback HTTP server reached
through a fake connector, so no traffic ever leaves this machine."""

from __future__ import annotations

import http.client
import http.server
import threading
from collections.abc import Iterator, Sequence
from typing import ClassVar

import pytest

from engine.media.errors import MediaError
from engine.media.fetch import Resolver, address_is_public, check_url, fetch_url
from engine.media.limits import MediaPolicy

PUBLIC = "93.184.216.34"
ANY = MediaPolicy(allow_urls=True, allowed_hosts=frozenset({"*"}))
OPEN = MediaPolicy(allow_urls=True, allowed_hosts=frozenset({"media.example.com", ".cdn.example.net"}))


def resolver_for(*addresses: str) -> Resolver:
    def resolve(host: str, port: int) -> Sequence[str]:
        return list(addresses)

    return resolve


class Recorder:
    def __init__(self, port: int | None = None) -> None:
        self.calls: list[tuple[str, int, str]] = []
        self.port = port

    def __call__(self, ip: str, port: int, host: str, timeout: float) -> http.client.HTTPConnection:
        self.calls.append((ip, port, host))
        if self.port is None:
            raise AssertionError("connection attempted")
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "169.254.169.254",
        "10.0.0.1",
        "172.16.5.4",
        "192.168.1.1",
        "100.64.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "240.0.0.1",
        "::1",
        "fe80::1",
        "fc00::1",
        "::ffff:127.0.0.1",
        "2002:7f00:1::",
        "garbage",
    ],
)
def test_non_public_addresses(address: str) -> None:
    assert not address_is_public(address)


def test_public_addresses() -> None:
    assert address_is_public(PUBLIC)
    assert address_is_public("2606:4700::1111")


@pytest.mark.parametrize(
    ("url", "policy", "addresses", "reason"),
    [
        ("https://media.example.com/a.png", MediaPolicy(), [PUBLIC], "media_forbidden_url"),
        ("http://media.example.com/a.png", OPEN, [PUBLIC], "media_forbidden_url"),
        ("ftp://media.example.com/a.png", OPEN, [PUBLIC], "media_forbidden_url"),
        ("https://other.example.org/a.png", OPEN, [PUBLIC], "media_forbidden_url"),
        ("https://media.example.com:8443/a.png", OPEN, [PUBLIC], "media_forbidden_url"),
        ("https://user:pw@media.example.com/a.png", OPEN, [PUBLIC], "media_forbidden_url"),
        ("https://media.example.com/a.png", OPEN, ["127.0.0.1"], "media_forbidden_url"),
        ("https://media.example.com/a.png", OPEN, ["169.254.169.254"], "media_forbidden_url"),
        ("https://media.example.com/a.png", OPEN, ["10.0.0.1"], "media_forbidden_url"),
        ("https://media.example.com/a.png", OPEN, [PUBLIC, "10.0.0.1"], "media_forbidden_url"),
        ("https://a.cdn.example.net/a.png", OPEN, ["::ffff:169.254.169.254"], "media_forbidden_url"),
        ("https://127.0.0.1/a.png", ANY, [], "media_forbidden_url"),
        ("https://169.254.169.254/latest", ANY, [], "media_forbidden_url"),
        (
            "https://10.0.0.1/a.png",
            MediaPolicy(allow_urls=True, allowed_hosts=frozenset({"10.0.0.1"})),
            [],
            "media_forbidden_url",
        ),
        ("https://media.example.com/a.png", OPEN, [], "media_fetch_failed"),
        ("https://media.example.com:notaport/", OPEN, [PUBLIC], "media_bad_source"),
    ],
)
def test_refused_before_any_connection(
    url: str, policy: MediaPolicy, addresses: list[str], reason: str
) -> None:
    connector = Recorder()
    with pytest.raises(MediaError) as info:
        fetch_url(url, policy, 1000, resolver=resolver_for(*addresses), connector=connector)
    assert info.value.reason == reason
    assert connector.calls == []


def test_check_url_pins_the_checked_address() -> None:
    target = check_url("https://x.cdn.example.net/p/a.png?s=1", OPEN, resolver_for(PUBLIC, "1.1.1.1"))
    assert (target.host, target.port, target.ip, target.path) == (
        "x.cdn.example.net",
        443,
        PUBLIC,
        "/p/a.png?s=1",
    )


class _Handler(http.server.BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, tuple[int, dict[str, str], bytes]]] = {}

    def do_GET(self) -> None:
        status, headers, body = self.routes.get(self.path, (404, {}, b""))
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        if "Content-Length" not in headers and "X-No-Length" not in headers:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[int]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield int(httpd.server_address[1])
    httpd.shutdown()
    httpd.server_close()


def test_download_with_rechecked_redirects(server: int) -> None:
    _Handler.routes = {
        "/a": (302, {"Location": "https://x.cdn.example.net/b"}, b""),
        "/b": (200, {}, b"payload"),
    }
    connector = Recorder(server)
    body = fetch_url(
        "https://media.example.com/a", OPEN, 100, resolver=resolver_for(PUBLIC), connector=connector
    )
    assert body == b"payload"
    assert connector.calls == [(PUBLIC, 443, "media.example.com"), (PUBLIC, 443, "x.cdn.example.net")]


@pytest.mark.parametrize(
    ("routes", "reason", "calls"),
    [
        ({"/a": (302, {"Location": "https://evil.example.org/b"}, b"")}, "media_forbidden_url", 1),
        ({"/a": (301, {"Location": "http://media.example.com/b"}, b"")}, "media_forbidden_url", 1),
        ({"/a": (302, {"Location": "/a"}, b"")}, "media_fetch_failed", 4),
        ({"/a": (200, {}, b"x" * 101)}, "media_too_large", 1),
        ({"/a": (200, {"X-No-Length": "1", "Connection": "close"}, b"x" * 5000)}, "media_too_large", 1),
        ({"/a": (200, {"Content-Encoding": "gzip"}, b"x")}, "media_fetch_failed", 1),
        ({}, "media_fetch_failed", 1),
    ],
)
def test_download_refusals(
    server: int, routes: dict[str, tuple[int, dict[str, str], bytes]], reason: str, calls: int
) -> None:
    _Handler.routes = routes
    connector = Recorder(server)
    with pytest.raises(MediaError) as info:
        fetch_url(
            "https://media.example.com/a", OPEN, 100, resolver=resolver_for(PUBLIC), connector=connector
        )
    assert info.value.reason == reason
    assert len(connector.calls) == calls


def test_redirect_to_a_private_address_is_refused_before_connecting(server: int) -> None:
    _Handler.routes = {"/a": (302, {"Location": "https://x.cdn.example.net/b"}, b"")}
    answers = {"media.example.com": [PUBLIC], "x.cdn.example.net": ["10.0.0.1"]}
    connector = Recorder(server)
    with pytest.raises(MediaError) as info:
        fetch_url(
            "https://media.example.com/a",
            OPEN,
            100,
            resolver=lambda host, port: answers[host],
            connector=connector,
        )
    assert info.value.reason == "media_forbidden_url"
    assert connector.calls == [(PUBLIC, 443, "media.example.com")]


def test_overall_deadline(server: int) -> None:
    _Handler.routes = {"/a": (200, {}, b"ok")}
    ticks = iter([0.0, 0.0, 100.0, 100.0, 100.0])
    with pytest.raises(MediaError) as info:
        fetch_url(
            "https://media.example.com/a",
            OPEN,
            100,
            resolver=resolver_for(PUBLIC),
            connector=Recorder(server),
            clock=lambda: next(ticks),
        )
    assert info.value.reason == "media_fetch_failed"
    assert "timed out" in info.value.message
