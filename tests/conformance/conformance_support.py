"""Run the vendored conformance fixture (this directory, see README.md) through the engine and compare.

Shared by the CPU float32 test (`test_conformance.py`) and the CUDA bf16 test (`tests/gpu/`). The fixture
files are the vendor's exact bytes: `cases.jsonl` (request bodies), `expected.jsonl` (the reference runtime's
token ids, raw probabilities and responses) and `release/` (a tiny random-weight release in the real layout).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.runner import Engine
from schemas.systemone import RequestError, SystemOneRequest, option_table, parse_request

FIXTURE = Path(__file__).resolve().parent
RELEASE = FIXTURE / "release"
PROBABILITY_TOLERANCE = 2e-4
"""Each raw option probability against the reference's (README: float32 on CPU)."""
ROUNDED_TOLERANCE = 1.5e-4
"""A rounded response value (4 decimals) against the reference's raw value (README)."""
MEDIA_KEYS = ("images", "audio", "videos")


@dataclass(frozen=True, slots=True)
class Case:
    """One fixture case: the request body and what the reference runtime answered."""

    name: str
    request: dict[str, Any]
    expected: dict[str, Any]

    @property
    def refused(self) -> bool:
        return self.expected["reference_error"] is not None

    @property
    def media(self) -> tuple[str, ...]:
        """The media kinds the request carries (empty for a text-only case)."""
        return tuple(k for k in MEDIA_KEYS if self.request.get(k))


@dataclass(slots=True)
class Outcome:
    """What one case gave: the largest |dp| over its options (NaN when none were compared) and every
    disagreement with the reference, in words."""

    name: str
    max_dp: float = math.nan
    problems: list[str] = field(default_factory=list)


def load_cases(root: Path = FIXTURE) -> list[Case]:
    """The fixture's cases in file order; raises ValueError when the two files do not pair up."""
    with (root / "cases.jsonl").open(encoding="utf-8") as f:
        cases = [json.loads(line) for line in f if line.strip()]
    with (root / "expected.jsonl").open(encoding="utf-8") as f:
        expected = [json.loads(line) for line in f if line.strip()]
    if [c["name"] for c in cases] != [e["name"] for e in expected]:
        raise ValueError("cases.jsonl and expected.jsonl list different cases")
    return [Case(c["name"], c["request"], e) for c, e in zip(cases, expected, strict=True)]


def first_difference(ours: Sequence[int], theirs: Sequence[int]) -> str:
    """A short description of where two token id lists part (they are assumed to differ)."""
    at = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    where = f"first difference at {at} (ours {ours[at]}, reference {theirs[at]})" if at is not None else ""
    return f"input_ids differ: {len(ours)} tokens vs reference {len(theirs)}; {where or 'one is a prefix'}"


def compare_probabilities(
    request: SystemOneRequest,
    raw: Mapping[str, Sequence[float]],
    expected: Mapping[str, Any],
    tolerance: float = PROBABILITY_TOLERANCE,
) -> tuple[float, list[str]]:
    """(max |dp|, problems) of our raw probabilities (`option_table` order per question) against the
    reference's (keyed by option id), each allowed to differ by `tolerance`."""
    worst = 0.0
    problems: list[str] = []
    if list(raw) != list(expected):
        problems.append(f"question ids {list(raw)} vs reference {list(expected)}")
    for qid, question in request.questions.items():
        theirs = expected.get(qid, {}).get("probabilities", {})
        ours = {opt.id: float(p) for opt, p in zip(option_table(question), raw.get(qid, ()), strict=False)}
        if set(ours) != set(theirs):
            problems.append(f"{qid!r}: options {sorted(ours)} vs reference {sorted(theirs)}")
            continue
        for option, p in ours.items():
            dp = abs(p - float(theirs[option]))
            worst = max(worst, dp) if not math.isnan(dp) else math.inf
            if not dp <= tolerance:
                problems.append(
                    f"{qid!r}/{option!r}: p {p:.7f} vs reference {theirs[option]:.7f} (|dp| {dp:.2e})"
                )
    return worst, problems


def _public_keys(answer: Mapping[str, Any]) -> list[str]:
    return sorted(k for k in answer if not k.startswith("x_"))


def _top_two_close(raw: Mapping[str, float], tolerance: float) -> bool:
    top = sorted(raw.values(), reverse=True)
    return len(top) > 1 and top[0] - top[1] <= tolerance


def expected_legend(reference: Mapping[str, Any]) -> dict[str, Any]:
    """The reference's score legend as we must answer it: every value as the vendor runtime returned it,
    except its `null` for a level given as null, which the wire contract answers as `""` (SPEC 2)."""
    return {level: "" if value is None else value for level, value in reference.items()}


def compare_response(
    body: Mapping[str, Any],
    expected: Mapping[str, Any],
    tolerance: float = PROBABILITY_TOLERANCE,
    rounded_tolerance: float = ROUNDED_TOLERANCE,
) -> list[str]:
    """Problems with our response body against the reference's, on the fields its README lists (the model
    echo, usage, question ids in order, answer types and keys, probability keys in order, choice unless the
    reference's top two are within `tolerance`, rounded values within `rounded_tolerance` of the raw ones, the
    score legend exactly, a reference `null` read as `""`); confidence, rounding details, score and `x_*` are
    not compared."""
    ref = expected["response"]
    raw_answers = expected["answers"]
    problems: list[str] = []
    if body.get("model") != ref["model"]:
        problems.append(f"model {body.get('model')!r} vs reference {ref['model']!r}")
    if body.get("usage") != {"input_tokens": expected["input_tokens"], "output_tokens": 0}:
        problems.append(
            f"usage {body.get('usage')} vs input_tokens {expected['input_tokens']}, output_tokens 0"
        )
    ours, theirs = body.get("answers", {}), ref["answers"]
    if list(ours) != list(theirs):
        return [*problems, f"answer ids {list(ours)} vs reference {list(theirs)}"]
    for qid, ref_answer in theirs.items():
        answer = ours[qid]
        raw = raw_answers[qid]["probabilities"]
        if answer.get("type") != ref_answer["type"] or _public_keys(answer) != _public_keys(ref_answer):
            problems.append(
                f"{qid!r}: answer keys {_public_keys(answer)} vs reference {_public_keys(ref_answer)}"
            )
            continue
        if "probabilities" in ref_answer:
            if list(answer["probabilities"]) != list(ref_answer["probabilities"]):
                problems.append(f"{qid!r}: probability keys {list(answer['probabilities'])} out of order")
            for option, p in answer["probabilities"].items():
                if option in raw and not abs(p - raw[option]) <= rounded_tolerance:
                    problems.append(f"{qid!r}/{option!r}: rounded {p} vs reference raw {raw[option]:.7f}")
        if (
            "choice" in ref_answer
            and answer["choice"] != ref_answer["choice"]
            and not _top_two_close(raw, tolerance)
        ):
            problems.append(f"{qid!r}: choice {answer['choice']!r} vs reference {ref_answer['choice']!r}")
        if "noul" in ref_answer and not abs(answer["noul"] - raw_answers[qid]["noul"]) <= rounded_tolerance:
            problems.append(f"{qid!r}: noul {answer['noul']} vs reference raw {raw_answers[qid]['noul']:.7f}")
        if "legend" in ref_answer:
            wanted = expected_legend(ref_answer["legend"])
            if json.dumps(answer["legend"]) != json.dumps(wanted):
                problems.append(f"{qid!r}: legend {answer['legend']!r} vs reference {wanted!r}")
    return problems


def run_case(
    engine: Engine,
    case: Case,
    tolerance: float = PROBABILITY_TOLERANCE,
    rounded_tolerance: float = ROUNDED_TOLERANCE,
) -> Outcome:
    """Validate, encode, run alone and answer one case with `engine`, comparing every step (blocking).

    Never raises for a disagreement: every one is listed in `Outcome.problems`. A refusal is our
    `RequestError` (a client error with a message); any other exception propagates. The tolerances default
    to the README's float32 ones; a bf16 run passes its own.
    """
    outcome = Outcome(case.name)
    try:
        request = parse_request(case.request)
        prepared = engine.prepare(request)
    except RequestError as error:
        if not case.refused:
            outcome.problems.append(f"refused ({error.reason}: {error.message}); the reference answers")
        elif not (400 <= error.status < 500 and error.message):
            outcome.problems.append(f"refusal without a client error and message: {error.status} {error!r}")
        return outcome
    if case.refused:
        outcome.problems.append(f"answered; the reference refuses ({case.expected['reference_error']})")
        return outcome
    ids = list(prepared.encoded.input_ids)
    if ids != case.expected["input_ids"]:
        outcome.problems.append(first_difference(ids, case.expected["input_ids"]))
    result = engine.run(engine.stage([prepared]))
    raw = {qid: [float(p) for p in probs] for qid, probs in result.probabilities[0].items()}
    outcome.max_dp, problems = compare_probabilities(request, raw, case.expected["answers"], tolerance)
    outcome.problems += problems
    body = json.loads(engine.respond(result)[0].to_json())
    outcome.problems += compare_response(body, case.expected, tolerance, rounded_tolerance)
    return outcome


def format_table(outcomes: Iterable[Outcome], title: str, worst: int = 5) -> str:
    """A plain-text table: every case's max |dp| and status, then the `worst` largest among passing cases."""
    rows = list(outcomes)
    lines = [f"{title}: per-case max |dp| against the reference ({len(rows)} cases)"]
    for o in rows:
        status = "ok" if not o.problems else f"FAIL ({len(o.problems)}): {o.problems[0][:110]}"
        dp = "-" if math.isnan(o.max_dp) else f"{o.max_dp:.2e}"
        lines.append(f"  {o.name:<40} {dp:>9}  {status}")
    passing = sorted(
        (o for o in rows if not o.problems and not math.isnan(o.max_dp)), key=lambda o: -o.max_dp
    )
    lines.append(
        f"worst {worst} passing cases: " + ", ".join(f"{o.name} {o.max_dp:.2e}" for o in passing[:worst])
    )
    failing = [o.name for o in rows if o.problems]
    lines.append(f"failing cases ({len(failing)}): {', '.join(failing) or 'none'}")
    return "\n".join(lines)


def as_json(outcomes: Iterable[Outcome]) -> list[dict[str, Any]]:
    """The outcomes as JSON-ready dicts (max_dp None when nothing was compared)."""
    return [
        {"name": o.name, "max_dp": None if math.isnan(o.max_dp) else o.max_dp, "problems": o.problems}
        for o in outcomes
    ]


def max_abs(values: Iterable[float]) -> float:
    """The largest value (0.0 for none), NaN-aware."""
    arr = np.asarray(list(values), dtype=np.float64)
    return float(np.nanmax(arr)) if arr.size else 0.0
