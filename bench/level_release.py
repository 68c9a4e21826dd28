"""Level the MoE routers of a random-weight release on disk: bench-only, never imported by the product.

A random release (`python -m bench.startup write`) has random router weights, and the hidden states of a
random model share a common direction, so nearly every token picks the same expert in most layers. The
in-process benches level with a router bias (`bench.routing`); a service process loads its release from
disk, and a release has no router bias, so here the router *weights* are changed and written back.

`python -m bench.level_release RELEASE_DIR [--device cuda|cpu] [--passes 4] [--tokens N] [--records R]`

1. Loads the release with the product loader (`load_release_model`) into an `Engine` on `--device` (CUDA:
   bfloat16, the text fast path without CUDA graphs; CPU: float32, transformers' path). Only the thinker
   is read; the talker, code2wav and processor are not.
2. Probe: `R` seeded SystemOne requests of about `N / R` tokens each (`bench.workload.make_request`:
   3 questions, an alert text of operations words), staged by the engine (`Engine.stage`, packed: one
   pass on the fast path, one per record on the CPU). A request is never shorter than its questions
   (about 400 tokens with the tiny release's tokenizer), so a small `N` gives more tokens than asked;
   each pass line reports the tokens run. The defaults (16 x 512) match `bench.routing.probe_batch`.
3. Per pass: one eager forward of the probe records, recording per MoE layer the mean router input m
   (hidden,) and the mean router logit mu (E,); then each router weight W (E, hidden) becomes
   W - outer(mu - mean(mu), m) / |m|^2 in float32, so that W m has equal entries (each expert's mean
   logit equal). Each new W is rounded to the release's stored dtype at once, so the model runs what
   will be written. Layers feed each other, hence several passes.
4. Writes the router tensors (`thinker.model.layers.N.mlp.gate.weight`) back into their shards in place:
   the byte range the safetensors header names, nothing else, after checking dtype and shape; each
   write is read back. A release has no checksum or manifest (the loader checks names, shapes and dtypes
   only), and the index's sizes do not change.

Prints JSON lines: one per pass (`kind` pass, `index` 0 before any change) with the hot expert's load
over the mean load (hot: the layer's most-picked expert, `busiest` in `bench.experts.loads`), max and mean
over layers; one per layer (before, after); and a summary (tensors rewritten, bytes, seconds). Host
memory stays small: the weights are read straight to the device, and only the router tensors (0.5 MB per
layer at full size) come back to the host. The rewrite is not atomic: stopped half way, a release holds
some levelled layers; run it again (levelling a levelled router changes it little). Levelling equalises
mean logits, not loads: what is left of the skew comes from how the logits vary from token to token.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F  # noqa: N812

from bench.av_placeholder import install_av_placeholder

if TYPE_CHECKING:
    from engine.model.release_header import StoredTensor


def emit_line(rows: list[str], **fields: Any) -> None:
    """`bench.report.emit_line` (imported here: `engine` imports only after `main` placed PyAV's
    stand-in where PyAV is missing)."""
    from bench.report import emit_line as emit

    emit(rows, **fields)


@dataclass(frozen=True, slots=True)
class Router:
    """One MoE layer's router weight (E, hidden) as installed in the model and as stored in the release."""

    layer: int
    weight: torch.Tensor
    name: str
    shard: str
    stored: StoredTensor


@dataclass(slots=True)
class RouterStats:
    """Sums over the probe tokens of one layer's router: inputs (hidden,), logits (E,), picks per expert
    (E,) and the token count; filled by `recorded_routers`."""

    inputs: torch.Tensor
    logits: torch.Tensor
    picks: torch.Tensor
    tokens: int = 0

    def add(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, k: int) -> None:
        """Add the router inputs `x` (T, hidden) and the logits the model computes from them."""
        logits = F.linear(x, weight, bias)  # (T, E) in the model's dtype, as the forward computes them
        ids = logits.topk(k, dim=-1).indices  # (T, k): softmax keeps the order
        self.inputs += x.float().sum(dim=0)
        self.logits += logits.float().sum(dim=0)
        self.picks += torch.bincount(ids.reshape(-1), minlength=self.picks.numel()).float()
        self.tokens += x.shape[0]

    @property
    def mean_input(self) -> torch.Tensor:
        return self.inputs / max(self.tokens, 1)  # (hidden,)

    @property
    def mean_logit(self) -> torch.Tensor:
        return self.logits / max(self.tokens, 1)  # (E,)

    @property
    def hot_over_mean(self) -> float:
        """The most-picked expert's picks over the mean picks per expert."""
        mean = float(self.picks.sum()) / self.picks.numel()
        return float(self.picks.max()) / max(mean, 1e-9)


def moe_layers(model: Any) -> list[tuple[int, Any]]:
    """(layer index, MoE block) of every MoE layer of a `ClefOmniModel`'s text decoder."""
    return [
        (i, layer.mlp) for i, layer in enumerate(model.text_model.layers) if hasattr(layer.mlp, "experts")
    ]


@contextmanager
def recorded_routers(model: Any) -> Iterator[dict[int, RouterStats]]:
    """While active, every forward of `model` adds each MoE layer's router inputs to its `RouterStats`
    (by layer index), on the text fast path (`PackedTextDecoder._moe`, wrapped) and on transformers' path
    (a pre-hook on each router module). Eager forwards only: a CUDA graph replay records nothing. Restores
    both on exit."""
    from engine.kernels.fp8 import Quantized
    from engine.model.decoder import PackedTextDecoder

    k = int(model.text_model.config.num_experts_per_tok)
    stats: dict[int, RouterStats] = {}
    gates: dict[int, Any] = {}
    for i, mlp in moe_layers(model):
        w = mlp.gate.weight  # (E, hidden)
        e, hidden = w.shape
        zeros = [torch.zeros(n, dtype=torch.float32, device=w.device) for n in (hidden, e, e)]
        stats[i] = RouterStats(zeros[0], zeros[1], zeros[2])
        gates[i] = mlp.gate

    def record(i: int, x: torch.Tensor) -> None:
        gate = gates[i]
        stats[i].add(x.reshape(-1, x.shape[-1]), gate.weight, getattr(gate, "bias", None), k)

    original = PackedTextDecoder._moe

    def moe(
        self: PackedTextDecoder,
        i: int,
        mlp: Any,
        x: torch.Tensor,
        xq: Quantized | None = None,
        valid: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        record(i, x)
        return original(self, i, mlp, x, xq, valid)

    def hook_for(i: int) -> Callable[[Any, tuple[Any, ...]], None]:
        def hook(module: Any, args: tuple[Any, ...]) -> None:
            record(i, args[0])

        return hook

    handles = [gate.register_forward_pre_hook(hook_for(i)) for i, gate in gates.items()]
    PackedTextDecoder._moe = moe  # type: ignore[method-assign]
    try:
        yield stats
    finally:
        PackedTextDecoder._moe = original  # type: ignore[method-assign]
        for handle in handles:
            handle.remove()


def probe(engine: Any, records: Sequence[Any]) -> dict[int, RouterStats]:
    """Router statistics of every MoE layer over one eager forward of the prepared `records` (each part
    `Engine.stage` makes of them; blocking)."""
    staged = engine.stage(records)
    with torch.inference_mode(), recorded_routers(engine.model) as stats:
        for _, batch in staged.parts:
            engine.model.hidden_states(batch)
    return stats


def level_step(routers: Sequence[Router], stats: dict[int, RouterStats]) -> None:
    """W -= outer(mu - mean(mu), m) / |m|^2 for each router (float32), rounded to the stored dtype."""
    with torch.no_grad():
        for r in routers:
            s = stats[r.layer]
            m, mu = s.mean_input, s.mean_logit  # (hidden,), (E,)
            w = r.weight.float() - torch.outer(mu - mu.mean(), m) / m.dot(m).clamp_min(1e-30)  # (E, hidden)
            r.weight.copy_(w.to(r.stored.dtype))


def find_routers(model: Any, root: Path) -> list[Router]:
    """Every MoE router of the loaded `model` with its release name, shard and stored header entry.

    Raises ValueError when a router is not in the index or its shard, is not floating point, or is stored
    with another shape than the model's."""
    from engine.model.release import read_weight_map
    from engine.model.release_header import read_header
    from engine.model.thinker import checkpoint_names

    thinker = model.thinker
    names = checkpoint_names(thinker)
    key_of = {id(p): key for key, p in thinker.state_dict(keep_vars=True).items()}
    weight_map = read_weight_map(root)
    headers: dict[str, dict[str, StoredTensor]] = {}
    out: list[Router] = []
    for i, mlp in moe_layers(model):
        weight = mlp.gate.weight
        name = names[key_of[id(weight)]]
        shard = weight_map.get(name)
        if shard is None:
            raise ValueError(f"{name}: not in the release index")
        if shard not in headers:
            headers[shard] = read_header(root / shard)
        stored = headers[shard].get(name)
        if stored is None:
            raise ValueError(f"{name}: indexed under {shard} but not in that shard")
        if not stored.dtype.is_floating_point or stored.shape != tuple(weight.shape):
            raise ValueError(
                f"{name}: stored {stored.dtype} {list(stored.shape)}, model {list(weight.shape)}"
            )
        out.append(Router(i, weight, name, shard, stored))
    return out


def stored_bytes(r: Router) -> bytes:
    """The bytes of router `r`'s current weight in its stored dtype (row-major, little-endian as
    safetensors stores them; raises ValueError on a big-endian host or a size that disagrees)."""
    if sys.byteorder != "little":
        raise ValueError("safetensors data is little-endian; this host is not")
    host = r.weight.detach().to("cpu", r.stored.dtype).contiguous()
    data = host.view(-1).view(torch.uint8).numpy().tobytes()
    if len(data) != r.stored.nbytes:
        raise ValueError(f"{r.name}: {len(data)} bytes to write, {r.stored.nbytes} stored")
    return data


def write_routers(root: Path, routers: Sequence[Router]) -> int:
    """Overwrite each router's stored bytes in its shard, in place, and read them back (blocking, fsync per
    shard). Returns the bytes written; raises OSError when a write is short or reads back otherwise."""
    total = 0
    for shard in sorted({r.shard for r in routers}):
        fd = os.open(root / shard, os.O_RDWR)
        try:
            for r in (r for r in routers if r.shard == shard):
                data = stored_bytes(r)
                done = 0
                while done < len(data):
                    n = os.pwrite(fd, data[done:], r.stored.offset + done)
                    if n <= 0:
                        raise OSError(f"{shard}: short write of {r.name}")
                    done += n
                if os.pread(fd, len(data), r.stored.offset) != data:
                    raise OSError(f"{shard}: {r.name} reads back otherwise than written")
                total += len(data)
            os.fsync(fd)
        finally:
            os.close(fd)
    return total


@dataclass(frozen=True, slots=True)
class Levelled:
    """What `level_release` did: per layer the hot/mean load before and after, tensors and bytes written."""

    before: dict[int, float]
    after: dict[int, float]
    tensors: int
    bytes: int
    phases: dict[str, float] = field(default_factory=dict)


def load_engine(root: Path, device: str) -> Any:
    """The release's thinker and head in an `Engine` on `device` (CUDA: bfloat16, fast path, no CUDA
    graphs; CPU: float32), text only, packed layout (blocking)."""
    from engine.model.release import load_release_model
    from engine.runner import DTypeName, Engine, EngineConfig

    dtype: DTypeName = "bfloat16" if device.startswith("cuda") else "float32"
    config = EngineConfig(device=device, dtype=dtype, layout="packed", graph_buckets=())
    loaded = load_release_model(root, device=device, dtype=config.torch_dtype, load_processor=False)
    return Engine(loaded.model, loaded.tokenizer, config)


def probe_records(engine: Any, records: int, tokens: int) -> list[Any]:
    """`records` prepared seeded requests of about `tokens / records` tokens each (`make_request`)."""
    import random

    from bench.workload import make_request

    rng = random.Random(0)
    each = max(16, tokens // max(records, 1))
    return [engine.prepare(make_request(rng, engine, each)) for _ in range(records)]


def _pass_line(rows: list[str], index: int, stats: dict[int, RouterStats]) -> dict[int, float]:
    ratios = {i: s.hot_over_mean for i, s in stats.items()}
    spread = max(float(s.mean_logit.max() - s.mean_logit.min()) for s in stats.values())
    emit_line(
        rows,
        kind="pass",
        index=index,
        hot_over_mean_max=round(max(ratios.values()), 3),
        hot_over_mean_mean=round(statistics.mean(ratios.values()), 3),
        mean_logit_spread_max=round(spread, 5),
        tokens=next(iter(stats.values())).tokens,
    )
    return ratios


def level_release(
    root: str | Path, device: str = "cpu", passes: int = 4, tokens: int = 8192, records: int = 16
) -> Levelled:
    """Level every router of the release at `root` over `passes` passes and rewrite the router tensors in
    place (see the module docstring); prints a JSON line per pass and per layer (blocking: the load, then
    `passes + 1` forwards of the probe). Raises ValueError when a router cannot be matched to its stored
    tensor, before anything is written; whatever the loader raises for a bad release."""
    rows: list[str] = []
    root = Path(root)
    phases: dict[str, float] = {}
    clock = time.monotonic()

    def phase(name: str) -> None:
        nonlocal clock
        now = time.monotonic()
        phases[name] = round(now - clock, 2)
        clock = now

    engine = load_engine(root, device)
    routers = find_routers(engine.model, root)
    if not routers:
        raise ValueError(f"{root}: the thinker has no MoE layer")
    prepared = probe_records(engine, records, tokens)
    phase("load_s")
    stats = probe(engine, prepared)
    before = _pass_line(rows, 0, stats)
    after = before
    for index in range(1, passes + 1):
        level_step(routers, stats)
        stats = probe(engine, prepared)
        after = _pass_line(rows, index, stats)
    phase("level_s")
    for i in sorted(before):
        emit_line(
            rows,
            kind="layer",
            layer=i,
            hot_over_mean_before=round(before[i], 3),
            hot_over_mean_after=round(after[i], 3),
        )
    written = write_routers(root, routers)
    phase("write_s")
    return Levelled(before, after, len(routers), written, phases)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.level_release", description=__doc__.split("\n")[0])
    p.add_argument("release", type=Path, help="release directory, rewritten in place")
    p.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu"
    )
    p.add_argument("--passes", type=int, default=4)
    p.add_argument("--tokens", type=int, default=8192, help="probe tokens in all")
    p.add_argument("--records", type=int, default=16, help="probe requests (each about tokens/records)")
    args = p.parse_args(argv)
    install_av_placeholder()  # the engine imports PyAV; the H200 machine has none (no media here)
    start = time.monotonic()
    done = level_release(args.release, args.device, args.passes, args.tokens, args.records)
    emit_line(
        [],
        kind="written",
        tensors=done.tensors,
        bytes=done.bytes,
        hot_over_mean_max_before=round(max(done.before.values()), 3),
        hot_over_mean_max_after=round(max(done.after.values()), 3),
        **done.phases,
        seconds=round(time.monotonic() - start, 2),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
