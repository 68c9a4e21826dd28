"""The urgent lane's place on the device: a high-priority CUDA stream of the engine's own.

An urgent batch (an HTTP request, a priority topic's event) is staged and run while a bulk batch's layers
are already queued on the device. On the bulk batch's stream its copies and kernels would wait for those
layers; on a stream of higher priority they do not: the GPU's scheduler hands freed SMs to the lane's
kernels first (already running work is not preempted). The lane's tensors are allocated, written and read
on the lane's stream only, and its result is copied back with a sync of that stream alone, so the bulk
batch's work goes on meanwhile. Answers must not change: the same kernels on another stream compute the
same bits, which tests/gpu/test_engine_gpu.py checks (an urgent batch inside a bulk one, both bit-equal to
their runs alone). Opt-in (`EngineConfig.lane_stream`) until that test and the service bench have run on
the GPU.

Bulk batches may be launched ahead (`engine.launch`): one may still be queued on the bulk stream when an
urgent batch runs. A CUDA graph's buffers are shared by every batch of its bucket, so the lane's stream first
waits for the bulk work launched so far (`follow_bulk`, with the end `mark_bulk` recorded): the lane then
skips the bulk batches not yet launched, not those already queued.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager

import torch

PRIORITY = -1
"""The lane stream's priority (lower is higher; CUDA clamps to its range): above the default streams' 0."""


class Lane:
    """The lane of one engine: `enter()` makes the lane's stream current on the calling thread for the
    duration (each thread has its own current stream), or does nothing without a stream (CPU, or the
    lane switched off). Build it once per engine, on the thread that builds the engine."""

    def __init__(self, device: torch.device, enabled: bool) -> None:
        use = enabled and device.type == "cuda" and torch.cuda.is_available()
        self.stream: torch.cuda.Stream | None = None
        if use:
            self.stream = torch.cuda.Stream(device, priority=PRIORITY)  # type: ignore[no-untyped-call]
        self._bulk: torch.cuda.Event | None = None  # the end of the bulk work launched last (GPU thread)

    def enter(self) -> AbstractContextManager[None]:
        """A context that runs the work launched inside it on the lane's stream (a no-op without one)."""
        return contextlib.nullcontext() if self.stream is None else _on(self.stream)

    def mark_bulk(self, end: torch.cuda.Event | None) -> None:
        """Outside the lane: the bulk work launched so far ends with `end` (recorded on the bulk stream). A
        no-op inside the lane, without a stream, or for None."""
        if end is not None and self.stream is not None and not self._inside():
            self._bulk = end

    def follow_bulk(self) -> None:
        """Inside the lane: make the lane's stream wait for the bulk work marked last (nothing is waited
        for on the host). A no-op outside the lane or without a stream."""
        if self._bulk is not None and self.stream is not None and self._inside():
            self.stream.wait_event(self._bulk)

    def _inside(self) -> bool:
        assert self.stream is not None
        return bool(torch.cuda.current_stream(self.stream.device) == self.stream)


@contextlib.contextmanager
def _on(stream: torch.cuda.Stream) -> Iterator[None]:
    with torch.cuda.stream(stream):
        yield
