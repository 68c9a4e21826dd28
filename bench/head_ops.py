"""`python3 -m bench.head_ops`: how many torch operations one call of the joint schema head dispatches, on
this CPU, with a small head (`--width`, random weights) over `bench.head_probe`'s synthetic records.

The head is host-bound on the GPU (about 3.3 ms of host time a lone record against 1.1 ms of GPU time,
BENCHMARKS.md, "Engine, round eleven"): each dispatched operation is host time and, unless it is a view, a
kernel launch. This counts them without a GPU: the top-level `aten::` operations of one call (the profiler's
events whose parent is not an `aten::` one), those that are views apart (no kernel on a GPU), and whether
the probabilities are bit-equal to those saved by an earlier run (`--save` / `--compare`, e.g. of another
tree: `PYTHONPATH=.carry/base`). Prints one JSON line per record count. A benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from bench.head_probe import record
from engine.batching.collate import collate
from engine.model.head import JointHeadConfig, JointSchemaHead

VIEWS = frozenset(
    f"aten::{name}"
    for name in (
        "view",
        "reshape",
        "transpose",
        "slice",
        "select",
        "unsqueeze",
        "squeeze",
        "chunk",
        "split",
        "flatten",
        "expand",
        "expand_as",
        "as_strided",
        "t",
        "permute",
        "detach",
        "alias",
        "dropout",
    )
)
"""Operations that make no kernel on a GPU here (views, and dropout at p = 0 in eval)."""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--records", default="1,4,16")
    p.add_argument("--width", type=int, default=64, help="hidden size and head width (small: counts only)")
    p.add_argument("--save", type=Path, help="write the probabilities here")
    p.add_argument("--compare", type=Path, help="compare the probabilities with those saved here")
    args = p.parse_args()
    torch.manual_seed(0)
    w = args.width
    head = JointSchemaHead(JointHeadConfig(hidden_size=w, width=w, heads=4, feedforward=2 * w)).eval()
    with torch.no_grad():
        for param in head.parameters():
            param.add_(0.05 * torch.randn_like(param))
    table = torch.randn(152_064, w)
    saved = torch.load(args.compare) if args.compare else None
    out: dict[int, torch.Tensor] = {}
    for b in (int(v) for v in args.records.split(",")):
        batch = collate([record(807 - 37 * i) for i in range(b)])
        hidden = torch.randn(batch.num_tokens, w, generator=torch.Generator().manual_seed(b))
        with torch.inference_mode():
            out[b] = head(hidden, table, batch.index)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                head(hidden, table, batch.index)
        top = [
            e.name
            for e in prof.events()
            if e.name.startswith("aten::")
            and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
        ]
        line: dict[str, object] = {
            "records": b,
            "tokens": batch.num_tokens,
            "ops": len(top),
            "non_view_ops": sum(1 for name in top if name not in VIEWS),
        }
        if saved is not None and b in saved:
            line["bit_equal_to_saved"] = bool(torch.equal(saved[b], out[b]))
        print(json.dumps(line))
    if args.save:
        torch.save(out, args.save)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
