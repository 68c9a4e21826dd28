"""Release I/O by checkpoint names (SPEC 3/4), whatever transformers is installed.

The vendored fixture release (tests/conformance/release, written by the vendor) is the reference for every
name and shape: the loader must read it, and a release written by `make-tiny-release` must hold the same
tensors.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from engine.model.release import LoadedModel, ReleaseError, load_release_model
from engine.model.thinker import CHECKPOINT_PARTS, checkpoint_names, part_paths

FIXTURE = Path(__file__).resolve().parents[3] / "conformance" / "release"
PER_EXPERT_FIXTURE = FIXTURE.parent / "release-per-expert"
INDEX = "model.safetensors.index.json"


def _shapes(root: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor of a release (model shards and joint head) -> shape, read from the safetensors headers."""
    weight_map: dict[str, str] = json.loads((root / INDEX).read_text())["weight_map"]
    out: dict[str, tuple[int, ...]] = {}
    for shard in sorted(set(weight_map.values())):
        with safe_open(str(root / shard), framework="pt") as f:
            out.update({k: tuple(f.get_slice(k).get_shape()) for k in f.keys()})  # noqa: SIM118
    with safe_open(str(root / "joint_head.safetensors"), framework="pt") as f:
        out.update({f"joint_head:{k}": tuple(f.get_slice(k).get_shape()) for k in f.keys()})  # noqa: SIM118
    return out


@pytest.fixture(scope="module")
def fixture_model() -> LoadedModel:
    return load_release_model(FIXTURE, device="cpu", dtype=torch.float32, load_processor=False)


def test_tiny_release_has_the_fixture_names_and_shapes(tiny_release: Path) -> None:
    """The default tiny release is in the published layout: the per-expert fixture's names and shapes."""
    ours, theirs = _shapes(tiny_release), _shapes(PER_EXPERT_FIXTURE)
    assert sorted(set(ours) - set(theirs)) == []
    assert sorted(set(theirs) - set(ours)) == []
    assert {k for k in ours if ours[k] != theirs[k]} == set()
    ours_map = json.loads((tiny_release / INDEX).read_text())["weight_map"]
    assert any(k.startswith("thinker.model.layers.") for k in ours_map)
    assert not any(".language_model." in k or k.startswith("thinker.model.visual.") for k in ours_map)


def test_checkpoint_names_cover_the_fixture(fixture_model: LoadedModel) -> None:
    thinker = fixture_model.model.thinker
    names = checkpoint_names(thinker)
    release = {k for k in json.loads((FIXTURE / INDEX).read_text())["weight_map"] if k.startswith("thinker.")}
    assert set(names.values()) == release
    assert set(names) == set(thinker.state_dict())
    paths = part_paths(thinker)
    assert set(paths) == set(CHECKPOINT_PARTS)
    text_model = fixture_model.model.text_model  # the model finds its text decoder through `part_paths`
    assert text_model is thinker.get_submodule(paths["model"])
    assert text_model.embed_tokens is thinker.get_input_embeddings()
    assert hasattr(text_model, "layers")


def test_every_fixture_tensor_lands_in_its_module(fixture_model: LoadedModel) -> None:
    thinker = fixture_model.model.thinker
    installed = {name: key for key, name in checkpoint_names(thinker).items()}
    state = thinker.state_dict()
    weight_map: dict[str, str] = json.loads((FIXTURE / INDEX).read_text())["weight_map"]
    seen = set()
    for name, shard in weight_map.items():
        if not name.startswith("thinker."):
            continue
        with safe_open(str(FIXTURE / shard), framework="pt") as f:
            assert torch.equal(state[installed[name]], f.get_tensor(name).float()), name
        seen.add(name.split(".")[1])
    assert seen == set(CHECKPOINT_PARTS)


def test_part_paths_refuse_an_unknown_tree() -> None:
    with pytest.raises(ValueError, match="embeddings"):
        part_paths(nn.Linear(2, 2))


def test_live_module_names_are_refused(tmp_path: Path) -> None:
    """A release written with the module names of transformers 5.24 (not the checkpoint's) does not load."""
    root = tmp_path / "r"
    shutil.copytree(FIXTURE, root)
    data = json.loads((root / INDEX).read_text())
    data["weight_map"] = {
        re.sub(r"^thinker\.model\.", "thinker.model.language_model.", k): v
        for k, v in data["weight_map"].items()
    }
    (root / INDEX).write_text(json.dumps(data))
    with pytest.raises(ReleaseError, match=r"missing thinker tensors.*thinker\.model\.embed_tokens\.weight"):
        load_release_model(root, device="cpu", dtype=torch.float32, load_processor=False)


_OLD_HEAD_NAMES = (  # the names this project's head used before SPEC section 4 named the released ones
    ("hidden_norm.", "norm."),
    ("global_projection.", "global."),
    ("evidence_layers.", "routing_layers."),
    ("option_summary_norm.", "option_summary."),
    ("field_norm.", "field."),
    ("option_norm.", "option."),
    ("residual_scorer.3.", "scorer.2."),
    ("residual_scorer.0.", "scorer.0."),
    (".query_norm.", ".ln_q."),
    (".memory_norm.", ".ln_m."),
    (".feedforward_norm.", ".ln_f."),
    (".attention.", ".mha."),
    (".feedforward.3.", ".ffn.2."),
    (".feedforward.0.", ".ffn.0."),
    ("_projection.", "."),
)


def _old_name(key: str) -> str:
    for new, old in _OLD_HEAD_NAMES:
        key = key.replace(new, old)
    return key


def test_head_with_old_names_is_refused_naming_keys(tmp_path: Path) -> None:
    root = tmp_path / "r"
    shutil.copytree(FIXTURE, root)
    state = load_file(str(root / "joint_head.safetensors"))
    old = {_old_name(k): v for k, v in state.items()}
    assert len(old) == len(state)
    assert {"norm.weight", "routing_layers.0.ffn.2.bias", "scorer.2.weight"} <= set(old)
    save_file(old, str(root / "joint_head.safetensors"))
    with pytest.raises(ReleaseError) as info:
        load_release_model(root, device="cpu", dtype=torch.float32, load_processor=False)
    message = str(info.value)
    unexpected = sorted(set(old) - set(state))
    assert f"{len(unexpected)} unexpected keys, first {', '.join(unexpected[:5])};" in message
    assert "field.bias, field.weight, global.weight" in message
    assert "hidden_norm" in message  # says what a released head is named


def test_head_loads_the_fixture_values(fixture_model: LoadedModel) -> None:
    state = load_file(str(FIXTURE / "joint_head.safetensors"))
    loaded = fixture_model.model.head.state_dict()
    assert set(loaded) == set(state)
    for key, value in state.items():
        assert torch.equal(loaded[key], value.float()), key


@pytest.mark.parametrize("layout", ["per-expert", "fused"])
def test_tiny_release_seed_0_is_the_fixture(tiny_release: Path, tmp_path: Path, layout: str) -> None:
    """The vendor built both fixture layouts with this writer (seed 0): every file matches byte for byte,
    config.json up to the transformers version that wrote it."""
    from devtools.tiny_release import write_tiny_release

    fixture = PER_EXPERT_FIXTURE if layout == "per-expert" else FIXTURE
    if layout == "fused":
        tiny_release = write_tiny_release(tmp_path / "fused", seed=0, layout="fused")
    for file in sorted(fixture.iterdir()):
        ours = (tiny_release / file.name).read_bytes()
        if file.name == "config.json":
            mine, theirs = json.loads(ours), json.loads(file.read_bytes())
            assert mine.pop("transformers_version")
            assert theirs.pop("transformers_version")
            assert mine == theirs
        else:
            assert ours == file.read_bytes(), file.name
