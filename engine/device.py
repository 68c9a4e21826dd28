"""Which device the engine can run on: the one place a server asks torch about CUDA (imports torch only)."""

from __future__ import annotations

import torch


def cuda_available() -> bool:
    """True when torch sees a usable CUDA device."""
    return torch.cuda.is_available()


def use_device(device: str) -> None:
    """Make `device` (e.g. `cuda:1`) the process's current CUDA device, so kernels and CUDA graphs that
    name no device use it. No-op for a CPU device or a CUDA device without an index."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is not None:
        torch.cuda.set_device(dev)
