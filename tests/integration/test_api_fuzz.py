"""Fuzzing both public APIs of a real cluster, the short run (issue 18 item 6; the long run is
bench/fuzz_api.py): whatever a client sends, no 5xx / INTERNAL / UNKNOWN, no hang, no process
down, no worker quarantined or charged a failure, and a valid request right after it is served
(`api_fuzz.FuzzTarget` checks all of that after every input). Hypothesis runs derandomized, so a
run is reproducible; schemathesis generates from the schema the router serves at /openapi.json.

The plain values that found bugs are regression cases at the bottom.
"""

from __future__ import annotations

import grpc
import pytest
import schemathesis
from schemathesis import GenerationMode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance, response_headers_conformance, response_schema_conformance,
    status_code_conformance,
)

from api_fuzz import SERVER_FAULTS, VALID_GRPC, FuzzTarget
from api_fuzz_inputs import chat_bodies, completion_bodies, encode_json, generate_requests, mutated_messages, raw_bodies

pytestmark = pytest.mark.integration

SHORT = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                 suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def target(tcp_cluster):
    fuzz = FuzzTarget(tcp_cluster)
    yield fuzz
    fuzz.close()


@SHORT
@given(body=completion_bodies | chat_bodies.map(lambda body: ("chat", body)))
def test_fuzzed_http_json_is_never_a_server_error_and_never_a_worker_s_fault(target, body):
    path, body = ("/v1/chat/completions", body[1]) if isinstance(body, tuple) else ("/v1/completions", body)
    assert target.send_http(path, encode_json(body)) < 500   # and the invariants FuzzTarget checks after it


@settings(SHORT, max_examples=20)
@given(raw=raw_bodies, path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
       content_type=st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded"]))
def test_raw_http_bodies_are_refused_as_the_client_s_error(target, raw, path, content_type):
    assert target.send_http(path, raw, content_type) < 500


@SHORT
@given(request=generate_requests())
def test_fuzzed_grpc_requests_are_never_internal_and_never_a_worker_s_fault(target, request):
    assert target.send_grpc(request) not in SERVER_FAULTS   # and the invariants FuzzTarget checks after it


@settings(SHORT, max_examples=30)
@given(raw=mutated_messages(VALID_GRPC.SerializeToString()))
def test_raw_bytes_as_a_grpc_message_are_never_internal(target, raw):
    assert target.send_grpc(raw) not in SERVER_FAULTS


# ---- schemathesis, over the schema the router serves ------------------------------------------------
OPERATIONS = [("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
              ("GET", "/health"), ("GET", "/metrics"), ("POST", "/tokenize"), ("POST", "/detokenize")]
# positive_data_acceptance is left out on purpose: the schema gives types, vLLM's ranges are checked
# at run time (a schema-valid temperature of 1e30 is a documented 400). negative_data_rejection too:
# the bodies are read as vLLM's server reads them, by pydantic in lax mode, which serves some bodies
# the schema's types do not allow ("temperature": false is 0.0, "n": "2" is 2; a clean-clone CI run
# drew the first); the negative bodies still must get no 5xx and answers the schema documents.
SCHEMA_CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
                 response_schema_conformance]


@pytest.fixture(scope="module")
def served_schema(tcp_cluster):
    return schemathesis.openapi.from_url(f"{tcp_cluster.http_url}/openapi.json")


def test_the_served_schema_has_every_route_fuzzed_here(served_schema):
    assert sorted((op.ok().method.upper(), op.ok().path) for op in served_schema.get_all_operations()) == \
        sorted(OPERATIONS)


@pytest.mark.parametrize("method, path, mode", [(method, path, mode) for method, path in OPERATIONS
                                                for mode in (["positive", "negative"] if method == "POST" else ["positive"])])
def test_every_answer_conforms_to_the_served_openapi_schema(served_schema, target, method, path, mode):
    """schemathesis (pytest plugin aside: its `from_fixture` does not run on pytest 9) over each
    operation: schema-valid inputs and, for the bodies, schema-invalid ones."""
    operation = served_schema[path][method]

    @settings(SHORT, max_examples=12 if method == "POST" else 2)
    @given(case=operation.as_strategy(GenerationMode(mode)))
    def one(case):
        case.call_and_validate(checks=SCHEMA_CHECKS, timeout=target.timeout_s)
        target.check_serving()

    one()


# ---- regressions: the plain values fuzzing found ----------------------------------------------------
@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "\ud800", "max_tokens": 2}),                 # the tokenizer's TypeError: a 500
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi\udfff"}], "max_tokens": 2}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "request_id": "\ud83d"}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "\ude73": 1}),     # echoed in the 400's body: a 500
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "top_k": 2**40}),    # past the workers' int32: a 500
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "seed": 2**64}),     # past int64
])
def test_input_fuzzing_found_is_refused_as_the_client_s_400(target, path, body):
    assert target.send_http(path, encode_json(body)) == 400


@pytest.mark.parametrize("raw", [b"\x0a\xff", b"\xff", VALID_GRPC.SerializeToString()[:-1]])
def test_a_grpc_message_that_does_not_parse_is_invalid_argument(target, raw):
    assert target.send_grpc(raw) == grpc.StatusCode.INVALID_ARGUMENT
