"""The tiny release has the real layout, a working tokenizer and ids that agree with the config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from devtools.tiny_release import PLAIN_ADDED_TOKENS, SPECIAL_TOKENS, write_tiny_release

FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "joint_head.safetensors",
    "joint_head_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "processor_config.json",
    "preprocessor_config.json",
    *(f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)),
}


@pytest.fixture(scope="module")
def loaded_tokenizer_and_config(tiny_release: Path) -> tuple[object, dict[str, object]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_release))
    return tok, json.loads((tiny_release / "config.json").read_text())


def test_layout(tiny_release: Path) -> None:
    assert {p.name for p in tiny_release.iterdir()} == FILES
    config = json.loads((tiny_release / "config.json").read_text())
    assert config["model_type"] == "qwen3_omni_moe"
    assert {"thinker_config", "talker_config", "code2wav_config"} <= set(config)
    weight_map = json.loads((tiny_release / "model.safetensors.index.json").read_text())["weight_map"]
    prefixes = {k.split(".", 1)[0] for k in weight_map}
    assert prefixes == {"thinker", "talker", "code2wav"}
    assert "thinker.lm_head.weight" in weight_map
    assert any(k.startswith("thinker.visual.") for k in weight_map)
    assert any(k.startswith("thinker.audio_tower.") for k in weight_map)
    for shard in sorted(set(weight_map.values())):
        with safe_open(str(tiny_release / shard), framework="pt") as f:
            assert sorted(f.keys()) == sorted(k for k, v in weight_map.items() if v == shard)
    shard_prefixes = {
        v: {k.split(".")[0] for k, s in weight_map.items() if s == v} for v in weight_map.values()
    }
    assert shard_prefixes["model-00002-of-00004.safetensors"] == {"thinker", "talker"}  # mixed shard
    assert shard_prefixes["model-00003-of-00004.safetensors"] == {"talker"}
    assert shard_prefixes["model-00004-of-00004.safetensors"] == {"code2wav"}


def test_tokenizer_ids_match_config(loaded_tokenizer_and_config: tuple[object, dict[str, object]]) -> None:
    tok, config = loaded_tokenizer_and_config
    ids = {t: tok.convert_tokens_to_ids(t) for t in (*SPECIAL_TOKENS, *PLAIN_ADDED_TOKENS)}  # type: ignore[attr-defined]
    thinker = config["thinker_config"]
    assert isinstance(thinker, dict)
    assert thinker["image_token_id"] == ids["<|image_pad|>"]
    assert thinker["video_token_id"] == ids["<|video_pad|>"]
    assert thinker["audio_token_id"] == ids["<|audio_pad|>"]
    assert thinker["vision_start_token_id"] == ids["<|vision_start|>"]
    assert thinker["audio_start_token_id"] == ids["<|audio_start|>"]
    assert config["im_start_token_id"] == ids["<|im_start|>"]
    assert config["im_end_token_id"] == ids["<|im_end|>"]
    assert len(tok) <= thinker["text_config"]["vocab_size"]  # type: ignore[arg-type]
    text = (
        '<|im_start|>system\nSTATE:\n{"a":"Überlastung 東京 🚨"}'
        "<think>\n\n</think>\n\n<|image_pad|><|im_end|>"
    )
    encoded = tok.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]
    assert encoded[0] == ids["<|im_start|>"]
    assert encoded[-1] == ids["<|im_end|>"]
    assert ids["<think>"] in encoded
    assert ids["<|image_pad|>"] in encoded
    assert tok.decode(encoded) == text  # type: ignore[attr-defined]


def test_deterministic(tmp_path: Path, tiny_release: Path) -> None:
    again = write_tiny_release(tmp_path / "again", seed=0)
    for name in FILES:
        assert (again / name).read_bytes() == (tiny_release / name).read_bytes(), name
    other = write_tiny_release(tmp_path / "other", seed=1)
    shard = "model-00001-of-00004.safetensors"
    assert (other / shard).read_bytes() != (tiny_release / shard).read_bytes()
