"""The media cases of the vendor's conformance fixture, run through our media path (no model needed).

For every case with images, audio or videos: our input_ids (media hook + text encoder with the fixture
release's tokenizer) and our media diagnosis in the fixture's terms (`expected.jsonl` field `media`:
tensor shapes, image/video grids, video seconds per grid, use_audio_in_video, audio feature frames,
and the mean of each item's pixel rows / of each audio item's valid feature frames).

The fixture is `tests/conformance/` once vendored, else `shared/conformance/` next to the checkout
(CLEF_CONFORMANCE_DIR overrides both). Run this file to print the per-case table:
`python tests/unit/media/media_conformance.py`.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[4]
MEDIA_KEYS = ("images", "audio", "videos")
MEAN_TOLERANCE = 1e-6
"""Per-item mean pixel value and mean audio feature against the reference's (float32 noise is ~2e-7)."""


def fixture_dir() -> Path | None:
    """Where the conformance fixture is, or None when this checkout has none."""
    override = os.environ.get("CLEF_CONFORMANCE_DIR")
    candidates = [Path(override)] if override else []
    candidates += [ROOT / "tests" / "conformance", ROOT.parent / "shared" / "conformance"]
    candidates += [ROOT.parent.parent / "shared" / "conformance"]
    return next((c for c in candidates if (c / "expected.jsonl").is_file()), None)


@dataclass(frozen=True, slots=True)
class MediaCase:
    name: str
    request: dict[str, Any]
    expected: dict[str, Any]


def media_cases(root: Path) -> list[MediaCase]:
    """The fixture's cases that carry media, in file order."""
    with (root / "cases.jsonl").open(encoding="utf-8") as f:
        cases = [json.loads(line) for line in f if line.strip()]
    with (root / "expected.jsonl").open(encoding="utf-8") as f:
        expected = [json.loads(line) for line in f if line.strip()]
    return [
        MediaCase(c["name"], c["request"], e)
        for c, e in zip(cases, expected, strict=True)
        if any(c["request"].get(k) for k in MEDIA_KEYS)
    ]


def _means(rows: torch.Tensor, grids: torch.Tensor) -> list[float]:
    """Mean value of each item's pixel rows (an item has t*h*w rows)."""
    sizes = [int(n) for n in grids.prod(-1).tolist()]
    return [float(part.double().mean()) for part in rows.split(sizes)]


def diagnosis(inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Our processor tensors described like the fixture's `media` record."""
    out: dict[str, Any] = {"shapes": {}}
    for key, value in inputs.items():
        if key != "use_audio_in_video":
            out["shapes"][key] = list(value.shape)
    if "image_grid_thw" in inputs:
        out["image_grid_thw"] = inputs["image_grid_thw"].tolist()
        out["image_pixel_mean"] = _means(inputs["pixel_values"], inputs["image_grid_thw"])
    if "video_grid_thw" in inputs:
        out["video_grid_thw"] = inputs["video_grid_thw"].tolist()
        out["video_second_per_grid"] = inputs["video_second_per_grid"].tolist()
        out["video_pixel_mean"] = _means(inputs["pixel_values_videos"], inputs["video_grid_thw"])
    out["use_audio_in_video"] = (
        bool(inputs["use_audio_in_video"]) if "use_audio_in_video" in inputs else False
    )
    if "input_features" in inputs:
        frames = [int(n) for n in inputs["feature_attention_mask"].sum(-1).tolist()]
        out["audio_feature_frames"] = frames
        features = inputs["input_features"]  # (audios, mel, F): only each item's valid frames count
        out["audio_feature_mean"] = [
            float(f[:, :n].double().mean()) for f, n in zip(features, frames, strict=True)
        ]
    return out


@dataclass(slots=True)
class Result:
    """One case: token counts, worst mean differences, and every disagreement in words."""

    name: str
    tokens: int = 0
    reference_tokens: int = 0
    pixel_dmean: float = 0.0
    feature_dmean: float = 0.0
    problems: list[str] = field(default_factory=list)


@cache
def _tools(release: Path) -> tuple[Any, Any]:
    from transformers import PreTrainedTokenizerFast

    from engine.media.expand import media_hook
    from engine.media.features import MediaProcessors

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(release))
    return tokenizer, media_hook(tokenizer, MediaProcessors.from_release(release))


def run_case(root: Path, case: MediaCase) -> Result:
    """Our input_ids and media diagnosis for one case against the reference's."""
    from engine.encoding.encode import encode_request
    from schemas.systemone import parse_request

    tokenizer, hook = _tools(root / "release")
    request = parse_request(case.request)
    prepared = hook(request)
    ids = list(encode_request(request, tokenizer, media_tokens=prepared.token_ids).input_ids)
    expected = case.expected
    result = Result(case.name, len(ids), len(expected["input_ids"]))
    if ids != expected["input_ids"]:
        at = next(
            (i for i, (a, b) in enumerate(zip(ids, expected["input_ids"], strict=False)) if a != b), None
        )
        result.problems.append(
            f"input_ids: {len(ids)} vs reference {result.reference_tokens} (first diff at {at})"
        )
    ours, theirs = diagnosis(prepared.model_inputs), expected["media"]
    for key in sorted(set(ours) | set(theirs)):
        mine, ref = ours.get(key), theirs.get(key)
        if key.endswith("_mean") and mine is not None and ref is not None and len(mine) == len(ref):
            worst = max(abs(a - b) for a, b in zip(mine, ref, strict=True))
            if key == "audio_feature_mean":
                result.feature_dmean = max(result.feature_dmean, worst)
            else:
                result.pixel_dmean = max(result.pixel_dmean, worst)
            if not worst <= MEAN_TOLERANCE:
                result.problems.append(f"{key}: {mine} vs reference {ref}")
        elif mine != ref:
            result.problems.append(f"{key}: {mine} vs reference {ref}")
    return result


def format_table(results: list[Result]) -> str:
    lines = [
        f"{'case':36} {'tokens':>7} {'ref':>7} {'max |d mean pixel|':>19} {'max |d mean feature|':>21}  ok"
    ]
    for r in results:
        ok = "yes" if not r.problems else "NO"
        counts = f"{r.tokens:7d} {r.reference_tokens:7d}"
        lines.append(f"{r.name:36} {counts} {r.pixel_dmean:19.2e} {r.feature_dmean:21.2e}  {ok}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    found = fixture_dir()
    if found is None:
        raise SystemExit("no conformance fixture found (set CLEF_CONFORMANCE_DIR)")
    import transformers

    rows = [run_case(found, case) for case in media_cases(found)]
    print(f"media conformance, transformers {transformers.__version__}, fixture {found}")
    print(format_table(rows))
    for row in rows:
        for problem in row.problems:
            print(f"{row.name}: {problem}")
