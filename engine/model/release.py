"""Read a Clef-omni release directory and load the thinker + joint head (SPEC section 3).

Keys, expert layouts (fused or one tensor per expert) and shapes are checked against the installed thinker
from the index and the shard headers before any tensor data is read (`engine.model.release_plan`); then
only the bytes of `thinker.*` tensors are read, in parallel, straight into the parameters
(`engine.model.release_read`): the bytes of `talker.*` and `code2wav.*` tensors are never read, and
shards holding only those are never opened.

A release names its tensors as the checkpoint does (`thinker.model.layers.N.*`, `thinker.visual.*`,
`thinker.audio_tower.*`, ...) whatever transformers is installed; `engine.model.thinker.checkpoint_names` maps
them onto the installed module tree (e.g. `thinker.model.language_model.*` under transformers 5.24).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from engine.model.clef import ClefOmniModel
from engine.model.head import JointHeadConfig, JointSchemaHead
from engine.model.release_header import HeaderError, StoredTensor, read_header
from engine.model.release_plan import Piece, PlanError, Target, implied_targets, names, plan_reads
from engine.model.release_read import ReadOptions, ReadStats, read_pieces
from engine.model.thinker import build_thinker, checkpoint_names, install_tensors

log = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"


class ReleaseError(Exception):
    """The release directory is missing a file or disagrees with the model; the message names the key."""


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model: ClefOmniModel
    tokenizer: Any  # transformers PreTrainedTokenizerFast
    processor: Any | None  # Qwen3OmniMoeProcessor, or None when it cannot be built (e.g. no torchvision)
    config: Any  # Qwen3OmniMoeConfig
    path: Path
    phases: tuple[tuple[str, float], ...] = ()  # (phase, seconds): plan, config, build, read_wait, ...
    read: ReadStats | None = None


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


def thinker_targets(thinker: torch.nn.Module) -> dict[str, Target]:
    """Release (checkpoint) name -> installed target, for every tensor the thinker needs."""
    state = thinker.state_dict(keep_vars=True)
    return {
        name: Target(key, tuple(state[key].shape), state[key].dtype)
        for key, name in checkpoint_names(thinker).items()
    }


def shard_headers(root: Path) -> Callable[[str], Mapping[str, StoredTensor]]:
    """A reader of the shard headers under `root`, each read once (thread-safe); raises ReleaseError naming
    a missing shard or an unreadable header."""
    lock = threading.Lock()
    seen: dict[str, Mapping[str, StoredTensor]] = {}

    def header(shard: str) -> Mapping[str, StoredTensor]:
        with lock:
            if shard not in seen:
                file = root / shard
                if not file.is_file():
                    raise ReleaseError(f"shard {shard} is missing")
                try:
                    seen[shard] = read_header(file)
                except (HeaderError, OSError) as exc:
                    raise ReleaseError(f"shard {shard}: unreadable safetensors header ({exc})") from exc
            return seen[shard]

    return header


def plan_thinker_reads(
    targets: Mapping[str, Target],
    weight_map: Mapping[str, str],
    header: Callable[[str], Mapping[str, StoredTensor]],
) -> list[Piece]:
    """The strict check (names, expert layouts, shapes from the shard headers; no tensor data read) and the
    pieces to read. Raises ReleaseError naming the tensors or the shard at fault."""
    try:
        return plan_reads(targets, weight_map, header)
    except PlanError as exc:
        raise ReleaseError(f"{INDEX_FILE}: {exc}") from exc


def _allocate_and_read(
    targets: Mapping[str, Target],
    pieces: list[Piece],
    root: Path,
    device: torch.device | str,
    options: ReadOptions | None,
) -> tuple[dict[str, torch.Tensor], ReadStats]:
    """A tensor per target (by `Target.key`) on `device`, filled from `pieces`; logs the total rate.
    Raises ReleaseError when a shard cannot be read."""
    tensors = {t.key: torch.empty(t.shape, dtype=t.dtype, device=device) for t in targets.values()}
    with torch.no_grad():
        try:
            stats = read_pieces(tensors, pieces, root, options)
        except OSError as exc:
            raise ReleaseError(f"reading the release failed: {exc}") from exc
    log.info(
        "loaded %d thinker tensors (%d pieces) from %d shards: %.2f GB in %.2fs (%.1f GB/s, %d readers), "
        "peak host RSS %.2f GB",
        len(targets),
        len(pieces),
        len(stats.shards),
        stats.bytes / 1e9,
        stats.seconds,
        stats.gb_per_s,
        stats.workers,
        stats.peak_rss_bytes / 1e9,
    )
    return tensors, stats


@dataclass(frozen=True, slots=True)
class _Early:
    """A read started before the model was built: the targets it fills (by release name), its result, and
    the thread switch interval to restore once it is done."""

    implied: dict[str, Target]
    future: Future[tuple[dict[str, torch.Tensor], ReadStats]]
    switch_interval_s: float


def _start_early_read(
    weight_map: Mapping[str, str],
    header: Callable[[str], Mapping[str, StoredTensor]],
    root: Path,
    device: torch.device | str,
    dtype: torch.dtype,
    options: ReadOptions | None,
) -> _Early | None:
    """Start reading, in a thread of its own, the thinker tensors the release implies (`implied_targets`,
    keyed by release name) before the model exists: its readers release the GIL while the caller imports
    transformers and builds the model. None (nothing started) when the release implies no whole targets;
    the strict check against the built model then names what is wrong."""
    try:
        implied = implied_targets(weight_map, header, dtype)
        pieces = plan_reads(implied, weight_map, header)
    except (PlanError, ReleaseError) as exc:
        log.debug("no early read of %s: %s", root, exc)
        return None
    previous = sys.getswitchinterval()
    wanted = (options or ReadOptions()).switch_interval_s
    if wanted is not None:
        sys.setswitchinterval(wanted)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clef-release-read")
    try:
        future = pool.submit(_allocate_and_read, implied, pieces, root, device, options)
        return _Early(implied, future, previous)
    finally:
        pool.shutdown(wait=False)


def _finish_read(
    early: _Early | None,
    targets: Mapping[str, Target],
    weight_map: Mapping[str, str],
    header: Callable[[str], Mapping[str, StoredTensor]],
    root: Path,
    device: torch.device | str,
    options: ReadOptions | None,
) -> tuple[dict[str, torch.Tensor], ReadStats]:
    """The installed thinker's tensors (by state-dict key) and the read's figures, blocking.

    The early read is used when what the release implies is exactly what the installed thinker needs: the
    same names, shapes and dtypes give the same pieces, so `plan_reads` against the installed targets
    accepts the release. Otherwise it is waited for and dropped, and the strict check runs against the
    installed targets (raising ReleaseError naming what is wrong) before a read of their own."""
    if early is not None:
        try:
            if {n: (t.shape, t.dtype) for n, t in early.implied.items()} == {
                n: (t.shape, t.dtype) for n, t in targets.items()
            }:
                read, stats = early.future.result()
                return {targets[name].key: tensor for name, tensor in read.items()}, stats
            with contextlib.suppress(ReleaseError):
                early.future.result()[0].clear()  # free its tensors before the read below allocates again
        finally:
            sys.setswitchinterval(early.switch_interval_s)
    pieces = plan_thinker_reads(targets, weight_map, header)
    return _allocate_and_read(targets, pieces, root, device, options)


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
            f"joint_head.safetensors: {len(unexpected)} unexpected keys, first {names(unexpected[:5])}; "
            f"a released head uses the SPEC section 4 names (hidden_norm, *_projection, evidence_layers.N.*, "
            f"layers.N.*, residual_scorer.{{0,3}}, ...); missing [{names(missing)}]"
        )
    if missing or shaped:
        raise ReleaseError(
            f"joint_head.safetensors: missing [{names(missing)}], mis-shaped [{names(shaped)}]"
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
    read_options: ReadOptions | None = None,
    early_read: bool = True,
) -> LoadedModel:
    """Load the thinker (text, vision and audio towers; no talker) and the joint head, in eval mode.

    Blocking (seconds for the tiny release; for the full size, about its bytes over the read rate). Raises
    ReleaseError for a missing file or a missing, unexpected (other than talker./code2wav.) or mis-shaped
    tensor, naming the key. `phases` of the result times each step; `read` has the read's figures.
    `early_read` starts the read before transformers is imported and the model built (`_start_early_read`);
    off, the read follows the strict check against the built model.
    """
    root = Path(path)
    if not root.is_dir():
        raise ReleaseError(f"release directory not found: {root}")
    phases: list[tuple[str, float]] = []
    clock = time.monotonic()

    def phase(name: str) -> None:
        nonlocal clock
        now = time.monotonic()
        phases.append((name, now - clock))
        clock = now

    weight_map = read_weight_map(root)
    header = shard_headers(root)
    early = _start_early_read(weight_map, header, root, device, dtype, read_options) if early_read else None
    phase("plan")
    config = read_config(root)  # imports transformers while the early read runs
    phase("config")
    thinker = build_thinker(config.thinker_config, device, dtype, attn_implementation)
    targets = thinker_targets(thinker)
    phase("build")
    tensors, stats = _finish_read(early, targets, weight_map, header, root, device, read_options)
    try:
        install_tensors(thinker, tensors)
    except ValueError as exc:
        raise ReleaseError(f"installing the thinker's tensors: {exc}") from exc
    del tensors
    phase("read_wait")
    from transformers import PreTrainedTokenizerFast

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
    phase("head_tokenizer")
    processor = _load_processor(root) if load_processor else None
    phase("processor")
    return LoadedModel(model, tokenizer, processor, config, root, tuple(phases), stats)
