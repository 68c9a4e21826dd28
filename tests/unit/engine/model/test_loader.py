"""The loader reads only thinker tensors, checks every key and shape, and names the culprit."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import engine.model.release_read as release_read
from devtools.tiny_release import write_tiny_release
from engine.model.release import LoadedModel, ReleaseError, load_release_model
from engine.model.release_read import ReadOptions

INDEX = "model.safetensors.index.json"


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _load(path: Path) -> LoadedModel:
    return load_release_model(path, device="cpu", dtype=torch.float32, load_processor=False)


def _edit_index(root: Path, edit: Any) -> None:
    data = json.loads((root / INDEX).read_text())
    edit(data["weight_map"])
    (root / INDEX).write_text(json.dumps(data))


def test_loads_eval_float32(loaded: LoadedModel, tiny_release: Path) -> None:
    model = loaded.model
    assert not model.training
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in model.parameters())
    assert loaded.config.enable_audio_output is False
    assert not hasattr(model.thinker, "talker")
    shard = json.loads((tiny_release / INDEX).read_text())["weight_map"]["thinker.lm_head.weight"]
    with safe_open(str(tiny_release / shard), framework="pt") as f:
        lm_head = f.get_tensor("thinker.lm_head.weight").float()
    assert torch.equal(model.lexical_table(), lm_head)
    assert torch.equal(
        model.head.prior_logit_scale,
        load_file(str(tiny_release / "joint_head.safetensors"))["prior_logit_scale"].float(),
    )


def test_refuses_missing_tensor(tiny_release: Path, tmp_path: Path) -> None:
    root = _copy(tiny_release, tmp_path / "r")
    _edit_index(root, lambda m: m.pop("thinker.model.layers.1.mlp.gate.weight"))
    with pytest.raises(
        ReleaseError, match=r"missing thinker tensors.*thinker\.model\.layers\.1\.mlp\.gate\.weight"
    ):
        _load(root)


@pytest.mark.parametrize("key", ["thinker.model.extra.weight", "vocoder.weight"])
def test_refuses_unexpected_tensor(tiny_release: Path, tmp_path: Path, key: str) -> None:
    root = _copy(tiny_release, tmp_path / "r")
    _edit_index(root, lambda m: m.__setitem__(key, "model-00001-of-00004.safetensors"))
    with pytest.raises(ReleaseError, match=f"unexpected tensors.*{key.replace('.', r'[.]')}"):
        _load(root)


def test_refuses_misshaped_tensor(tiny_release: Path, tmp_path: Path) -> None:
    root = _copy(tiny_release, tmp_path / "r")
    key = "thinker.model.layers.0.self_attn.q_proj.weight"
    shard = root / json.loads((root / INDEX).read_text())["weight_map"][key]
    tensors = load_file(str(shard))
    tensors[key] = tensors[key][:-1].contiguous()
    save_file(tensors, str(shard), metadata={"format": "pt"})
    with pytest.raises(ReleaseError, match=f"mis-shaped thinker tensors: {key.replace('.', '[.]')}"):
        _load(root)


def test_refuses_bad_head(tiny_release: Path, tmp_path: Path) -> None:
    root = _copy(tiny_release, tmp_path / "r")
    state = load_file(str(root / "joint_head.safetensors"))
    state.pop("residual_gate")
    save_file(state, str(root / "joint_head.safetensors"))
    with pytest.raises(ReleaseError, match="missing \\[residual_gate\\]"):
        _load(root)


def test_talker_and_code2wav_bytes_never_read(
    tiny_release: Path, tmp_path: Path, loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _copy(tiny_release, tmp_path / "r")
    # Shards holding only talker/code2wav tensors are deleted: they must never be opened.
    (root / "model-00003-of-00004.safetensors").unlink()
    (root / "model-00004-of-00004.safetensors").unlink()
    # In the mixed shard, the talker tensors' bytes are overwritten with garbage.
    mixed = root / "model-00002-of-00004.safetensors"
    raw = bytearray(mixed.read_bytes())
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + header_len])
    talker = [
        (8 + header_len + v["data_offsets"][0], 8 + header_len + v["data_offsets"][1])
        for k, v in header.items()
        if k.startswith("talker.")
    ]
    assert talker
    for begin, end in talker:
        raw[begin:end] = b"\xff" * (end - begin)
    mixed.write_bytes(bytes(raw))
    # Every data read goes through a recording wrapper of os.preadv.
    reads: list[tuple[int, int, int]] = []
    real_preadv = os.preadv

    def recording(fd: int, buffers: list[memoryview], offset: int) -> int:
        n = real_preadv(fd, buffers, offset)
        reads.append((os.fstat(fd).st_ino, offset, offset + n))
        return n

    monkeypatch.setattr(release_read.os, "preadv", recording)
    fresh = _load(root)
    assert reads
    mixed_inode = mixed.stat().st_ino
    for inode, begin, end in reads:
        if inode == mixed_inode:
            assert all(end <= t0 or begin >= t1 for t0, t1 in talker), (begin, end)
    _assert_same_thinker(fresh, loaded)


def _assert_same_thinker(a: LoadedModel, b: LoadedModel) -> None:
    theirs = b.model.thinker.state_dict()
    for name, value in a.model.thinker.state_dict().items():
        assert torch.equal(value, theirs[name]), name


def _shard_of(root: Path, key: str) -> Path:
    return root / json.loads((root / INDEX).read_text())["weight_map"][key]


def test_fused_and_per_expert_layouts_load_the_same(
    tiny_release: Path, tmp_path: Path, loaded: LoadedModel
) -> None:
    fused = write_tiny_release(tmp_path / "fused", seed=0, layout="fused")
    names = json.loads((fused / INDEX).read_text())["weight_map"]
    assert "thinker.model.layers.0.mlp.experts.gate_up_proj" in names
    assert "thinker.model.layers.0.mlp.experts.0.gate_proj.weight" not in names
    _assert_same_thinker(_load(fused), loaded)


def test_fused_experts_are_gate_then_up(loaded: LoadedModel, tiny_release: Path) -> None:
    """gate_up_proj[E] = cat(gate, up) on the output dim, down_proj[E] = down (SPEC section 3)."""
    prefix = "thinker.model.layers.1.mlp.experts"
    with safe_open(str(_shard_of(tiny_release, f"{prefix}.2.gate_proj.weight")), framework="pt") as f:
        gate, up, down = (
            f.get_tensor(f"{prefix}.2.{p}.weight").float() for p in ("gate_proj", "up_proj", "down_proj")
        )
    experts = loaded.model.text_model.layers[1].mlp.experts
    assert torch.equal(experts.gate_up_proj[2], torch.cat([gate, up]))
    assert torch.equal(experts.down_proj[2], down)


def test_experts_spread_over_shards_load(tiny_release: Path, tmp_path: Path, loaded: LoadedModel) -> None:
    """One layer's experts in three shards: expert 1 of layer 0 moved out of its shard into a new one."""
    root = _copy(tiny_release, tmp_path / "r")
    moved = [
        f"thinker.model.layers.0.mlp.experts.1.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")
    ]
    shard = _shard_of(root, moved[0])
    tensors = load_file(str(shard))
    save_file({k: tensors.pop(k) for k in moved}, str(root / "model-extra.safetensors"))
    save_file(tensors, str(shard), metadata={"format": "pt"})
    _edit_index(root, lambda m: m.update(dict.fromkeys(moved, "model-extra.safetensors")))
    _assert_same_thinker(_load(root), loaded)


def test_fused_release_missing_an_expert_tensor_is_refused(tmp_path: Path) -> None:
    root = write_tiny_release(tmp_path / "fused", seed=0, layout="fused")
    _edit_index(root, lambda m: m.pop("thinker.model.layers.1.mlp.experts.down_proj"))
    with pytest.raises(
        ReleaseError, match=r"missing thinker tensors: thinker\.model\.layers\.1\.mlp\.experts\.down_proj"
    ):
        _load(root)


def test_per_expert_release_missing_one_expert_is_refused(tiny_release: Path, tmp_path: Path) -> None:
    root = _copy(tiny_release, tmp_path / "r")
    key = "thinker.model.layers.0.mlp.experts.3.up_proj.weight"
    _edit_index(root, lambda m: m.pop(key))
    with pytest.raises(ReleaseError, match=f"missing thinker tensors: {re.escape(key)}$"):
        _load(root)


def test_both_layouts_for_one_layer_are_refused(tiny_release: Path, tmp_path: Path) -> None:
    root = _copy(tiny_release, tmp_path / "r")
    fused = write_tiny_release(tmp_path / "fused", seed=0, layout="fused")
    key = "thinker.model.layers.0.mlp.experts.down_proj"
    shutil.copy(_shard_of(fused, key), root / "model-fused.safetensors")
    _edit_index(root, lambda m: m.__setitem__(key, "model-fused.safetensors"))
    with pytest.raises(
        ReleaseError, match=r"unexpected tensors: thinker\.model\.layers\.0\.mlp\.experts\.0\.down_proj"
    ):
        _load(root)


def test_misshaped_per_expert_tensor_is_refused(tiny_release: Path, tmp_path: Path) -> None:
    root = _copy(tiny_release, tmp_path / "r")
    key = "thinker.model.layers.1.mlp.experts.0.gate_proj.weight"
    shard = _shard_of(root, key)
    tensors = load_file(str(shard))
    tensors[key] = tensors[key][:, :-1].contiguous()
    save_file(tensors, str(shard), metadata={"format": "pt"})
    with pytest.raises(ReleaseError, match=f"mis-shaped thinker tensors: {re.escape(key)}: release"):
        _load(root)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float32_release_loads_in_either_dtype(
    tiny_release: Path, tmp_path: Path, dtype: torch.dtype
) -> None:
    """A release stored in float32 (the tiny one is bf16) loads; values equal the bf16 ones, cast."""
    root = _copy(tiny_release, tmp_path / "r")
    for shard in sorted(root.glob("model-*.safetensors")):
        save_file(
            {k: v.float() for k, v in load_file(str(shard)).items()}, str(shard), metadata={"format": "pt"}
        )
    fresh = load_release_model(root, device="cpu", dtype=dtype, load_processor=False)
    reference = load_release_model(tiny_release, device="cpu", dtype=dtype, load_processor=False)
    _assert_same_thinker(fresh, reference)


def test_small_chunks_and_many_readers_give_the_same_weights(tiny_release: Path, loaded: LoadedModel) -> None:
    """Pieces cut across chunks of 1,000 bytes, read by 5 threads, land exactly where whole reads do."""
    fresh = load_release_model(
        tiny_release,
        device="cpu",
        dtype=torch.float32,
        load_processor=False,
        read_options=ReadOptions(workers=5, chunk_bytes=1000, depth=3),
    )
    assert fresh.read is not None
    assert fresh.read.workers == 5
    assert fresh.read.bytes == sum(v.numel() * 2 for v in loaded.model.thinker.state_dict().values())
    assert [name for name, _ in fresh.phases][:4] == ["plan", "config", "build", "read_wait"]
    _assert_same_thinker(fresh, loaded)


def test_truncated_shard_is_refused_naming_it(tiny_release: Path, tmp_path: Path) -> None:
    root = _copy(tiny_release, tmp_path / "r")
    shard = root / "model-00001-of-00004.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(
        ReleaseError,
        match=r"shard model-00001-of-00004\.safetensors: unreadable safetensors header .*past the end",
    ):
        _load(root)


@pytest.mark.parametrize("layout", ["per-expert", "fused"])
def test_release_implies_exactly_the_installed_targets(tmp_path: Path, layout: str) -> None:
    # what lets the read start before transformers is imported: the release alone implies the targets
    from engine.model.release import read_config, read_weight_map, shard_headers, thinker_targets
    from engine.model.release_plan import implied_targets
    from engine.model.thinker import build_thinker

    root = write_tiny_release(tmp_path / layout, seed=0, layout=layout)  # type: ignore[arg-type]
    implied = implied_targets(read_weight_map(root), shard_headers(root), torch.float32)
    thinker = build_thinker(read_config(root).thinker_config, "cpu", torch.float32)
    installed = thinker_targets(thinker)
    assert {n: (t.shape, t.dtype) for n, t in implied.items()} == {
        n: (t.shape, t.dtype) for n, t in installed.items()
    }
    assert all(p.is_meta for p in thinker.parameters())  # the build holds no parameter memory
    assert not any(b.is_meta for b in thinker.buffers())  # rotary tables and the like are computed


def test_early_read_is_installed_without_a_second_read(
    tiny_release: Path, loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[int] = []
    real = release_read.read_pieces

    def counting(*args: Any, **kwargs: Any) -> Any:
        reads.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr("engine.model.release.read_pieces", counting)
    fresh = _load(tiny_release)
    assert reads == [1]
    _assert_same_thinker(fresh, loaded)
    assert all(not p.is_meta and not p.requires_grad for p in fresh.model.thinker.parameters())


def test_release_whose_implied_targets_differ_is_refused_by_the_strict_check(
    tiny_release: Path, tmp_path: Path
) -> None:
    # the early read starts (the release is self-consistent) but holds one tensor the thinker does not
    # take: it is dropped and the strict check names the tensor, as without an early read
    root = _copy(tiny_release, tmp_path / "extra")
    shard = next(iter(sorted(root.glob("model-*.safetensors"))))
    tensors = load_file(str(shard))
    tensors["thinker.model.layers.0.extra.weight"] = torch.zeros(2, 2)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    _edit_index(root, lambda m: m.__setitem__("thinker.model.layers.0.extra.weight", shard.name))
    with pytest.raises(ReleaseError, match=r"unexpected tensors: thinker\.model\.layers\.0\.extra\.weight"):
        _load(root)


def test_early_read_of_other_targets_is_dropped_and_read_again(
    tiny_release: Path, loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # implied targets that pass the strict check yet differ from the installed ones (here one dtype): the
    # early tensors are released and the installed targets are read on their own
    import engine.model.release as release
    from engine.model.release_plan import Target

    real_implied = release.implied_targets
    early_reads: list[dict[str, torch.Tensor]] = []
    real_read = release._allocate_and_read

    def other_dtype(*args: Any, **kwargs: Any) -> dict[str, Target]:
        targets = real_implied(*args, **kwargs)
        name = next(iter(sorted(targets)))
        targets[name] = Target(name, targets[name].shape, torch.float64)
        return targets

    def recording(*args: Any, **kwargs: Any) -> Any:
        tensors, stats = real_read(*args, **kwargs)
        early_reads.append(tensors)
        return tensors, stats

    monkeypatch.setattr(release, "implied_targets", other_dtype)
    monkeypatch.setattr(release, "_allocate_and_read", recording)
    fresh = _load(tiny_release)
    assert len(early_reads) == 2
    assert early_reads[0] == {}  # the dropped read's tensors were let go before the second read
    _assert_same_thinker(fresh, loaded)
