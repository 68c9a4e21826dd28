"""Build the Qwen3-Omni thinker (transformers' class) with uninitialised weights, ready to be filled.

The thinker is constructed directly on the target device and dtype with weight initialisation switched off:
parameters are allocated but not written (no random init of 30B weights), while the non-persistent buffers
that the modules compute in `__init__` (rotary `inv_freq`, the audio tower's sinusoid table) are correct. A
meta-device build followed by `to_empty` would leave those buffers as garbage; they are not in the release.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


@contextlib.contextmanager
def _no_init() -> Iterator[None]:
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older 5.x layouts: fall back to paying for the random init
        yield
        return
    with no_init_weights():
        yield


def build_thinker(
    thinker_config: Any,
    device: torch.device | str,
    dtype: torch.dtype,
    attn_implementation: str = "sdpa",
) -> nn.Module:
    """A `Qwen3OmniMoeThinkerForConditionalGeneration` on `device`/`dtype`, parameters NOT initialised.

    Every parameter must be overwritten by the caller (the release loader checks that all are). Eval mode.
    """
    from transformers import Qwen3OmniMoeThinkerForConditionalGeneration

    with torch.device(device), _no_init():
        factory: Any = Qwen3OmniMoeThinkerForConditionalGeneration._from_config
        model = factory(thinker_config, dtype=dtype, attn_implementation=attn_implementation)
    assert isinstance(model, nn.Module)
    return model.eval()


def expected_tensors(thinker: nn.Module, prefix: str = "thinker.") -> dict[str, tuple[int, ...]]:
    """Release key -> shape for every tensor the thinker needs (parameters and persistent buffers)."""
    return {prefix + name: tuple(t.shape) for name, t in thinker.state_dict(keep_vars=True).items()}
