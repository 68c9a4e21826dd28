"""The public Jev conformance suite (`jevcompat test URL`, PyPI jevcompat 0.1.1) against `clef-router serve`
on the tiny release, with auth off and with a key: every MUST and SHOULD it tests passes.

Deliberate exceptions (README, "HTTP API"): `semantics.question-id` and `semantics.question-order` cannot
hold for Clef with real weights (question ids and order are part of the prompt), so their outcome is not
asserted; on the tiny random-weight release they usually pass anyway.

Nothing else is excused: `score.legend` included (its case `score-null-level`, a score level given as null,
is answered `""` as SPEC 2 says), so jevcompat must print `MUST 32/32` in both runs.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

Served = Callable[..., str]

pytestmark = pytest.mark.slow

DELIBERATE = {"semantics.question-id", "semantics.question-order"}
# Only one of the two auth MUSTs applies to a run; the auth SHOULDs need a key.
NOT_APPLICABLE = {
    False: {"auth.bearer", "auth.missing", "auth.invalid"},
    True: {"auth.ignored-when-off"},
}
JEVCOMPAT = str(Path(sys.executable).parent / "jevcompat")


def run_suite(url: str, tmp_path: Path, key: str | None) -> tuple[dict[str, Any], str]:
    report = tmp_path / "jevcompat.json"
    cmd = [JEVCOMPAT, "test", url, "--json", str(report), "--timeout", "60"]
    if key is not None:
        cmd += ["--key", key]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    summary = [line for line in done.stdout.splitlines() if "MUST" in line and "SHOULD" in line]
    return json.loads(report.read_text()), (summary[-1] if summary else done.stdout[-2000:])


@pytest.mark.parametrize("key", [None, "jevcompat-test-key"], ids=["auth-off", "auth-on"])
def test_jevcompat_every_must_and_should_passes(served: Served, tmp_path: Path, key: str | None) -> None:
    url = served(api_key=key)
    report, summary = run_suite(url, tmp_path, key)
    print(f"jevcompat ({'auth on' if key else 'auth off'}): {summary}")
    assert report["aborted"] is None, report["aborted"]
    assert not report["case_errors"], report["case_errors"]
    excused = DELIBERATE | NOT_APPLICABLE[key is not None]
    problems = {
        r["id"]: (r["status"], r["reason"], [f["message"] for f in r["findings"]][:2])
        for r in report["results"]
        if r["id"] not in excused and r["status"] != "pass"
    }
    assert not problems, f"{summary}\n{json.dumps(problems, indent=1, ensure_ascii=False)}"
    must = re.search(r"MUST (\d+)/(\d+)", summary)
    assert must is not None, summary
    assert must.group(1) == must.group(2), summary  # every MUST, the null score level's legend included
    ids = next(r for r in report["results"] if r["id"] == "request.question-ids")
    assert ids["status"] == "pass", ids  # any non-empty question id is accepted (SPEC 2)
