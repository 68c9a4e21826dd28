"""Requests for the caller's authorized operations (KIP-430), used by the start-up access check
(`consumer.kafka.access`): Metadata v8 per topic (aiokafka's metadata requests stop at v5) and
DescribeGroups v3 per group (aiokafka 0.14 has v3 but parses its answer with the v2 schema, dropping
`authorized_operations`).

Built on aiokafka's protocol classes; both are non-flexible versions that Kafka 4.x serves.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Boolean, Bytes, Int16, Int32, Schema, String

UNSET_OPERATIONS = -(2**31)  # what the broker sends when authorized operations were not asked for


class AclOperation(IntEnum):
    """Kafka's ACL operation codes; bit `code` of an authorized-operations field is set when allowed."""

    READ = 3
    WRITE = 4
    CREATE = 5
    DESCRIBE = 8


class _MetadataResponseV8(Response):  # type: ignore[misc]
    API_KEY = 3
    API_VERSION = 8
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "brokers",
            Array(("node_id", Int32), ("host", String("utf-8")), ("port", Int32), ("rack", String("utf-8"))),
        ),
        ("cluster_id", String("utf-8")),
        ("controller_id", Int32),
        (
            "topics",
            Array(
                ("error_code", Int16),
                ("name", String("utf-8")),
                ("is_internal", Boolean),
                (
                    "partitions",
                    Array(
                        ("error_code", Int16),
                        ("partition_index", Int32),
                        ("leader_id", Int32),
                        ("leader_epoch", Int32),
                        ("replica_nodes", Array(Int32)),
                        ("isr_nodes", Array(Int32)),
                        ("offline_replicas", Array(Int32)),
                    ),
                ),
                ("topic_authorized_operations", Int32),
            ),
        ),
        ("cluster_authorized_operations", Int32),
    )


class _MetadataRequestV8(RequestStruct):  # type: ignore[misc]
    API_KEY = 3
    API_VERSION = 8
    RESPONSE_TYPE = _MetadataResponseV8
    SCHEMA = Schema(
        ("topics", Array(String("utf-8"))),
        ("allow_auto_topic_creation", Boolean),
        ("include_cluster_authorized_operations", Boolean),
        ("include_topic_authorized_operations", Boolean),
    )


class AuthorizedTopicsRequest(Request[_MetadataRequestV8]):  # type: ignore[misc]
    """Metadata for `topics` with the authorized operations of the connection's principal."""

    API_KEY = 3

    def __init__(self, topics: list[str]) -> None:
        self._topics = topics

    def build(self, request_struct_class: type[_MetadataRequestV8]) -> _MetadataRequestV8:
        return request_struct_class(self._topics, False, False, True)


@dataclass(frozen=True, slots=True)
class TopicAccess:
    """One topic's answer: Kafka error code (0, 3 unknown topic, 29 not authorized) and allowed ops."""

    name: str
    error_code: int
    operations: int

    def allows(self, op: AclOperation) -> bool:
        """True when the broker reported `op` as allowed (False when it reported nothing)."""
        # The broker fills the field for unknown topics too (what this principal could do once it exists).
        return self.operations != UNSET_OPERATIONS and bool(self.operations >> op & 1)


def parse_topic_access(response: Response) -> list[TopicAccess]:
    """The per-topic entries of an `AuthorizedTopicsRequest` response."""
    return [
        TopicAccess(name=name, error_code=code, operations=ops)
        for code, name, _internal, _parts, ops in response.topics
    ]


class _DescribeGroupsResponseV3(Response):  # type: ignore[misc]
    API_KEY = 15
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "groups",
            Array(
                ("error_code", Int16),
                ("group", String("utf-8")),
                ("state", String("utf-8")),
                ("protocol_type", String("utf-8")),
                ("protocol", String("utf-8")),
                (
                    "members",
                    Array(
                        ("member_id", String("utf-8")),
                        ("client_id", String("utf-8")),
                        ("client_host", String("utf-8")),
                        ("member_metadata", Bytes),
                        ("member_assignment", Bytes),
                    ),
                ),
                ("authorized_operations", Int32),
            ),
        ),
    )


class _DescribeGroupsRequestV3(RequestStruct):  # type: ignore[misc]
    API_KEY = 15
    API_VERSION = 3
    RESPONSE_TYPE = _DescribeGroupsResponseV3
    SCHEMA = Schema(("groups", Array(String("utf-8"))), ("include_authorized_operations", Boolean))


class AuthorizedGroupRequest(Request[_DescribeGroupsRequestV3]):  # type: ignore[misc]
    """DescribeGroups for one group with the authorized operations of the connection's principal."""

    API_KEY = 15

    def __init__(self, group: str) -> None:
        self._group = group

    def build(self, request_struct_class: type[_DescribeGroupsRequestV3]) -> _DescribeGroupsRequestV3:
        return request_struct_class([self._group], True)


def parse_group_operations(response: Response) -> tuple[int, int]:
    """(error code, authorized operations) of the one group of an `AuthorizedGroupRequest` response."""
    error_code, *_, operations = response.groups[0]
    return int(error_code), int(operations)
