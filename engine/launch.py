"""A batch's run with its device work queued: `LaunchedRun` (`engine.runner.Engine.launch`) and the device
time it took (`DeviceSpan`).

`Engine.launch` queues every part's forward pass and its one device-to-host copy, then returns; the GPU
thread may launch the next batch at once, so the device goes from one batch to the next without waiting
for the host (the sync, the hand-back, the next batch's first launches). `LaunchedRun.wait()`, on any
thread, waits for the copies (the GIL released) and gives the run's `RunResult` and its device seconds:
CUDA events recorded on the launching stream before the first and after the last of its operations, so a
run queued behind another counts from when the device started it, not from its launch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

from engine.handoff import Prepared, RunResult
from engine.types import Launched

Part = tuple[tuple[int, ...], Launched[list[dict[str, npt.NDArray[np.float32]]]]]
"""One forward pass of a launched batch: its records' indexes in the batch, and their launched results."""


class DeviceSpan:
    """Device time between `DeviceSpan(device)` and `close()` on the current stream (CUDA events); no timing
    off CUDA or without a CUDA runtime (`seconds()` is then None)."""

    def __init__(self, device: torch.device) -> None:
        self._start: torch.cuda.Event | None = None
        self._end: torch.cuda.Event | None = None
        if device.type == "cuda" and torch.cuda.is_available():
            self._start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self._start.record()

    def close(self) -> torch.cuda.Event | None:
        """Record the span's end on the current stream; returns that event (None off CUDA)."""
        if self._start is None:
            return None
        self._end = torch.cuda.Event(enable_timing=True, blocking=True)  # type: ignore[no-untyped-call]
        self._end.record()
        return self._end

    def seconds(self) -> float | None:
        """The span's device seconds, once its end ran (waits for it, the GIL released); None off CUDA."""
        if self._start is None or self._end is None:
            return None
        self._end.synchronize()
        return float(self._start.elapsed_time(self._end)) / 1000.0


class LaunchedRun:
    """A launched batch (`engine.types.Launched[RunResult]`): `wait()` once, on any thread."""

    def __init__(self, prepared: tuple[Prepared, ...], parts: Sequence[Part], span: DeviceSpan) -> None:
        self._prepared = prepared
        self._parts = parts
        self._span = span

    def wait(self) -> tuple[RunResult, float | None]:
        out: list[dict[str, npt.NDArray[np.float32]]] = [{} for _ in self._prepared]
        for group, launched in self._parts:
            for i, probs in zip(group, launched.wait()[0], strict=True):
                out[i] = probs
        return RunResult(self._prepared, tuple(out)), self._span.seconds()
