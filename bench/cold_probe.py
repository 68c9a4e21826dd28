"""Why small batches are slow under load: first use of a request shape vs warm (H200 only).

`python3 -m bench.cold_probe --out DIR` builds the full-size engine as `bench.load` does, then for
requests of the load mix measures one `Engine.execute` of a request never seen before ("cold") and the
same request again ("warm"), split into the decoder (`hidden_states`) and the joint head, with each
attention backend switch the head may take. A profile of one cold request goes to `cold_profile.txt`.
Prints JSON lines; asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import random
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from bench.report import emit_line as emit
from bench.timing import synced_ms


@contextlib.contextmanager
def head_backends(variant: str) -> Iterator[None]:
    """`default`, or SDPA restricted so the head's attention cannot take cuDNN."""
    if variant == "default":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        yield


def parts(engine: Any, prepared: Any) -> tuple[float, float]:
    """(decoder ms, head ms) for one record, each timed with synchronisation."""
    model = engine.model
    with torch.inference_mode():
        batch = model.collate([prepared.encoded])
        box: dict[str, torch.Tensor] = {}
        dec = synced_ms(lambda: box.__setitem__("h", model.hidden_states(batch)))
        head = synced_ms(lambda: model.head(box["h"], model.lexical_table(), batch.index))
    return dec, head


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--count", type=int, default=12)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[str] = []

    from bench.load import build, make_pool

    t = time.perf_counter()
    engine = build(False, 32768)
    emit(
        rows,
        kind="info",
        build_s=round(time.perf_counter() - t, 1),
        torch=torch.__version__,
        cudnn_sdp=torch.backends.cuda.cudnn_sdp_enabled(),  # type: ignore[no-untyped-call]
    )
    rng = random.Random(7)
    pool = make_pool(engine, rng, 4 * args.count + 4)
    prepared = [engine.prepare(r) for r in pool]
    for w in prepared[:4]:
        engine.execute([w])
    rest = prepared[4:]
    variants = ("default", "no_cudnn")
    for vi, variant in enumerate(variants):
        chunk = rest[vi * args.count : (vi + 1) * args.count]
        cold, warm, cold_dec, cold_head, warm_dec, warm_head = [], [], [], [], [], []
        with head_backends(variant):
            for prep in chunk:
                run = functools.partial(engine.execute, [prep])
                cold.append(synced_ms(run))
                warm.append(statistics.median(synced_ms(run) for _ in range(3)))
            for prep in rest[2 * args.count + vi * args.count : 2 * args.count + (vi + 1) * args.count]:
                d, h = parts(engine, prep)
                cold_dec.append(d)
                cold_head.append(h)
                d, h = parts(engine, prep)
                warm_dec.append(d)
                warm_head.append(h)
        emit(
            rows,
            kind="cold_vs_warm",
            variant=variant,
            tokens=[pp.num_tokens for pp in chunk],
            cold_ms=[round(x, 2) for x in cold],
            warm_ms=[round(x, 2) for x in warm],
            cold_p50_ms=round(statistics.median(cold), 2),
            warm_p50_ms=round(statistics.median(warm), 2),
            cold_decoder_p50_ms=round(statistics.median(cold_dec), 2),
            warm_decoder_p50_ms=round(statistics.median(warm_dec), 2),
            cold_head_p50_ms=round(statistics.median(cold_head), 2),
            warm_head_p50_ms=round(statistics.median(warm_head), 2),
        )
    from torch.profiler import ProfilerActivity, profile

    fresh = engine.prepare(make_pool(engine, random.Random(99), 1)[0])
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine.execute([fresh])
        torch.cuda.synchronize()
    tables = [
        prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=70)
        for key in ("cpu_time_total", "cuda_time_total")
    ]
    (out / "cold_profile.txt").write_text("\n\n".join(tables))
    print(tables[0][:6000], flush=True)
    (out / "cold_probe.jsonl").write_text("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
