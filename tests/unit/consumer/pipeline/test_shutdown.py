"""The shutdown sequence on a `Stages` value of fakes: its order, its bounds, and that it never raises."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import cast

from structlog.testing import capture_logs

from consumer.batching.batcher import Batcher
from consumer.kafka.producer import Producer
from consumer.kafka.source import Source
from consumer.metrics import Metrics
from consumer.pipeline.commit import Committer
from consumer.pipeline.emitter import Emitter
from consumer.pipeline.shutdown import Stages, shutdown
from consumer.records import PartitionState
from devtools.stub import StubPrepared
from schemas.response import SystemOneResponse

_StubBatcher = Batcher[StubPrepared, Sequence[StubPrepared], list[SystemOneResponse]]
_StubStages = Stages[StubPrepared, Sequence[StubPrepared], list[SystemOneResponse]]


class _Stage:
    """Every fake stage writes what is called on it, in order, to one shared list."""

    def __init__(self, name: str, calls: list[str]) -> None:
        self.name = name
        self.calls = calls

    def note(self, what: str) -> None:
        self.calls.append(f"{self.name}.{what}")


class _Source(_Stage):
    def __init__(self, calls: list[str], *, left: bool = False, hang_leaving: bool = False) -> None:
        super().__init__("source", calls)
        self.left = left
        self.hang_leaving = hang_leaving

    def stop_fetching(self) -> None:
        self.note("stop_fetching")

    async def leave_group(self) -> None:
        self.note("leave_group")
        if self.hang_leaving:
            await asyncio.Event().wait()  # a rebalance that never ends

    async def stop(self) -> None:
        self.note("stop")


class _Batcher(_Stage):
    async def close(self, timeout_s: float) -> None:
        self.note("close")


class _Emitter(_Stage):
    in_flight = 3

    def close(self, state: str) -> None:
        self.note(f"close({state})")

    async def wait_closed(self, timeout_s: float) -> None:
        self.note("wait_closed")


class _Committer(_Stage):
    def __init__(self, calls: list[str], *, fail: bool = False) -> None:
        super().__init__("committer", calls)
        self.fail = fail

    async def commit(self) -> None:
        self.note("commit")
        if self.fail:
            raise ConnectionError("broker gone")

    async def stop(self) -> None:
        self.note("stop")


class _Producer(_Stage):
    async def stop(self) -> None:
        self.note("stop")


def _stages(calls: list[str], source: _Source, committer: _Committer, timeout_s: float = 25.0) -> _StubStages:
    metrics = Metrics()
    metrics.model_loaded.set(1)
    return Stages(
        source=cast(Source, source),
        batcher=cast("_StubBatcher", _Batcher("batcher", calls)),
        emitter=cast(Emitter, _Emitter("emitter", calls)),
        committer=cast(Committer, committer),
        producer=cast(Producer, _Producer("producer", calls)),
        metrics=metrics,
        shutdown_timeout_s=timeout_s,
        close_reserve_s=8.0,
    )


async def _run(stages: _StubStages, calls: list[str], drained: bool = True) -> asyncio.Task[None]:
    async def drain(timeout_s: float) -> bool:
        calls.append(f"drain({timeout_s:g})")
        return drained

    def open_partitions() -> list[PartitionState]:
        calls.append("open_partitions")
        return cast(list[PartitionState], ["p0", "p1"])

    commits = asyncio.create_task(asyncio.sleep(3600))
    await shutdown(stages, commits, drain, open_partitions)
    return commits


async def test_stages_close_front_to_back_after_the_drain_and_the_final_commit() -> None:
    calls: list[str] = []
    stages = _stages(calls, _Source(calls), _Committer(calls))
    with capture_logs() as logs:
        commits = await _run(stages, calls)
    assert calls == [
        "source.stop_fetching",
        "drain(17)",  # shutdown_timeout_s 25 - close_reserve_s 8
        "open_partitions",
        "emitter.close(p0)",
        "emitter.close(p1)",
        "committer.commit",
        "batcher.close",
        "emitter.wait_closed",
        "committer.stop",
        "source.leave_group",
        "source.stop",
        "producer.stop",
    ]
    await asyncio.sleep(0)
    assert commits.cancelled()
    assert stages.metrics.model_loaded._value.get() == 0
    stopped = [e for e in logs if e["event"] == "pipeline_stopped"]
    assert len(stopped) == 1
    assert stopped[0]["drained"] is True
    assert stopped[0]["abandoned"] == 3
    assert stopped[0]["left_group"] is True


async def test_a_member_that_left_does_not_commit_and_a_failed_commit_does_not_stop_the_sequence() -> None:
    calls: list[str] = []
    await _run(_stages(calls, _Source(calls, left=True), _Committer(calls)), calls)
    assert "committer.commit" not in calls
    assert calls[-1] == "producer.stop"

    calls = []
    with capture_logs() as logs:
        await _run(_stages(calls, _Source(calls), _Committer(calls, fail=True)), calls, drained=False)
    assert calls.index("committer.commit") < calls.index("batcher.close")
    assert calls[-1] == "producer.stop"
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["final_commit_failed"]
    assert [e["drained"] for e in logs if e["event"] == "pipeline_stopped"] == [False]


async def test_a_step_that_hangs_is_cut_at_its_bound_and_the_sequence_returns_in_time() -> None:
    calls: list[str] = []
    stages = _stages(calls, _Source(calls, hang_leaving=True), _Committer(calls), timeout_s=1.6)
    began = time.monotonic()
    with capture_logs() as logs:
        await asyncio.wait_for(_run(stages, calls), 5.0)
    assert time.monotonic() - began < 1.6 - 0.5  # the deadline keeps EXIT_MARGIN_S (1 s) for the exit
    assert "source.stop" not in calls  # cancelled inside leave_group
    assert calls[-1] == "producer.stop"
    assert [e["left_group"] for e in logs if e["event"] == "pipeline_stopped"] == [False]
