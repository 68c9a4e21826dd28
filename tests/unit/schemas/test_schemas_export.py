"""JSON Schema export and the package's public names."""

from __future__ import annotations

import json

import schemas
from schemas.export import json_schemas


def test_json_schemas_are_serialisable_and_complete() -> None:
    exported = json_schemas()
    assert set(exported) == {"request", "response", "decision"}
    json.dumps(exported)
    request = exported["request"]
    assert set(request["required"]) == {"state", "questions"}
    questions = request["properties"]["questions"]
    assert (questions["minProperties"], questions["maxProperties"]) == (1, 64)
    assert questions["propertyNames"] == {"minLength": 1, "maxLength": 100}
    images = request["properties"]["images"]["anyOf"][0]
    assert images["items"]["type"] == "string"
    assert images["maxItems"] == 4
    score = request["$defs"]["ScoreQuestion"]["properties"]["criteria"]
    assert (score["type"], score["minItems"], score["maxItems"]) == ("array", 2, 10)
    response = exported["response"]
    assert set(response["required"]) == {"model", "answers", "usage"}
    assert set(response["$defs"]["ChoiceAnswer"]["required"]) == {
        "type",
        "choice",
        "confidence",
        "probabilities",
    }


def test_public_names() -> None:
    for name in (
        "SystemOneRequest", "NoulQuestion", "ChoiceQuestion", "ScoreQuestion", "Question", "Option",
        "option_table", "build_response", "parse_request", "RequestError", "DlqReason", "dlq_headers",
        "DefaultSchema", "to_request", "RoutedDecision", "decision_headers", "SystemOneResponse",
    ):  # fmt: skip
        assert hasattr(schemas, name), name
        assert name in schemas.__all__
