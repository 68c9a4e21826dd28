"""Print the conformance test's per-case max |dp| table at the end of the run (and write it as JSON when
CLEF_CONFORMANCE_REPORT names a file)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    module = sys.modules.get("test_conformance")
    outcomes = getattr(module, "OUTCOMES", None)
    if not outcomes:
        return
    import transformers
    from conformance_support import format_table

    title = f"conformance, CPU float32, transformers {transformers.__version__}"
    terminalreporter.write_line(format_table(outcomes.values(), title))
    report = os.environ.get("CLEF_CONFORMANCE_REPORT")
    if report:
        module.write_report(Path(report))  # type: ignore[union-attr]
