"""Which device the engine can run on, and how its GPU libraries are set up: the one place a server asks torch
about CUDA (imports torch only)."""

from __future__ import annotations

import os

import torch

CUBLASLT_WORKSPACE_ENV = "CUBLASLT_WORKSPACE_SIZE"
"""The environment variable torch reads (KiB, once, at the process's first cuBLASLt GEMM) for the size of
cuBLASLt's workspace."""
CUBLASLT_WORKSPACE_KIB = "0"
"""The engine's choice: no workspace. cuBLASLt then takes no split-K kernel that needs a zeroed workspace: the
FP8 QKV projection of a lone request lost a memset and about 5 us of idle GPU a layer (one 800-token
request: 841 kernels and copies instead of 896, `run` 16.21 against 16.66 ms), and at 65,536 tokens the FP8
projections took 74.1 against 79.4 ms a batch; bf16 throughput did not move (one H100, same call;
BENCHMARKS.md, "Engine, round ten", which also has an H200's figures)."""


def configure_cublaslt() -> str:
    """Give cuBLASLt no workspace (`CUBLASLT_WORKSPACE_KIB`) unless the environment already names a size;
    returns the value in effect. Torch reads it at the process's first cuBLASLt GEMM, so this runs before
    any (`ClefOmniModel` calls it when it is built); later calls change nothing torch has read."""
    return os.environ.setdefault(CUBLASLT_WORKSPACE_ENV, CUBLASLT_WORKSPACE_KIB)


def cuda_available() -> bool:
    """True when torch sees a usable CUDA device."""
    return torch.cuda.is_available()


def use_device(device: str) -> None:
    """Make `device` (e.g. `cuda:1`) the process's current CUDA device, so kernels and CUDA graphs that
    name no device use it. No-op for a CPU device or a CUDA device without an index."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is not None:
        torch.cuda.set_device(dev)
