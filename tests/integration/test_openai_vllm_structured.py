"""Structured output across the handoff is one engine's (issue 16 item 1): the prefill engine
samples the first token under the request's grammar, the decode engine's grammar is advanced over
it before it samples (pdserve.grammar_stream), so the cluster's text is the text one vLLM engine
(the session's `reference`) gives under the same constraint, greedy and seeded, streamed and not.
Prompts here are sent by no other test."""

from __future__ import annotations

import pytest

from openai_reference import events, post

pytestmark = pytest.mark.integration

PROMPT = [(i * 29) % 1700 + 120 for i in range(41)]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}}, "required": ["name", "age"],
          "additionalProperties": False}


def _served_text(cluster, body: dict, stream: bool) -> str:
    reply = post(cluster, "/v1/completions", {"prompt": PROMPT, **body, "stream": stream})
    if stream:
        return "".join(choice["text"] for event in events(reply) for choice in event["choices"])
    assert reply.json()["pdserve_timings"]["disaggregated"]  # the first token was the prefill engine's
    return reply.json()["choices"][0]["text"]


@pytest.mark.parametrize("constraint, request_fields", [
    ({"choice": ["alpha beta gamma delta", "epsilon zeta"]}, {"structured_outputs": {"choice": [
        "alpha beta gamma delta", "epsilon zeta"]}}),
    ({"regex": "[a-z]{2,6}( [a-z]{2,6}){3}"}, {"structured_outputs": {"regex": "[a-z]{2,6}( [a-z]{2,6}){3}"}}),
    ({"json": SCHEMA}, {"response_format": {"type": "json_schema", "json_schema": {"name": "person",
                                                                                  "schema": SCHEMA}}}),
], ids=["choice", "regex", "json_schema"])
@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 1.0, "seed": 5}], ids=["greedy", "seeded"])
def test_a_constrained_output_is_vllm_s_across_the_handoff(tcp_cluster, reference, constraint, request_fields,
                                                           sampling):
    sampling = sampling | {"max_tokens": 40}
    expected = reference.answer(PROMPT, **sampling, structured_outputs=constraint)
    if "json" in constraint:   # the tiny model may fill whitespace to max_tokens: the object's start is the grammar's
        assert expected["text"].startswith("{")
    else:
        assert expected["finish_reason"] == "stop"  # the grammar ended it: the case is what it claims
    for stream in (False, True):
        assert _served_text(tcp_cluster, sampling | request_fields, stream) == expected["text"], f"stream={stream}"
