"""The loader reads only thinker tensors, checks every key and shape, and names the culprit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import engine.release as release
from engine.release import LoadedModel, ReleaseError, load_release_model

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
    talker = [k for k in header if k.startswith("talker.")]
    assert talker
    for key in talker:
        begin, end = header[key]["data_offsets"]
        raw[8 + header_len + begin : 8 + header_len + end] = b"\xff" * (end - begin)
    mixed.write_bytes(bytes(raw))
    # Every tensor access goes through a recording wrapper.
    touched: list[str] = []
    real_open = release.safe_open

    class Recording:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._cm = real_open(*args, **kwargs)

        def __enter__(self) -> Recording:
            self._f = self._cm.__enter__()
            return self

        def __exit__(self, *exc: object) -> None:
            self._cm.__exit__(*exc)

        def keys(self) -> list[str]:
            return list(self._f.keys())

        def get_slice(self, key: str) -> Any:
            touched.append(key)
            return self._f.get_slice(key)

        def get_tensor(self, key: str) -> torch.Tensor:
            touched.append(key)
            return self._f.get_tensor(key)

    monkeypatch.setattr(release, "safe_open", Recording)
    fresh = _load(root)
    assert touched
    assert all(k.startswith("thinker.") for k in touched)
    reference = loaded.model.thinker.state_dict()
    for name, value in fresh.model.thinker.state_dict().items():
        assert torch.equal(value, reference[name]), name
