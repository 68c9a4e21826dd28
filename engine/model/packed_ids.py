"""A packed text batch by token ids, before its embeddings (`PackedIds`), and its record offsets built on
the host (`host_offsets`): what `engine.model.graphs.GraphedDecoder.run` takes, and what `packed_inputs`
turns into the eager decoder's `engine.model.decoder.PackedInputs`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from engine.model.decoder import PackedInputs


@dataclass(frozen=True, slots=True)
class PackedIds:
    """One packed text batch by token ids, before its embeddings: `input_ids` (T,) int64 and `position_ids`
    (3, T) on the device, `lengths` the records' token counts on the host (their sum is T). What
    `engine.model.graphs.GraphedDecoder.run` takes (its graphs embed the ids themselves) and what
    `packed_inputs` turns into a `PackedInputs`."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    lengths: tuple[int, ...]


def host_offsets(lengths: Sequence[int], tail: Sequence[int] = (), *, pinned: bool = False) -> torch.Tensor:
    """(N + 1 + len(tail),) int32 CPU tensor: 0, the running sums of `lengths`, then `tail` as given. In
    pinned memory when `pinned` (a CUDA device copy of it is then asynchronous and never waits for the
    stream: a copy from pageable memory may)."""
    out = torch.empty(len(lengths) + 1 + len(tail), dtype=torch.int32, pin_memory=pinned)
    view = out.numpy()
    view[0] = 0
    np.cumsum(lengths, out=view[1 : len(lengths) + 1])
    view[len(lengths) + 1 :] = tail
    return out


def packed_inputs(embed: Callable[[torch.Tensor], torch.Tensor], batch: PackedIds) -> PackedInputs:
    """The eager decoder's `PackedInputs` of `batch`: its embeddings (`embed` of the ids) and its record
    offsets, built on the host and copied once."""
    dev = batch.input_ids.device
    cu = host_offsets(batch.lengths, pinned=dev.type == "cuda").to(dev, non_blocking=True)  # (N+1,)
    return PackedInputs(embed(batch.input_ids), batch.position_ids, cu, max(batch.lengths))
