"""engine.model.media's helpers that need no model."""

from __future__ import annotations

import torch

from engine.model.media import _flat


def test_features_as_one_tensor_or_per_item() -> None:
    a, b = torch.ones(2, 3), torch.zeros(1, 3)
    assert torch.equal(_flat((a, b)), torch.cat([a, b]))
    assert _flat(a) is a
