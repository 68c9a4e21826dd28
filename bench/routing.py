"""Router set-ups of the full-size random engine: levelled (what a trained router does) or random.

Random router weights do not spread tokens the way a trained router does: the hidden states share a common
direction, so in most layers one expert is picked by nearly every token (15.5x the mean load), which
makes small batches cheaper than the real model's (fewer experts read). Levelling gives every router a
bias so that each expert's mean logit over a probe batch is equal: near-uniform load, the way a trained
router spreads tokens. Service-level benches run levelled unless asked for the random router.

The biases are added before CUDA graphs are captured (a graph reads them in place) and set afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # torch is imported where it is used: `bench.e2e --help` and the stub runs need none
    import torch

Routing = Literal["levelled", "random"]
ROUTINGS: tuple[Routing, ...] = ("levelled", "random")


def router_biases(model: Any) -> list[torch.Tensor]:
    """Give every MoE router of `model` (a `ClefOmniModel`) a zero bias, in place on its device; returns
    the bias tensors in layer order."""
    import torch
    from torch import nn

    out = []
    for layer in model.text_model.layers:
        gate = layer.mlp.gate
        e = gate.weight.shape[0]
        gate.bias = nn.Parameter(torch.zeros(e, dtype=gate.weight.dtype, device=gate.weight.device))
        out.append(gate.bias.data)
    return out


@contextmanager
def recorded_routes() -> Iterator[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Record, per `moe.route_topk` call (eager forwards only), the mean router logit of every expert
    (E,) and the expert ids chosen (T, k)."""
    from engine.kernels import moe

    original = moe.route_topk
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def wrapper(
        logits: torch.Tensor, k: int, normalize: bool, valid: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        w, i = original(logits, k, normalize, valid)
        seen.append((logits.float().mean(dim=0), i.detach().clone()))
        return w, i

    moe.route_topk = wrapper
    try:
        yield seen
    finally:
        moe.route_topk = original


def routes(engine: Any, batch: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(mean logit per expert, chosen ids) of every MoE layer for one eager forward of `batch` (more than
    the largest graph bucket's tokens, so no graph replays it)."""
    import torch

    with torch.inference_mode(), recorded_routes() as seen:
        engine.model.hidden_states(batch)
    return list(seen)


def level(engine: Any, biases: list[torch.Tensor], batch: Any, passes: int = 4) -> None:
    """Set `biases` so that each expert's mean router logit over `batch` is equal (near-uniform load).
    Layers feed each other, hence a few passes."""
    for b in biases:
        b.zero_()
    for _ in range(passes):
        for b, (mean, _) in zip(biases, routes(engine, batch), strict=True):
            b -= (mean - mean.mean()).to(b.dtype)


def load_profiles(engine: Any, batch: Any) -> list[list[int]]:
    """Per MoE layer, how many of `batch`'s tokens picked each expert, over one eager forward (the fast path
    or transformers', `bench.level_release.recorded_routers`): the spread `bench.moe_fp8 --routes` draws its
    tokens from."""
    import torch

    from bench.level_release import recorded_routers

    with torch.inference_mode(), recorded_routers(engine.model) as stats:
        engine.model.hidden_states(batch)
    return [stats[i].picks.round().int().tolist() for i in sorted(stats)]


def probe_batch(engine: Any, records: int = 16, tokens: int = 512) -> Any:
    """A collated batch of `records` requests of about `tokens` tokens (seeded), to level the routers on."""
    import random

    import torch

    from bench.workload import make_request

    rng = random.Random(0)
    probe = [engine.prepare(make_request(rng, engine, tokens)).encoded for _ in range(records)]
    with torch.inference_mode():
        return engine.model.collate(probe)
