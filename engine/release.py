"""Read a Clef-omni release directory and load the thinker + joint head (SPEC section 3).

Only `thinker.*` tensors are read, one at a time with `safe_open` (memory-mapped: the bytes of `talker.*`
and `code2wav.*` tensors are never touched, and shards holding only those are never opened). Keys and shapes
are checked against the thinker from the safetensors headers before any tensor data is read.

A release names its tensors as the checkpoint does (`thinker.model.layers.N.*`, `thinker.visual.*`,
`thinker.audio_tower.*`, ...) whatever transformers is installed; `engine.thinker.checkpoint_names` maps
them onto the installed module tree (e.g. `thinker.model.language_model.*` under transformers 5.24).
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from engine.head import JointHeadConfig, JointSchemaHead
from engine.model import ClefOmniModel
from engine.thinker import build_thinker, checkpoint_names, expected_tensors

log = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
SKIPPED_PREFIXES = ("talker.", "code2wav.")
_SHOW = 8  # keys named per error message


class ReleaseError(Exception):
    """The release directory is missing a file or disagrees with the model; the message names the key."""


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model: ClefOmniModel
    tokenizer: Any  # transformers PreTrainedTokenizerFast
    processor: Any | None  # Qwen3OmniMoeProcessor, or None when it cannot be built (e.g. no torchvision)
    config: Any  # Qwen3OmniMoeConfig
    path: Path


def _names(keys: list[str]) -> str:
    more = f" (+{len(keys) - _SHOW} more)" if len(keys) > _SHOW else ""
    return ", ".join(keys[:_SHOW]) + more


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ReleaseError(f"release file missing: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ReleaseError(f"{path.name}: unreadable JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ReleaseError(f"{path.name}: expected a JSON object")
    return data


def read_weight_map(root: Path) -> dict[str, str]:
    """Tensor name -> shard file name from the index; raises ReleaseError when a shard is malformed."""
    weight_map = _read_json(root / INDEX_FILE).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ReleaseError(f"{INDEX_FILE}: 'weight_map' must map tensor names to shard files")
    return {str(k): v for k, v in weight_map.items()}


def read_config(root: Path) -> Any:
    """The Qwen3OmniMoeConfig of the release, audio output disabled."""
    from transformers import Qwen3OmniMoeConfig

    raw = _read_json(root / "config.json")
    if raw.get("model_type") != "qwen3_omni_moe":
        raise ReleaseError(f"config.json: model_type must be 'qwen3_omni_moe', got {raw.get('model_type')!r}")
    try:
        config = Qwen3OmniMoeConfig.from_pretrained(str(root))
    except Exception as exc:  # transformers raises many kinds here
        raise ReleaseError(f"config.json: {exc}") from exc
    config.enable_audio_output = False
    return config


def check_keys(expected: dict[str, tuple[int, ...]], weight_map: dict[str, str], root: Path) -> None:
    """Strict check of names (index) and shapes (shard headers, no tensor data read)."""
    missing = sorted(set(expected) - set(weight_map))
    if missing:
        raise ReleaseError(f"missing thinker tensors in {INDEX_FILE}: {_names(missing)}")
    unexpected = sorted(k for k in weight_map if k not in expected and not k.startswith(SKIPPED_PREFIXES))
    if unexpected:
        raise ReleaseError(
            f"unexpected tensors in {INDEX_FILE}: {_names(unexpected)} (a release names thinker tensors "
            "as the checkpoint does: thinker.model.layers.N.*, thinker.visual.*, thinker.audio_tower.*)"
        )
    by_shard: dict[str, list[str]] = defaultdict(list)
    for key in expected:
        by_shard[weight_map[key]].append(key)
    bad: list[str] = []
    for shard, keys in sorted(by_shard.items()):
        file = root / shard
        if not file.is_file():
            raise ReleaseError(f"shard {shard} (holding {keys[0]}) is missing")
        try:
            with safe_open(str(file), framework="pt") as f:
                present = set(f.keys())
                for key in keys:
                    if key not in present:
                        raise ReleaseError(
                            f"{key}: listed in {INDEX_FILE} under {shard} but not in that shard"
                        )
                    shape = tuple(f.get_slice(key).get_shape())
                    if shape != expected[key]:
                        bad.append(f"{key}: release {list(shape)} vs model {list(expected[key])}")
        except ReleaseError:
            raise
        except Exception as exc:
            raise ReleaseError(f"shard {shard}: unreadable safetensors header ({exc})") from exc
    if bad:
        raise ReleaseError(f"mis-shaped thinker tensors: {_names(bad)}")


def load_thinker_weights(thinker: torch.nn.Module, weight_map: dict[str, str], root: Path) -> None:
    """Copy every `thinker.*` tensor into `thinker` (cast to its dtype), shard by shard, logging progress.

    `weight_map` must have passed `check_keys`: its thinker names are the checkpoint's, each one mapped here
    onto the installed module's state-dict key."""
    targets = thinker.state_dict(keep_vars=True)
    installed = {name: key for key, name in checkpoint_names(thinker).items()}
    by_shard: dict[str, list[str]] = defaultdict(list)
    for key, shard in weight_map.items():
        if key.startswith("thinker."):
            by_shard[shard].append(key)
    shards = sorted(by_shard)
    start = time.monotonic()
    with torch.no_grad():
        for i, shard in enumerate(shards, start=1):
            nbytes = 0
            with safe_open(str(root / shard), framework="pt") as f:
                for key in by_shard[shard]:
                    tensor = f.get_tensor(key)
                    nbytes += tensor.numel() * tensor.element_size()
                    targets[installed[key]].copy_(tensor)
            log.info(
                "loaded shard %d/%d %s: %d thinker tensors, %.1f MB, %.1fs",
                i,
                len(shards),
                shard,
                len(by_shard[shard]),
                nbytes / 1e6,
                time.monotonic() - start,
            )


def load_head(
    root: Path, hidden_size: int, device: torch.device | str, dtype: torch.dtype
) -> JointSchemaHead:
    """The joint head, loaded strictly from joint_head_config.json + joint_head.safetensors."""
    try:
        config = JointHeadConfig.from_json(root / "joint_head_config.json")
    except FileNotFoundError as exc:
        raise ReleaseError("release file missing: joint_head_config.json") from exc
    except ValueError as exc:
        raise ReleaseError(str(exc)) from exc
    if config.hidden_size != hidden_size:
        raise ReleaseError(
            f"joint_head_config.json: hidden_size {config.hidden_size} != thinker {hidden_size}"
        )
    file = root / "joint_head.safetensors"
    if not file.is_file():
        raise ReleaseError("release file missing: joint_head.safetensors")
    state = load_file(str(file))
    with torch.device(device):
        head = JointSchemaHead(config)
    want = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    missing = sorted(set(want) - set(state))
    unexpected = sorted(set(state) - set(want))
    shaped = sorted(
        f"{k}: {list(state[k].shape)} vs {list(s)}"
        for k, s in want.items()
        if k in state and tuple(state[k].shape) != s
    )
    if unexpected:  # first: a head saved under other module names (e.g. our pre-release ones) ends here
        raise ReleaseError(
            f"joint_head.safetensors: {len(unexpected)} unexpected keys, first {_names(unexpected[:5])}; "
            f"a released head uses the SPEC section 4 names (hidden_norm, *_projection, evidence_layers.N.*, "
            f"layers.N.*, residual_scorer.{{0,3}}, ...); missing [{_names(missing)}]"
        )
    if missing or shaped:
        raise ReleaseError(
            f"joint_head.safetensors: missing [{_names(missing)}], mis-shaped [{_names(shaped)}]"
        )
    head.load_state_dict(state, strict=True)
    return head.to(dtype=dtype).eval()


def _load_processor(root: Path) -> Any | None:
    try:
        from transformers import AutoProcessor

        factory: Any = AutoProcessor.from_pretrained
        return factory(str(root))
    except Exception as exc:  # optional: media support needs it, text does not
        log.warning("processor not loaded from %s: %s", root, str(exc).strip().splitlines()[0])
        return None


def load_release_model(
    path: str | Path,
    device: str | torch.device = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    *,
    attn_implementation: str = "sdpa",
    load_processor: bool = True,
) -> LoadedModel:
    """Load the thinker (text, vision and audio towers; no talker) and the joint head, in eval mode.

    Blocking (seconds for the tiny release, minutes for the real one). Raises ReleaseError for a missing file
    or a missing, unexpected (other than talker./code2wav.) or mis-shaped tensor, naming the key.
    """
    from transformers import PreTrainedTokenizerFast

    root = Path(path)
    if not root.is_dir():
        raise ReleaseError(f"release directory not found: {root}")
    config = read_config(root)
    weight_map = read_weight_map(root)
    thinker = build_thinker(config.thinker_config, device, dtype, attn_implementation)
    check_keys(expected_tensors(thinker), weight_map, root)
    load_thinker_weights(thinker, weight_map, root)
    text_config = config.thinker_config.text_config
    head = load_head(root, int(text_config.hidden_size), device, dtype)
    try:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(root))
    except Exception as exc:
        raise ReleaseError(f"tokenizer: {exc}") from exc
    if len(tokenizer) > int(text_config.vocab_size):
        raise ReleaseError(f"tokenizer has {len(tokenizer)} ids but vocab_size is {text_config.vocab_size}")
    pad = tokenizer.pad_token_id
    model = ClefOmniModel(thinker, head, pad_token_id=int(pad) if pad is not None else 0).eval()
    processor = _load_processor(root) if load_processor else None
    return LoadedModel(model=model, tokenizer=tokenizer, processor=processor, config=config, path=root)
