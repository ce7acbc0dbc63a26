"""vLLM's structured-output fields become one constraint for the workers, as vLLM normalizes them
(`router.openai_structured`): plain values in, the JSON the workers get out, or vLLM's refusal."""

from __future__ import annotations

import json

import pytest

from pdserve.errors import InvalidRequest
from router.openai_structured import check_structured_output_fields, structured_outputs_json

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}


@pytest.mark.parametrize("response_format, structured_outputs, expected", [
    (None, None, None),
    ({"type": "text"}, None, None),
    ({"type": "json_object"}, None, {"json_object": True}),
    ({"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}, None, {"json": SCHEMA}),
    (None, {"regex": "[a-z]+", "whitespace_pattern": " "}, {"regex": "[a-z]+", "whitespace_pattern": " "}),
    ({"type": "json_object"}, {"choice": ["a"]}, "refused"),   # vLLM: the override makes two constraints
    ({"type": "text"}, {"choice": ["a", "b"]}, {"choice": ["a", "b"]}),
])
def test_the_constraint_is_vllm_s_normalization(response_format, structured_outputs, expected):
    if expected == "refused":
        with pytest.raises(InvalidRequest):
            structured_outputs_json(response_format, structured_outputs)
        return
    made = structured_outputs_json(response_format, structured_outputs)
    assert (None if made is None else json.loads(made)) == expected


def test_a_schema_keeps_its_key_order_which_is_its_grammar_s():
    made = structured_outputs_json({"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}, None)
    assert list(json.loads(made)["json"]["properties"]) == ["name", "age"]


@pytest.mark.parametrize("body, field, message", [
    ({"response_format": {"type": "json_schema"}}, "response_format",
     "When response_format type is 'json_schema', the 'json_schema' field must be provided."),
    ({"structured_outputs": {"json": {}, "regex": "a"}}, "structured_outputs",
     "You can only use one kind of constraints for structured outputs ('json', 'regex' or 'choice')."),
])
def test_vllm_s_checks_refuse_with_its_messages(body, field, message):
    with pytest.raises(InvalidRequest) as refused:
        check_structured_output_fields(body)
    assert (refused.value.field, refused.value.message) == (field, message)
