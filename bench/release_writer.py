"""A full-size random-weight Clef-omni release in the published layout, for start-up benchmarks only.

`write_fullsize_release(out)` writes what a real release directory holds (SPEC section 3), at the real
thinker's size (48 layers, 128 experts, hidden 2048, vision and audio towers as released: about 63 GB in
bf16) with every MoE expert as its own tensors, in shards of about `shard_bytes` (4 GB) in layer order, so
a layer's experts can straddle two shards. The talker and code2wav are present but small (the tiny
release's, with the talker reading the full-size thinker's hidden states): the loader never reads them, and
the H200 machine's memory holds the thinker once in /dev/shm, not the whole 71 GB model beside it. The
tokenizer and processor files are the tiny release's (the real ones cannot be downloaded here).

Weight values are random (speed does not depend on them): matrices N(0, 0.02), 1-D weights ones, biases
zeros, drawn on the GPU when there is one. `text_overrides` shrinks the thinker for quick tests on a CPU.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from bench.fullsize import TEXT_CONFIG
from devtools.tiny_release import release_shapes, write_tiny_release
from engine.model.head import JointHeadConfig, JointSchemaHead
from engine.model.release_plan import per_expert_sources

WEIGHT_FILES = (
    "config.json",
    "model.safetensors.index.json",
    "joint_head.safetensors",
    "joint_head_config.json",
)


@dataclass(frozen=True, slots=True)
class WrittenRelease:
    """What was written: the directory, its shards, tensor count and bytes, and the seconds it took."""

    path: Path
    shards: int
    tensors: int
    thinker_bytes: int
    total_bytes: int
    seconds: float


def fullsize_config(
    tiny_config: Mapping[str, Any],
    text_overrides: Mapping[str, Any] | None = None,
    full_towers: bool = True,
) -> Any:
    """The tiny release's `Qwen3OmniMoeConfig` with the thinker at full size (`bench.fullsize.TEXT_CONFIG`,
    the towers' default sizes, or the tiny towers without `full_towers`) and the small talker reading its
    hidden size."""
    from transformers import Qwen3OmniMoeConfig
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeThinkerConfig

    raw = json.loads(json.dumps(tiny_config))
    thinker = raw["thinker_config"]
    text = {**TEXT_CONFIG, **(text_overrides or {})}
    hidden = int(text["hidden_size"])
    ids = {k: v for k, v in thinker.items() if k.endswith("_token_id") or k == "position_id_per_seconds"}
    vision = (
        {"out_hidden_size": hidden}
        if full_towers
        else {**thinker["vision_config"], "out_hidden_size": hidden}
    )
    audio = {"output_dim": hidden} if full_towers else {**thinker["audio_config"], "output_dim": hidden}
    full = Qwen3OmniMoeThinkerConfig(text_config=text, vision_config=vision, audio_config=audio, **ids)
    raw["thinker_config"] = full.to_dict()
    raw["talker_config"]["thinker_hidden_size"] = hidden
    raw.pop("transformers_version", None)
    config = Qwen3OmniMoeConfig(**raw)
    config.architectures = ["Qwen3OmniMoeForConditionalGeneration"]
    config.dtype = torch.bfloat16
    return config


def _order(name: str) -> tuple[int, int, str]:
    """Thinker before talker before code2wav; decoder layers in numeric order (as published checkpoints)."""
    group = 0 if name.startswith("thinker.") else 1 if name.startswith("talker.") else 2
    layer = re.search(r"\.layers\.(\d+)\.", name)
    return group, int(layer.group(1)) if layer else -1, name


@torch.no_grad()
def _random(name: str, shape: torch.Size, device: torch.device, gen: torch.Generator) -> torch.Tensor:
    if len(shape) >= 2:
        t = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16).mul_(0.02)
    elif name.endswith("weight"):
        t = torch.ones(shape, device=device, dtype=torch.bfloat16)
    else:
        t = torch.zeros(shape, device=device, dtype=torch.bfloat16)
    return t.cpu()


def stored_shapes(shapes: Mapping[str, torch.Size]) -> dict[str, torch.Size]:
    """Release tensor shapes in the published layout: each fused expert tensor as its per-expert ones."""
    out: dict[str, torch.Size] = {}
    for name, shape in shapes.items():
        split = per_expert_sources(name, tuple(shape))
        out.update({s.name: torch.Size(s.shape) for s in split} if split is not None else {name: shape})
    return out


def _plan_shards(shapes: Mapping[str, torch.Size], shard_bytes: int) -> list[list[str]]:
    """Stored names cut into shards of about `shard_bytes` in `_order` (a layer may straddle two)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name in sorted(shapes, key=_order):
        nbytes = 2 * int(torch.Size(shapes[name]).numel())
        if shards[-1] and size + nbytes > shard_bytes and name.startswith("thinker."):
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def write_fullsize_release(
    out: str | Path,
    *,
    shard_bytes: int = 4 << 30,
    writers: int = 2,
    text_overrides: Mapping[str, Any] | None = None,
    full_towers: bool = True,
    seed: int = 0,
    log: Any = print,
) -> WrittenRelease:
    """Write the release into `out` (created; existing shards overwritten) and return what was written.

    Blocking: about a minute at full size on the H200 machine (random values drawn on the GPU, `writers`
    shards written at once; each writer holds a shard in host memory about twice over while safetensors
    serialises it). `log` gets one line per shard.
    """
    start = time.monotonic()
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="clef-fullsize-") as tmp:
        tiny = write_tiny_release(Path(tmp) / "tiny")
        for item in tiny.iterdir():  # tokenizer, chat template, processor files
            if item.name not in WEIGHT_FILES and not item.name.startswith("model-"):
                shutil.copy(item, root / item.name)
        config = fullsize_config(
            json.loads((tiny / "config.json").read_text(encoding="utf-8")), text_overrides, full_towers
        )
        generation = (tiny / "generation_config.json").read_bytes()
    config.save_pretrained(str(root))
    (root / "generation_config.json").write_bytes(generation)
    shapes = stored_shapes(release_shapes(config))
    plan = _plan_shards(shapes, shard_bytes)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    lock = threading.Lock()
    weight_map: dict[str, str] = {}
    totals = {"thinker": 0, "all": 0, "tensors": 0}

    def write(index: int, names: list[str]) -> None:
        gen = torch.Generator(device=device).manual_seed(seed * 1000 + index)
        file = f"model-{index:05d}-of-{len(plan):05d}.safetensors"
        tensors = {name: _random(name, shapes[name], device, gen) for name in names}
        save_file(tensors, str(root / file), metadata={"format": "pt"})
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        thinker = sum(t.numel() * t.element_size() for k, t in tensors.items() if k.startswith("thinker."))
        with lock:
            weight_map.update(dict.fromkeys(tensors, file))
            totals["thinker"] += thinker
            totals["all"] += nbytes
            totals["tensors"] += len(tensors)
            log(
                f"wrote {file}: {len(tensors)} tensors, {nbytes / 1e9:.2f} GB, "
                f"{time.monotonic() - start:.1f}s"
            )

    with ThreadPoolExecutor(max(1, writers)) as pool:
        for future in [pool.submit(write, i, names) for i, names in enumerate(plan, start=1)]:
            future.result()
    index = {"metadata": {"total_size": totals["all"]}, "weight_map": dict(sorted(weight_map.items()))}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    _write_head(root, int(config.thinker_config.text_config.hidden_size), seed)
    return WrittenRelease(
        root, len(plan), totals["tensors"], totals["thinker"], totals["all"], time.monotonic() - start
    )


def _write_head(root: Path, hidden: int, seed: int) -> None:
    head_config = JointHeadConfig(hidden_size=hidden)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = JointSchemaHead(head_config)
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in head.state_dict().items()}
    save_file(state, str(root / "joint_head.safetensors"), metadata={"format": "pt"})
    (root / "joint_head_config.json").write_text(head_config.to_json() + "\n", encoding="utf-8")
