"""What a consumer group has committed on a topic, as the Kafka benches read it (`bench.soak`,
`bench.scaleout`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiokafka.admin import AIOKafkaAdminClient


async def committed(admin: AIOKafkaAdminClient, group: str, topic: str, previous: int = 0) -> int:
    """The offsets `group` committed on `topic`, summed over its partitions (partitions without a commit
    count 0). Returns `previous` when the broker does not answer with offsets (`KafkaError`: the first
    seconds of a new group have no coordinator yet). Awaits one OffsetFetch through the started `admin`."""
    from aiokafka.errors import KafkaError

    try:
        offsets = await admin.list_consumer_group_offsets(group)
    except KafkaError:
        return previous
    return int(sum(m.offset for tp, m in offsets.items() if tp.topic == topic and m.offset > 0))
