"""Property-based contract test driven by the server's own `/openapi.json` (schemathesis): requests generated
from the documented request schema get no 5xx, and every response matches its documented status, media type
and schema. Bounded for CI: a fixed number of examples per operation, no shrinking deadline."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.api.test_jevcompat import ids_with_spaces_accepted

pytestmark = pytest.mark.slow
Served = Callable[..., str]
EXAMPLES = 30


def test_every_response_matches_the_openapi_document(served: Served) -> None:
    # Driven by hand rather than by schemathesis' pytest plugin, which does not run under pytest 9.
    schema = schemathesis.openapi.from_url(served() + "/openapi.json")
    # Until the schemas accept any non-empty question id (SPEC 2), a generated id with a space or a control
    # character is refused although the document allows it; that one check waits for the fix.
    excluded = [] if ids_with_spaces_accepted() else [positive_data_acceptance]
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.label for op in operations} >= {"POST /v1/systemone", "GET /v1/models", "GET /readyz"}
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
        )
        def check(case: Any) -> None:
            case.call_and_validate(timeout=60, excluded_checks=excluded)

        check()
