"""`bench.level_release`: a small random release's routers levelled and rewritten in place, nothing else.

The release is `bench.release_writer`'s with a shrunken thinker (3 MoE layers of 8 experts, top 2), on the
CPU in float32. Its random routers are mildly skewed (the busiest expert gets about 1.8x the mean load);
levelling equalises each expert's mean logit, which lowers that.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load as load_safetensors

from bench.level_release import level_release, load_engine, probe, probe_records
from tests.support.small_release import write_small_release

ROUTER = ".mlp.gate.weight"


def byte_ranges(data: bytes) -> dict[str, tuple[int, int]]:
    """Absolute [begin, end) of every tensor of a safetensors file's bytes, parsed here from the header."""
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    start = 8 + length
    return {
        name: (start + entry["data_offsets"][0], start + entry["data_offsets"][1])
        for name, entry in header.items()
        if name != "__metadata__"
    }


def masked(data: bytes, ranges: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for begin, end in ranges:
        out[begin:end] = bytes(end - begin)
    return bytes(out)


@pytest.mark.slow
def test_levelling_rewrites_only_the_routers_and_spreads_the_load(tmp_path: Path) -> None:
    root = write_small_release(tmp_path / "r").path
    original = {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}

    done = level_release(root, "cpu", passes=4, tokens=512, records=4)

    routers = {
        name: shard
        for name, shard in json.loads(original["model.safetensors.index.json"])["weight_map"].items()
        if name.startswith("thinker.") and name.endswith(ROUTER)  # the talker has routers too
    }
    assert done.tensors == len(routers) == 3
    assert done.bytes == 3 * 8 * 64 * 2  # bf16 (E, hidden) per layer
    now = {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}
    assert sorted(now) == sorted(original)
    for file, data in original.items():
        if file not in set(routers.values()):
            assert now[file] == data, f"{file} changed"
            continue
        ranges = byte_ranges(data)
        touched = [ranges[name] for name, shard in routers.items() if shard == file]
        assert len(now[file]) == len(data)
        # (1) every byte outside the routers' ranges (header, other tensors) is as it was
        assert masked(now[file], touched) == masked(data, touched), f"{file}: other bytes changed"
    # (2) the routers changed, same dtype and shape (read back through the safetensors package)
    for name, shard in routers.items():
        old = load_safetensors(original[shard])[name]
        with safe_open(str(root / shard), framework="pt") as f:
            new = f.get_tensor(name)
        assert (new.dtype, new.shape) == (old.dtype, old.shape) == (torch.bfloat16, torch.Size([8, 64]))
        assert not torch.equal(new, old), f"{name} unchanged"

    # (3) the product loader reads the rewritten release strictly, new routers included
    engine = load_engine(root, "cpu")  # `load_release_model` into an Engine
    layer0 = engine.model.text_model.layers[0].mlp.gate.weight
    with safe_open(str(root / routers[f"thinker.model.layers.0{ROUTER}"]), framework="pt") as f:
        assert torch.equal(layer0, f.get_tensor(f"thinker.model.layers.0{ROUTER}").float())

    # (4) the rewritten release spreads the probe's tokens more evenly than the random one did
    stats = probe(engine, probe_records(engine, 4, 512))
    after = {i: s.hot_over_mean for i, s in stats.items()}
    before_max, after_max = max(done.before.values()), max(after.values())
    print(f"hot/mean load, max over layers: before {before_max:.3f}, after {after_max:.3f}")
    assert after == pytest.approx(done.after)  # the bytes on disk are what the levelling ran
    assert after_max < before_max
    spread = max(float(s.mean_logit.max() - s.mean_logit.min()) for s in stats.values())
    assert spread < 0.01  # every expert's mean logit equal (before: about 0.4)
