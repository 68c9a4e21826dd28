"""Which stored bytes fill which installed thinker parameter: the strict key, shape and layout check.

A release stores each MoE layer's experts in one of two layouts (SPEC section 3), and a layer's tensors may
lie in any shard:
    fused        P.gate_up_proj [E, 2I, H]   P.down_proj [E, H, I]
    per expert   P.E.gate_proj.weight [I, H] + P.E.up_proj.weight [I, H]   P.E.down_proj.weight [H, I]
where P is `thinker.model.layers.L.mlp.experts`. Both fill the same installed parameters:
`gate_up_proj[E] = cat(gate, up)` on the output dim (gate rows first) and `down_proj[E] = down`. Every
expert's block is contiguous in the installed tensor, so each stored tensor becomes one `Piece`: a run of
elements copied into a flat range of its target. Any other tensor is one piece covering its whole target.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from engine.model.release_header import StoredTensor

SKIPPED_PREFIXES = ("talker.", "code2wav.")
"""Release tensors that are shipped but never read (SPEC section 3)."""
_FUSED = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")
_SHOW = 8  # names per error message


class PlanError(ValueError):
    """The release disagrees with the installed thinker; the message names the tensors."""


@dataclass(frozen=True, slots=True)
class Target:
    """One installed tensor to fill: its state-dict key, shape and dtype."""

    key: str
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True, slots=True)
class Piece:
    """Copy `count` elements of `dtype` stored at byte `offset` of `shard` into elements
    `[start, start + count)` of the flattened (contiguous) installed tensor `target`."""

    shard: str
    name: str
    offset: int
    count: int
    dtype: torch.dtype
    target: str
    start: int

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.itemsize


@dataclass(frozen=True, slots=True)
class Source:
    """A stored tensor that fills part of a target: its release name, shape and first target element."""

    name: str
    shape: tuple[int, ...]
    start: int


def names(keys: list[str]) -> str:
    """At most `_SHOW` names joined for an error message, with a count of the rest."""
    more = f" (+{len(keys) - _SHOW} more)" if len(keys) > _SHOW else ""
    return ", ".join(keys[:_SHOW]) + more


def per_expert_sources(name: str, shape: tuple[int, ...]) -> list[Source] | None:
    """The per-expert tensors that make up the fused expert tensor `name` of `shape` (the one statement of
    the layout mapping, used by the loader and by the release writers), or None for any other tensor."""
    if len(shape) != 3 or not name.endswith(_FUSED):
        return None
    prefix, leaf = name.rsplit(".", 1)
    experts, rows, cols = shape
    block = rows * cols
    if leaf == "down_proj":
        return [Source(f"{prefix}.{e}.down_proj.weight", (rows, cols), e * block) for e in range(experts)]
    half = rows // 2
    return [
        Source(f"{prefix}.{e}.{part}.weight", (half, cols), e * block + k * half * cols)
        for e in range(experts)
        for k, part in enumerate(("gate_proj", "up_proj"))
    ]


_PER_EXPERT = re.compile(
    r"^(?P<prefix>.+\.mlp\.experts)\.(?P<e>\d+)\.(?P<part>gate_proj|up_proj|down_proj)\.weight$"
)


def implied_targets(
    weight_map: Mapping[str, str],
    header: Callable[[str], Mapping[str, StoredTensor]],
    dtype: torch.dtype,
) -> dict[str, Target]:
    """The thinker targets a release implies on its own, before any model is built: each stored thinker
    tensor (`SKIPPED_PREFIXES` aside) under its own name and shape, and each layer's per-expert tensors as
    the two fused tensors `per_expert_sources` maps them from. `Target.key` is the release name; floating
    point tensors get `dtype`. Lets the read start while the model is still being built; the loader then
    compares these with the installed thinker's targets, and `plan_reads` against the installed ones
    stays the strict check (an indexed tensor its shard lacks is left out here, and `plan_reads` refuses it).
    Raises PlanError when per-expert tensors do not form whole fused tensors."""
    stored: dict[str, StoredTensor] = {}
    for shard in sorted({v for k, v in weight_map.items() if not k.startswith(SKIPPED_PREFIXES)}):
        tensors = header(shard)
        for name, tensor in tensors.items():
            if weight_map.get(name) == shard and not name.startswith(SKIPPED_PREFIXES):
                stored[name] = tensor
    experts: dict[str, dict[int, dict[str, tuple[int, ...]]]] = defaultdict(lambda: defaultdict(dict))
    targets: dict[str, Target] = {}
    for name, tensor in stored.items():
        match = _PER_EXPERT.match(name)
        if match is None:
            kind = dtype if tensor.dtype.is_floating_point else tensor.dtype
            targets[name] = Target(name, tensor.shape, kind)
        else:
            experts[match["prefix"]][int(match["e"])][match["part"]] = tensor.shape
    for prefix, by_expert in experts.items():
        count = len(by_expert)
        first = by_expert.get(0, {})
        gate, down = first.get("gate_proj"), first.get("down_proj")
        if sorted(by_expert) != list(range(count)) or gate is None or down is None or len(gate) != 2:
            raise PlanError(f"{prefix}: per-expert tensors do not cover experts 0..{count - 1} alike")
        for name, shape in (
            (f"{prefix}.gate_up_proj", (count, 2 * gate[0], gate[1])),
            (f"{prefix}.down_proj", (count, *down)),
        ):
            sources = per_expert_sources(name, shape) or []
            wrong = [s.name for s in sources if s.name not in stored or stored[s.name].shape != s.shape]
            if wrong:
                raise PlanError(f"{prefix}: per-expert tensors missing or of other shapes: {names(wrong)}")
            targets[name] = Target(name, shape, dtype)
    return targets


def _sources(expected: Mapping[str, Target], weight_map: Mapping[str, str]) -> dict[str, list[Source]]:
    """Release name of each target -> the stored tensors that fill it; raises PlanError naming what is
    missing, or what the release holds that no target takes (other than talker./code2wav.)."""
    chosen: dict[str, list[Source]] = {}
    missing: list[str] = []
    for name, target in expected.items():
        if name in weight_map:
            chosen[name] = [Source(name, target.shape, 0)]
            continue
        split = per_expert_sources(name, target.shape)
        if split is None:
            missing.append(name)
            continue
        absent = [s.name for s in split if s.name not in weight_map]
        if not absent:
            chosen[name] = split
        elif len(absent) == len(split):
            missing.append(f"{name} (or its per-expert tensors {split[0].name}, ...)")
        else:
            missing.extend(absent)
    if missing:
        raise PlanError(f"missing thinker tensors: {names(sorted(missing))}")
    used = {s.name for sources in chosen.values() for s in sources}
    unexpected = sorted(k for k in weight_map if k not in used and not k.startswith(SKIPPED_PREFIXES))
    if unexpected:
        raise PlanError(
            f"unexpected tensors: {names(unexpected)} (a release names thinker tensors as the checkpoint "
            "does: thinker.model.layers.N.*, thinker.visual.*, thinker.audio_tower.*; a layer's experts are "
            "fused or one tensor per expert, not both)"
        )
    return chosen


def plan_reads(
    expected: Mapping[str, Target],
    weight_map: Mapping[str, str],
    header: Callable[[str], Mapping[str, StoredTensor]],
) -> list[Piece]:
    """Every piece to read, in shard then file order, after checking names, layouts and shapes.

    `expected` maps each release (checkpoint) name to its installed target; `weight_map` is the index's
    name -> shard; `header(shard)` returns that shard's stored tensors (called once per shard that holds a
    needed tensor; shards holding only skipped tensors are never asked for). Raises `PlanError` naming the
    tensors that are missing, unexpected, absent from the shard the index names, mis-shaped or not floating
    point.
    """
    chosen = _sources(expected, weight_map)
    headers: dict[str, Mapping[str, StoredTensor]] = {}
    pieces: list[Piece] = []
    bad: list[str] = []
    for name, sources in chosen.items():
        target = expected[name]
        for source in sources:
            shard = weight_map[source.name]
            if shard not in headers:
                headers[shard] = header(shard)
            stored = headers[shard].get(source.name)
            if stored is None:
                raise PlanError(f"{source.name}: listed in the index under {shard} but not in that shard")
            if stored.shape != source.shape:
                bad.append(f"{source.name}: release {list(stored.shape)} vs model {list(source.shape)}")
            elif not stored.dtype.is_floating_point and stored.dtype != target.dtype:
                bad.append(f"{source.name}: release dtype {stored.dtype} vs model {target.dtype}")
            else:
                pieces.append(
                    Piece(
                        shard,
                        source.name,
                        stored.offset,
                        stored.numel,
                        stored.dtype,
                        target.key,
                        source.start,
                    )
                )
    if bad:
        raise PlanError(f"mis-shaped thinker tensors: {names(sorted(bad))}")
    return sorted(pieces, key=lambda p: (p.shard, p.offset))
