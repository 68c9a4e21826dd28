"""Build the Qwen3-Omni thinker (transformers' class) without weights, ready to be given them.

The thinker is constructed on the target device and dtype with weight initialisation switched off and every
parameter on the meta device (no memory, no random init of 30B weights), while the non-persistent buffers
that the modules compute in `__init__` (rotary `inv_freq`, the audio tower's sinusoid table) are real and
correct. A whole meta-device build followed by `to_empty` would leave those buffers as garbage; they are
not in the release. The loader then installs the tensors it has read as the parameters (`install_tensors`).

Releases name the thinker's tensors as the checkpoint does, while transformers versions place its modules
differently (5.24 nests the text decoder and towers under `model`); `part_paths` finds each part in the
installed module tree (the one place that locates the text decoder), and `checkpoint_names` maps between
the two.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn


@contextlib.contextmanager
def _no_init() -> Iterator[None]:
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older 5.x layouts: fall back to paying for the random init
        yield
        return
    with no_init_weights():
        yield


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """While active, every parameter a module registers is replaced by a meta tensor of its shape and dtype
    (the device tensor it was created as is dropped at once, so the allocator reuses one block), while
    buffers stay on the device with the values `__init__` computed. Patches `nn.Module.register_parameter`
    for the duration: build one model at a time."""
    original = nn.Module.register_parameter

    def register(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        original(self, name, param)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def build_thinker(
    thinker_config: Any,
    device: torch.device | str,
    dtype: torch.dtype,
    attn_implementation: str = "sdpa",
) -> nn.Module:
    """A `Qwen3OmniMoeThinkerForConditionalGeneration` for `device`/`dtype` whose parameters are meta
    tensors (shape and dtype only), its buffers on `device`. Eval mode.

    Every parameter must then be given a tensor by `install_tensors` (the release loader gives all of them).
    """
    from transformers import Qwen3OmniMoeThinkerForConditionalGeneration

    with torch.device(device), _no_init(), _parameters_on_meta():
        factory: Any = Qwen3OmniMoeThinkerForConditionalGeneration._from_config
        model = factory(thinker_config, dtype=dtype, attn_implementation=attn_implementation)
    assert isinstance(model, nn.Module)
    return model.eval()


def install_tensors(thinker: nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Make each tensor of `tensors` (installed state-dict key -> tensor of that key's shape) the thinker's
    parameter or buffer of that key, without a copy; parameters do not require grad.

    Raises ValueError naming the keys that are not in the thinker, and the parameters or buffers still on
    the meta device afterwards."""
    unknown: list[str] = []
    for key, tensor in tensors.items():
        path, _, leaf = key.rpartition(".")
        module = thinker.get_submodule(path) if path else thinker
        if leaf in module._parameters:
            module._parameters[leaf] = nn.Parameter(tensor, requires_grad=False)
        elif leaf in module._buffers:
            module._buffers[leaf] = tensor
        else:
            unknown.append(key)
    empty = [n for n, t in (*thinker.named_parameters(), *thinker.named_buffers()) if t.is_meta]
    if unknown or empty:
        raise ValueError(f"not thinker tensors: {unknown[:8]}; still without data: {empty[:8]}")


def allocate_parameters(thinker: nn.Module, device: torch.device | str) -> None:
    """Give every meta parameter of a `build_thinker` result an uninitialised tensor on `device`, for callers
    that write the weights themselves (benches with random weights)."""
    state = thinker.state_dict(keep_vars=True)
    install_tensors(
        thinker,
        {k: torch.empty(t.shape, dtype=t.dtype, device=device) for k, t in state.items() if t.is_meta},
    )


CHECKPOINT_PARTS: tuple[str, ...] = ("model", "visual", "audio_tower", "lm_head")
"""The thinker's parts as a release names them, under `thinker.`: `model` is the text decoder
(`embed_tokens`, `layers.N`, `norm`), `visual` the vision tower, `audio_tower` the audio tower, `lm_head`."""


def _module_path(thinker: nn.Module, target: nn.Module, what: str) -> str:
    paths: list[str] = [name for name, module in thinker.named_modules() if module is target]
    if len(paths) != 1:
        raise ValueError(f"cannot place the thinker's {what} in its module tree (found at {paths})")
    return paths[0]


def part_paths(thinker: nn.Module) -> dict[str, str]:
    """Checkpoint part (`CHECKPOINT_PARTS`) -> module path of that part in the installed thinker.

    Found from the module tree, not from the transformers version: the text decoder is the module that owns
    the input embeddings (`model` in 5.17, `model.language_model` in 5.24), `lm_head` the output embeddings,
    and each tower the one module of that name (`visual` / `model.visual`). Raises ValueError when a part
    is missing or ambiguous, so an unknown layout fails before any weight is read.
    """
    # transformers' PreTrainedModel has both accessors; any other nn.Module (a wrong build) has neither.
    get_in: Any = getattr(thinker, "get_input_embeddings", None)
    get_out: Any = getattr(thinker, "get_output_embeddings", None)
    if get_in is None or get_out is None:
        raise ValueError(f"{type(thinker).__name__} exposes no input/output embeddings")
    embed_path = _module_path(thinker, get_in(), "input embeddings")
    text_path, _, leaf = embed_path.rpartition(".")
    if leaf != "embed_tokens" or not text_path:
        raise ValueError(f"the thinker's input embeddings sit at {embed_path!r}, not under a text decoder")
    paths = {"model": text_path, "lm_head": _module_path(thinker, get_out(), "output embeddings")}
    for part in ("visual", "audio_tower"):
        found = [name for name, _ in thinker.named_modules() if name.rpartition(".")[2] == part]
        if len(found) != 1:
            raise ValueError(f"cannot place the thinker's {part} in its module tree (found at {found})")
        paths[part] = found[0]
    return paths


def checkpoint_names(thinker: nn.Module, prefix: str = "thinker.") -> dict[str, str]:
    """Installed state-dict key -> release (checkpoint) tensor name, for every tensor the thinker needs.

    Each key is renamed by the innermost part (`part_paths`) that holds it, e.g. under transformers 5.24
    `model.language_model.layers.0.mlp.gate.weight` -> `thinker.model.layers.0.mlp.gate.weight`. Raises
    ValueError when a tensor lies outside every part or two tensors would get the same name.
    """
    parts = sorted(part_paths(thinker).items(), key=lambda kv: len(kv[1]), reverse=True)
    names: dict[str, str] = {}
    for key in thinker.state_dict(keep_vars=True):
        for part, path in parts:
            if key.startswith(path + "."):
                names[key] = f"{prefix}{part}{key[len(path) :]}"
                break
        else:
            raise ValueError(f"thinker tensor {key!r} lies outside every checkpoint part {CHECKPOINT_PARTS}")
    if len(set(names.values())) != len(names):
        raise ValueError("two thinker tensors map to the same checkpoint name")
    return names
