"""Pacing of eager launches: the decoder's layer loop keeps the GPU's queue a few layers deep, no deeper."""

from __future__ import annotations

import torch


class LaunchPacer:
    """Keeps eager launches at most `ahead` layers in front of the GPU, waiting without the GIL.

    An eager forward launches ~40 kernels per layer, far faster than the GPU runs them; once the driver's
    launch queue is full, each launch blocks inside a torch op, holding the GIL, for most of the batch.
    That starves the threads tokenizing the next batch. Waiting on an event of an earlier layer instead
    releases the GIL (`Event.synchronize`) while the queue still holds `ahead` layers of work. Off (0)
    on CPU and while a CUDA graph is being captured.
    """

    def __init__(self, ahead: int) -> None:
        self.ahead = ahead if ahead > 0 and not torch.cuda.is_current_stream_capturing() else 0
        self._events: list[torch.cuda.Event] = []

    def step(self) -> None:
        if not self.ahead:
            return
        event = torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]
        event.record()
        self._events.append(event)
        if len(self._events) > self.ahead:
            self._events.pop(0).synchronize()
