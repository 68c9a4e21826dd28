"""Where a batch's time went on its way through `consumer.batching.gpu.GpuRunner` (typed records the
batcher logs and meters), and one normal batch's run as the GPU side hands it back."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Generic, TypeVar

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class BatchRun(Generic[R]):
    """One normal batch's run: its result, its GPU seconds (lane time taken out: the cost model's and the
    busy metric's), whether no lane work ran inside it, when the GPU thread began it and when its end was
    known (`perf_counter`), and its own run time (`BatchTimes.run`)."""

    raw: R
    seconds: float
    clean: bool
    began: float
    ended: float
    run_s: float


@dataclass(frozen=True, slots=True)
class LaneTimes:
    """Where one urgent batch's time went, in ms: staging on the urgent thread, waiting in the lane, its run
    on the GPU thread, from the run's end until the loop took the result (settle), answering; and whether it
    ran inside a running batch. The batcher logs them with the batch."""

    stage_ms: float
    lane_wait_ms: float
    run_ms: float
    settle_ms: float
    respond_ms: float
    inside: bool


@dataclass(frozen=True, slots=True)
class BatchTimes:
    """Where one normal batch's time went after its cut, in ms: waiting for the prepare thread (from the
    cut until staging began there: the tasks queued or running on it, or the GIL), staging (until its run
    was queued on the GPU thread), waiting there for the batch before it (and, launched ahead, on the device),
    its run (wall time on the GPU thread, or launched ahead the engine's device seconds; lane batches run
    inside it included), from the run's end until the loop took the result, waiting
    for the prepare thread again, answering (`respond` there, back on the loop). The batcher logs them with
    the batch and records them per record (`Metrics.batch_path`)."""

    stage_wait_ms: float
    stage_ms: float
    gpu_wait_ms: float
    run_ms: float
    back_ms: float
    respond_wait_ms: float
    respond_ms: float

    def steps(self) -> tuple[tuple[str, float], ...]:
        """(step, ms) in the batch's order; the steps are `BATCH_STEPS`."""
        return tuple((step, getattr(self, f"{step}_ms")) for step in BATCH_STEPS)


BATCH_STEPS = tuple(f.name.removesuffix("_ms") for f in fields(BatchTimes))
"""The steps of `BatchTimes` (its fields in order, without `_ms`), the `step` labels of
`consumer.metrics.Metrics.batch_path`."""
