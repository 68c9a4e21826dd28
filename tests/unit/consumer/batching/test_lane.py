"""The urgent lane's bound inside a running batch (`consumer.batching.gpu.GpuRunner`): lane batches go in
at step boundaries while the lane's time inside the batch is at most `URGENT_SHARE` of the batch's wall
time so far, on a scripted clock: deterministic, whatever the machine's speed."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from consumer.batching.gpu import URGENT_SHARE, GpuRunner
from engine.types import Between
from schemas.response import SystemOneResponse
from tests.unit.consumer.batching.fakes import FakeEngine, Item, said

LAYERS = 10
LAYER_S = 1.0  # scripted seconds one bulk layer takes
LANE_S = 3.0  # scripted seconds one lane batch takes


class LayeredEngine(FakeEngine):
    """A bulk run (records named `bulk*`) sets `running`, waits for `go`, then takes `LAYERS` layers of
    `LAYER_S` on the scripted clock, calling `between` after each; any other run takes `LANE_S` and notes
    the layer the bulk run was at (`lane_at`)."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = 0.0  # written by the GPU thread only
        self.layer = 0
        self.go = threading.Event()
        self.running = threading.Event()
        self.lane_at: list[int] = []

    def now(self) -> float:
        return self.clock

    def run(self, staged: list[Item], between: Between | None = None) -> list[SystemOneResponse]:
        if any(i.name.startswith("bulk") for i in staged):
            self.running.set()
            assert self.go.wait(5)
            for layer in range(1, LAYERS + 1):
                self.clock += LAYER_S
                self.layer = layer
                if between is not None:
                    between()
        else:
            self.clock += LANE_S
            self.lane_at.append(self.layer)
        return super().run(staged, between)


async def until_lane(runner: GpuRunner[Item, list[Item], list[SystemOneResponse]], n: int) -> None:
    for _ in range(500):  # bounded: 2.5 s
        if runner.lane_waiting == n:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{runner.lane_waiting} lane batches waiting, wanted {n}")


async def test_lane_batches_go_in_while_the_lane_keeps_within_its_share() -> None:
    """Three lane batches of 3 s wait when a bulk batch of ten 1 s layers starts: the first goes in at
    the first boundary, the next ones only once the lane's time is back within half the elapsed time
    (after layers 3 and 6: 3 <= 0.5 x 6, 6 <= 0.5 x 12), not all at once, not after the batch."""
    assert URGENT_SHARE == 0.5  # the layers below are worked out for this share
    engine = LayeredEngine()
    cpu = ThreadPoolExecutor(1)
    runner: GpuRunner[Item, list[Item], list[SystemOneResponse]] = GpuRunner(engine, cpu, now=engine.now)
    done: list[tuple[float, bool]] = []
    ago: list[float] = []

    def on_done(seconds: float, learn: bool, since: float) -> None:
        done.append((seconds, learn))
        ago.append(since)

    bulk = asyncio.ensure_future(runner.run([Item("bulk")], on_done))
    for _ in range(500):  # the bulk run holds the GPU thread before any lane batch is queued
        if engine.running.is_set():
            break
        await asyncio.sleep(0.005)
    urgent = []
    for name in ("a", "b", "c"):
        urgent.append(asyncio.ensure_future(runner.run_urgent([Item(name)])))
        await until_lane(runner, len(urgent))  # queued in this order
    engine.go.set()
    answers = await asyncio.wait_for(asyncio.gather(*urgent), 5)
    result, bulk_s, bulk_times = await asyncio.wait_for(bulk, 5)
    runner.shutdown()
    cpu.shutdown()
    assert engine.lane_at == [1, 3, 6]
    assert [said(r.outcomes) for r, _, _ in answers] == [["answer:a"], ["answer:b"], ["answer:c"]]
    assert [s for _, s, _ in answers] == [LANE_S] * 3
    times = [t for _, _, t in answers]
    assert all(t is not None and t.inside and t.run_ms == LANE_S * 1000 for t in times)  # logged per batch
    assert said(result.outcomes) == ["answer:bulk"]
    assert bulk_times is not None
    assert all(ms >= 0.0 for _, ms in bulk_times.steps())
    assert bulk_s == LAYERS * LAYER_S  # the lane's time is taken out of the bulk batch's
    assert done == [(LAYERS * LAYER_S, False)]  # a batch the lane ran inside is not learnt from
    assert len(ago) == 1
    assert 0.0 <= ago[0] < 5.0  # real seconds from the GPU thread's end to the loop's hearing of it
