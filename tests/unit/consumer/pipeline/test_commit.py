"""`consumer.pipeline.commit.Committer`: the last stage in both delivery modes, on fakes (no broker)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from consumer.pipeline.commit import Committer
from consumer.records import OutRecord
from consumer.settings import KafkaSettings


class FakeTarget:
    """The group consumer's commit: records every commit; `refuse` makes the next ones return False."""

    left = False

    def __init__(self) -> None:
        self.commits: list[dict[Any, int]] = []
        self.refuse = False

    async def commit(self, offsets: dict[Any, int], attempts: int) -> bool:
        if self.refuse:
            return False
        self.commits.append(dict(offsets))
        return True


class FakeTransactions:
    def __init__(self, tp: Any) -> None:
        self.tp = tp
        self.events: list[str] = []
        self.published: list[tuple[int, int]] = []

    async def start(self) -> None:
        self.events.append("start")

    async def stop(self) -> None:
        self.events.append("stop")

    async def publish(self, records: Sequence[OutRecord], next_offset: int) -> None:
        self.published.append((len(records), next_offset))


async def test_at_least_once_commits_only_the_finished_watermark_of_owned_partitions() -> None:
    target = FakeTarget()
    committer = Committer(KafkaSettings(), target)
    await committer.open("p0")
    committer.track("p0", 0, 3)
    committer.track("p0", 3, 5)
    committer.track("p1", 0, 2)  # tracked but not owned: never committed
    committer.done("p0", 3)  # the later span first: the watermark waits for the oldest
    await committer.commit()
    assert target.commits == [{"p0": 0}]
    committer.done("p0", 0)
    committer.done("p1", 0)
    await committer.commit()
    assert target.commits == [{"p0": 0}, {"p0": 5}]
    await committer.commit()
    assert target.commits == [{"p0": 0}, {"p0": 5}], "nothing new: no commit"


async def test_a_refused_commit_is_tried_again_later() -> None:
    target = FakeTarget()
    committer = Committer(KafkaSettings(), target)
    await committer.open("p0")
    committer.track("p0", 0, 1)
    committer.done("p0", 0)
    target.refuse = True  # e.g. the group is rebalancing
    await committer.commit()
    target.refuse = False
    await committer.commit()
    assert target.commits == [{"p0": 1}]
    assert committer.tracker.committed() == {"p0": 1}


async def test_flush_soon_commits_before_the_interval() -> None:
    target = FakeTarget()
    committer = Committer(KafkaSettings(commit_interval_ms=60_000), target)
    await committer.open("p0")
    loop = asyncio.create_task(committer.run())
    try:
        committer.track("p0", 0, 2)
        committer.done("p0", 0)
        committer.flush_soon()
        for _ in range(50):
            if target.commits:
                break
            await asyncio.sleep(0.01)
        assert target.commits == [{"p0": 2}]
    finally:
        loop.cancel()


async def test_revoke_commits_last_and_forgets_the_partition() -> None:
    target = FakeTarget()
    committer = Committer(KafkaSettings(), target)
    await committer.open("p0")
    committer.track("p0", 0, 2)
    committer.track("p0", 2, 4)
    committer.done("p0", 0)
    abandoned = await committer.revoke(["p0"])
    assert target.commits == [{"p0": 2}]
    assert abandoned == 1  # the span [2, 4) is processed again by the next owner
    assert committer.pending(["p0"]) == 0


async def test_exactly_once_owns_each_partitions_producer_from_assignment_to_revocation() -> None:
    target = FakeTarget()
    made: dict[Any, FakeTransactions] = {}

    def factory(settings: KafkaSettings, tp: Any) -> FakeTransactions:
        made[tp] = FakeTransactions(tp)
        return made[tp]

    committer = Committer(KafkaSettings(exactly_once=True), target, transactions=factory)
    await committer.open("p0")
    assert made["p0"].events == ["start"]
    committer.track("p0", 0, 3)
    await committer.transact("p0", [OutRecord("out", None, b"v", ())], 3)
    assert made["p0"].published == [(1, 3)]
    assert committer.tracker.committed() == {"p0": 3}
    await committer.commit()
    assert target.commits == [], "exactly-once: offsets go in the transactions only"
    await committer.revoke(["p0"])
    assert made["p0"].events == ["start", "stop"]
    await committer.stop()
    assert made["p0"].events == ["start", "stop"], "a revoked partition's producer is not stopped twice"
