"""Programmatic dependent launch (PDL) of the engine's Triton kernels on Hopper.

Back-to-back kernels in a stream (and in a CUDA graph captured from it) normally run strictly one after the
other: the next grid is launched only once the previous one has finished, so every kernel boundary costs the
launch and the ramp-up of the next grid on an otherwise idle GPU. With PDL the next grid may be scheduled
while the previous one drains its last wave; its programs then wait for it at their first instruction.

Contract, for every kernel launched with `options(...)`:

- the kernel takes a `pdl` constexpr and calls `engine.kernels.pdl_triton.after_previous(pdl)` before it
  reads or writes any global memory. That waits until the previous grid has completed and its writes are
  visible (`griddepcontrol.wait`), then lets the next one be scheduled (`griddepcontrol.launch_dependents`).
  Every access therefore happens after the previous kernel's, as without PDL: results are bit-equal.
- `options` turns PDL on only for CUDA tensors on compute capability 9.0 or later, outside Triton's
  interpreter, and while `use(True)` is in force (the default). A kernel launched without it (or before a
  kernel that is not a PDL launch, such as a cuBLAS GEMM) waits as usual; its wait instruction is a no-op.
- CUDA graphs captured while PDL is on keep the programmatic edges; capture again after `use(...)`.

The state (`use`) is this module's alone; benches and tests flip it to compare, the engine leaves it on.
"""

from __future__ import annotations

import functools
import os

import torch

_state = {"on": True}


def use(on: bool) -> None:
    """Launch the Triton kernels with PDL from now on (`on`, the default) or without (baselines, tests).
    Graphs captured before keep the mode they were captured in."""
    _state["on"] = on


def enabled() -> bool:
    """Whether PDL is asked for (`use`); `options` still checks the device."""
    return _state["on"]


@functools.cache
def _capable(index: int) -> bool:
    # compute capability 9.0 or later (Hopper): griddepcontrol and the launch attribute exist there
    return torch.cuda.get_device_capability(index) >= (9, 0)


def options(t: torch.Tensor) -> dict[str, bool]:
    """Keyword arguments for a Triton launch whose tensors live where `t` does: `pdl` for the kernel's
    constexpr, and Triton's `launch_pdl` when PDL applies."""
    on = (
        _state["on"]
        and t.is_cuda
        and os.environ.get("TRITON_INTERPRET") != "1"
        and _capable(t.device.index if t.device.index is not None else torch.cuda.current_device())
    )
    return {"pdl": True, "launch_pdl": True} if on else {"pdl": False}
