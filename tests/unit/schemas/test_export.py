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
    # any non-empty string of at most 1,000 characters is an id: no pattern
    assert questions["propertyNames"] == {"minLength": 1, "maxLength": 1000}
    images = request["properties"]["images"]["anyOf"][0]
    assert images["items"]["type"] == "string"
    assert images["maxItems"] == 4
    score = request["$defs"]["ScoreQuestion"]["properties"]["criteria"]
    assert (score["type"], score["minItems"], score["maxItems"]) == ("array", 2, 10)
    any_json = [{"type": "string"}, {"type": "object"}, {"type": "array"}, {"type": "null"}]
    assert score["items"]["anyOf"] == any_json
    noul = request["$defs"]["NoulCriteria"]["properties"]
    assert noul["true"]["anyOf"] == any_json
    assert "default" not in noul["true"]  # absent keeps the default text, null drops it
    response = exported["response"]
    assert set(response["required"]) == {"model", "answers", "usage"}
    assert set(response["$defs"]["ChoiceAnswer"]["required"]) == {
        "type",
        "choice",
        "confidence",
        "probabilities",
    }
    legend = response["$defs"]["ScoreAnswer"]["properties"]["legend"]
    assert legend["type"] == "object"
    # values as given, never turned into text; never null (a null level is answered "", SPEC 2)
    never_null = [{"type": "string"}, {"type": "object"}, {"type": "array"}]
    assert legend["additionalProperties"]["anyOf"] == never_null


def test_public_names() -> None:
    for name in (
        "SystemOneRequest", "NoulQuestion", "ChoiceQuestion", "ScoreQuestion", "Question", "Option",
        "option_table", "build_response", "parse_request", "RequestError", "DlqReason", "dlq_headers",
        "DefaultSchema", "to_request", "RoutedDecision", "decision_headers", "SystemOneResponse",
    ):  # fmt: skip
        assert hasattr(schemas, name), name
        assert name in schemas.__all__
