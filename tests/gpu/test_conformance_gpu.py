"""GPU: the conformance fixture's cases in bf16 on CUDA, text through the fast path, against the reference.

The reference answers (tests/conformance) were computed in float32 on CPU; this prints the max |dp| per case
that bf16 with the engine's own decoder (`engine/model/decoder.py`, CUDA graphs) gives, for BENCHMARKS.md:
    python -m pytest -m gpu tests/gpu/test_conformance_gpu.py -s
(CLEF_CONFORMANCE_REPORT=path also writes the outcomes as JSON.) Text cases must take the fast path; image
cases take the transformers path; audio and video cases run only where PyAV is installed. Token ids must match
exactly; probabilities within `BF16_TOLERANCE` (CPU bf16 on the same cases differs by up to about 4e-3).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))
from conformance_support import RELEASE, Case, Outcome, as_json, format_table, load_cases, run_case

from engine.runner import Engine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

BF16_TOLERANCE = 2e-2
"""Per raw probability against the float32 reference (about 5x the worst CPU bf16 difference)."""


def _av_works() -> bool:
    """PyAV is importable and real (the bench's placeholder module, `bench.av_placeholder`, has no spec and
    raises on every attribute)."""
    try:
        if importlib.util.find_spec("av") is None:
            return False
    except ValueError:  # a module in sys.modules without a spec: the placeholder
        return False
    import av

    return hasattr(av, "open")


def _runnable(case: Case) -> bool:
    """Audio and video decoding needs PyAV, which the GPU host may lack; text and images always run."""
    return not ({"audio", "videos"} & set(case.media)) or _av_works()


def run_fixture(engine: Engine) -> tuple[list[tuple[Case, Outcome]], list[str]]:
    """Every runnable case alone through `engine` with the bf16 tolerance, and the names left out.

    A request that the reference refuses, or one whose encoding differs, is judged exactly; only the
    probability tolerance is bf16's."""
    ran: list[tuple[Case, Outcome]] = []
    left_out: list[str] = []
    for case in load_cases():
        if not _runnable(case):
            left_out.append(case.name)
            continue
        ran.append((case, run_case(engine, case, tolerance=BF16_TOLERANCE, rounded_tolerance=BF16_TOLERANCE)))
    return ran, left_out


def test_conformance_bf16_fast_path() -> None:
    engine = Engine.from_release(RELEASE, device="cuda", dtype="bfloat16")
    assert engine.model.fast_path, "the text fast path is not available on this GPU/torch"
    assert engine.model.preferred_layout == "packed"  # text batches go to the fast path, not transformers
    ran, left_out = run_fixture(engine)
    outcomes = [o for _, o in ran]
    print()
    print(
        format_table(
            outcomes, f"conformance, CUDA bf16 ({torch.cuda.get_device_name()}), text on the fast path"
        )
    )
    text = [o.max_dp for c, o in ran if not c.media and not math.isnan(o.max_dp)]
    print(f"text cases (fast path): max |dp| {max(text):.2e} over {len(text)} cases")
    media = [o.max_dp for c, o in ran if c.media and not math.isnan(o.max_dp)]
    if media:
        print(f"media cases (transformers path): max |dp| {max(media):.2e} over {len(media)} cases")
    if left_out:
        print(f"left out (no PyAV here): {', '.join(left_out)}")
    report = os.environ.get("CLEF_CONFORMANCE_REPORT")
    if report:
        Path(report).write_text(json.dumps(as_json(outcomes), indent=1) + "\n", encoding="utf-8")
    failing = {o.name: o.problems for o in outcomes if o.problems}
    assert not failing, json.dumps(failing, indent=1, ensure_ascii=False)[:4000]


FP8_TOLERANCE = 5e-2
"""Per raw probability against the float32 reference with FP8 experts (opt-in mode, `engine.kernels.fp8`)."""


def test_conformance_fp8_experts_drift() -> None:
    """FP8 experts on the fixture: text cases (fast path) within `FP8_TOLERANCE` of the reference; prints
    the drift per case, and against bf16 on the same engine, for BENCHMARKS.md."""
    engine = Engine.from_release(RELEASE, device="cuda", dtype="bfloat16")
    text_cases = [c for c in load_cases() if not c.media and not c.refused]
    bf16 = {
        c.name: run_case(engine, c, tolerance=BF16_TOLERANCE, rounded_tolerance=BF16_TOLERANCE)
        for c in text_cases
    }
    assert engine.model.enable_fast_path(graph_buckets=(512, 1024), fp8_experts=True)
    fp8 = {
        c.name: run_case(engine, c, tolerance=FP8_TOLERANCE, rounded_tolerance=FP8_TOLERANCE)
        for c in text_cases
    }
    print()
    print(
        format_table(fp8.values(), f"conformance, FP8 experts ({torch.cuda.get_device_name()}), text cases")
    )
    worst = max(o.max_dp for o in fp8.values() if not math.isnan(o.max_dp))
    worst_bf16 = max(o.max_dp for o in bf16.values() if not math.isnan(o.max_dp))
    print(
        f"FP8 experts vs reference: max |dp| {worst:.2e}; bf16 on the same engine {worst_bf16:.2e}; "
        f"{len(fp8)} cases"
    )
    failing = {o.name: o.problems for o in fp8.values() if o.problems}
    assert not failing, json.dumps(failing, indent=1, ensure_ascii=False)[:4000]
