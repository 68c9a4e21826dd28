"""`bench.release_writer`: a release in the published layout that the product loader reads strictly.

Written here with a shrunken thinker (the full size is 63 GB; `bench.startup write` makes it on the H200).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from engine.model.release import load_release_model
from tests.support.small_release import write_small_release


def test_written_release_is_per_expert_sharded_and_loads(tmp_path: Path) -> None:
    written = write_small_release(tmp_path / "r")
    weight_map: dict[str, str] = json.loads((written.path / "model.safetensors.index.json").read_text())[
        "weight_map"
    ]
    assert written.shards == len(set(weight_map.values())) > 3
    assert not any(k.endswith(("experts.gate_up_proj", "experts.down_proj")) for k in weight_map)
    assert any(k.startswith("talker.") for k in weight_map)
    assert any(k.startswith("code2wav.") for k in weight_map)
    shards_per_layer: dict[str, set[str]] = {}
    for key, shard in weight_map.items():
        m = re.match(r"thinker\.model\.layers\.(\d+)\.mlp\.experts\.\d+\.", key)
        if m:
            shards_per_layer.setdefault(m.group(1), set()).add(shard)
    assert len(shards_per_layer) == 3
    assert any(len(s) > 1 for s in shards_per_layer.values())  # a layer's experts straddle shards
    loaded = load_release_model(written.path, device="cpu", dtype=torch.bfloat16, load_processor=False)
    assert loaded.read is not None
    assert loaded.read.bytes == written.thinker_bytes
    experts = loaded.model.text_model.layers[2].mlp.experts
    assert tuple(experts.gate_up_proj.shape) == (8, 64, 64)
    assert float(experts.gate_up_proj.float().std()) > 0.01  # random values landed, not zeros
