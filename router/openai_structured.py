"""vLLM's structured-output fields of an OpenAI request (`response_format`, `structured_outputs`):
its checks, with its messages, and its normalization into the one constraint the workers get
(`Sampling.structured_outputs_json`; vLLM's own `structured_outputs_from_response_format` makes it).
Pure: plain values in, a JSON string or an `InvalidRequest` out."""

from __future__ import annotations

import dataclasses
import json

from pdserve.errors import InvalidRequest


def check_structured_output_fields(data) -> None:
    """vLLM's `validate_response_format` and `check_structured_outputs_count` on a raw body."""
    if not isinstance(data, dict):
        return
    response_format = data.get("response_format")
    if isinstance(response_format, dict):
        if response_format.get("type") == "json_schema" and response_format.get("json_schema") is None:
            raise InvalidRequest("When response_format type is 'json_schema', the 'json_schema' field must "
                                 "be provided.", field="response_format")
        if response_format.get("type") == "structural_tag":
            _vllm_check(lambda: _structural_tag_check(response_format), "response_format")
    structured = data.get("structured_outputs")
    if isinstance(structured, dict) and sum(structured.get(k) is not None for k in ("json", "regex", "choice")) > 1:
        raise InvalidRequest("You can only use one kind of constraints for structured outputs ('json', 'regex' "
                             "or 'choice').", field="structured_outputs")


def structured_outputs_json(response_format: dict | None, structured_outputs: dict | None) -> str | None:
    """vLLM's constraint for a request (a `response_format` other than text overrides
    `structured_outputs`), as the workers get it: its fields that are set, as JSON in their order
    (a JSON schema's key order is its grammar's: properties are generated in it)."""
    if response_format is None and structured_outputs is None:
        return None
    from pydantic import TypeAdapter
    from vllm.entrypoints.generate.base.protocol import AnyResponseFormat, structured_outputs_from_response_format
    from vllm.sampling_params import StructuredOutputsParams

    parsed_format = None if response_format is None else _vllm_check(
        lambda: TypeAdapter(AnyResponseFormat).validate_python(response_format), "response_format")
    base = None if structured_outputs is None else _vllm_check(
        lambda: StructuredOutputsParams(**structured_outputs), "structured_outputs")
    params = _vllm_check(lambda: structured_outputs_from_response_format(base, parsed_format), "response_format")
    if params is None:
        return None
    fields = {f.name: getattr(params, f.name) for f in dataclasses.fields(params) if f.init}
    return json.dumps({k: v for k, v in fields.items() if v not in (None, False)})


def _structural_tag_check(response_format: dict) -> None:
    from vllm.entrypoints.generate.base.protocol import validate_structural_tag_response_format

    validate_structural_tag_response_format(response_format)


def _vllm_check(build, field: str):
    """`build()`, with vLLM's refusal of the client's input (its validation error, pydantic's, a
    TypeError for an unknown field) as the request's 400 naming `field`."""
    from pdserve.sampling import is_engine_input_error

    try:
        return build()
    except Exception as error:
        if not isinstance(error, TypeError) and not is_engine_input_error(error):
            raise
        raise InvalidRequest(str(error), field=field) from error
