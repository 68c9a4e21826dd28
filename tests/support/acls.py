"""Create ACLs on a test broker (aiokafka's admin client has no ACL calls): CreateAcls and DescribeAcls
requests (v2, flexible) sent with aiokafka's protocol classes, as a super user.

Test-only; `grant` returns once the broker's authorizer lists every new binding (DescribeAcls is served
from the broker's own ACL cache), so the ACLs are in force when it returns.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import CompactArray, CompactString, Int8, Int16, Int32, Schema, TaggedFields

RESOURCE = {"topic": 2, "group": 3, "cluster": 4, "transactional_id": 5}
PATTERN = {"literal": 3, "prefixed": 4}
OPERATION = {"read": 3, "write": 4, "create": 5, "describe": 8, "idempotent_write": 12}
ALLOW = 3


@dataclass(frozen=True)
class Acl:
    """Allow `principal` (e.g. 'User:svc') `operation` on a resource (`pattern` literal or prefixed)."""

    principal: str
    resource: str
    name: str
    operation: str
    pattern: str = "literal"

    def row(self) -> tuple[Any, ...]:
        return (
            RESOURCE[self.resource], self.name, PATTERN[self.pattern], self.principal, "*",
            OPERATION[self.operation], ALLOW, {},
        )  # fmt: skip


class _CreateAclsResponse(Response):
    API_KEY = 30
    API_VERSION = 2
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "results",
            CompactArray(
                ("error_code", Int16), ("error_message", CompactString("utf-8")), ("tags", TaggedFields)
            ),
        ),
        ("tags", TaggedFields),
    )


class _CreateAclsStruct(RequestStruct):
    FLEXIBLE_VERSION = True
    API_KEY = 30
    API_VERSION = 2
    RESPONSE_TYPE = _CreateAclsResponse
    SCHEMA = Schema(
        (
            "creations",
            CompactArray(
                ("resource_type", Int8),
                ("resource_name", CompactString("utf-8")),
                ("resource_pattern_type", Int8),
                ("principal", CompactString("utf-8")),
                ("host", CompactString("utf-8")),
                ("operation", Int8),
                ("permission_type", Int8),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _CreateAcls(Request[_CreateAclsStruct]):
    API_KEY = 30

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self._rows = rows

    def build(self, request_struct_class: type[_CreateAclsStruct]) -> _CreateAclsStruct:
        return request_struct_class(self._rows, {})


class _DescribeAclsResponse(Response):
    API_KEY = 29
    API_VERSION = 2
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        ("error_message", CompactString("utf-8")),
        (
            "resources",
            CompactArray(
                ("resource_type", Int8),
                ("resource_name", CompactString("utf-8")),
                ("pattern_type", Int8),
                (
                    "acls",
                    CompactArray(
                        ("principal", CompactString("utf-8")),
                        ("host", CompactString("utf-8")),
                        ("operation", Int8),
                        ("permission_type", Int8),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _DescribeAclsStruct(RequestStruct):
    FLEXIBLE_VERSION = True
    API_KEY = 29
    API_VERSION = 2
    RESPONSE_TYPE = _DescribeAclsResponse
    SCHEMA = Schema(
        ("resource_type_filter", Int8), ("resource_name_filter", CompactString("utf-8")),
        ("pattern_type_filter", Int8), ("principal_filter", CompactString("utf-8")),
        ("host_filter", CompactString("utf-8")), ("operation", Int8), ("permission_type", Int8),
        ("tags", TaggedFields),
    )  # fmt: skip


class _DescribeAcls(Request[_DescribeAclsStruct]):
    API_KEY = 29

    def __init__(self, principal: str) -> None:
        self._principal = principal

    def build(self, request_struct_class: type[_DescribeAclsStruct]) -> _DescribeAclsStruct:
        # ANY resource, ANY pattern, this principal, any host, ANY operation, ANY permission
        return request_struct_class(1, None, 1, self._principal, None, 1, 1, {})


async def grant(bootstrap: str, acls: Sequence[Acl], timeout_s: float = 30.0) -> None:
    """Create `acls` through the super-user listener at `bootstrap`; returns once all are in force.

    Raises `RuntimeError` on a broker error or when they are not listed within `timeout_s`.
    """
    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)
    await client.bootstrap()
    try:
        node = client.get_random_node()
        response = await client.send(node, _CreateAcls([acl.row() for acl in acls]))
        for code, message, _ in response.results:
            if code != 0:
                raise RuntimeError(f"CreateAcls failed: error {code}: {message}")
        wanted = {(RESOURCE[a.resource], a.name, PATTERN[a.pattern], OPERATION[a.operation]) for a in acls}
        deadline = time.monotonic() + timeout_s
        while True:
            seen: set[tuple[int, str, int, int]] = set()
            for principal in {a.principal for a in acls}:
                described = await client.send(node, _DescribeAcls(principal))
                for rtype, rname, ptype, entries, _ in described.resources:
                    seen |= {(rtype, rname, ptype, entry[2]) for entry in entries}
            if wanted <= seen:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"ACLs not in force after {timeout_s:.0f} s: {sorted(wanted - seen)}")
            await asyncio.sleep(0.1)
    finally:
        await client.close()
