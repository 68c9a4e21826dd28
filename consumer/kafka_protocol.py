"""Metadata v8 with the caller's authorized operations per topic (KIP-430), which aiokafka does not ask
for (its metadata requests stop at v5). Used by the start-up access check (`consumer.kafka_access`).

Built on aiokafka's protocol classes; v8 is the newest non-flexible version and Kafka 4.x serves it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Boolean, Int16, Int32, Schema, String

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
