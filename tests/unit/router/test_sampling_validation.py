"""The router refuses exactly what vLLM's engine would, naming the field (issue 18 item 6)."""

import math

import pytest

from pdserve.errors import InvalidRequest
from pdserve.sampling import Sampling, engine_error_field, is_engine_input_error


@pytest.mark.parametrize("fields, field", [
    ({"temperature": 1e30}, "temperature"),        # the value that quarantined decode workers
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": -0.5}, "temperature"),
    ({"temperature": math.nan}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"max_tokens": 4, "min_tokens": 5}, "min_tokens"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"stop": ("",)}, "stop"),
])
def test_values_vllm_rejects_are_invalid_requests_naming_the_field(fields, field):
    with pytest.raises(InvalidRequest) as error:
        Sampling.validated(**fields)
    assert error.value.field == field


def test_the_edges_of_vllm_s_ranges_are_accepted():
    sampling = Sampling.validated(temperature=2.0, top_p=1.0, top_k=-1, max_tokens=1, min_tokens=1)
    assert (sampling.temperature, sampling.top_k) == (2.0, -1)


def test_vllm_s_validation_error_is_the_client_s_not_the_engine_s():
    from vllm.exceptions import VLLMValidationError

    error = VLLMValidationError("temperature must be in [0, 2], got 1e+30.", parameter="temperature", value=1e30)
    assert is_engine_input_error(error) and engine_error_field(error) == "temperature"
    assert not is_engine_input_error(RuntimeError("EngineCore died"))


def test_vllm_s_fields_cross_the_proto_edge_and_reach_vllm_unchanged():
    sampling = Sampling.validated(presence_penalty=0.5, frequency_penalty=-1.25, repetition_penalty=1.1,
                                  stop=("\n\n",), stop_token_ids=(7, 2), include_stop_str_in_output=True,
                                  skip_special_tokens=False, seed=3)
    assert Sampling.from_proto(sampling.to_proto()) == sampling
    assert Sampling.from_proto(Sampling().to_proto()) == Sampling()  # vLLM's defaults survive the wire
    params = sampling.to_vllm()
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.5, -1.25, 1.1)
    assert (params.stop_token_ids, params.include_stop_str_in_output, params.skip_special_tokens) == ([7, 2], True,
                                                                                                   False)


@pytest.mark.parametrize("stop_reason", [None, 18, "fox"])
def test_the_engine_s_stop_reason_crosses_the_worker_edge(stop_reason):
    from pdserve.worker_api import DecodeChunk, PrefillResult
    from pdserve.worker_proto import (decode_chunk_from_proto, decode_chunk_to_proto, prefill_result_from_proto,
                                      prefill_result_to_proto)

    chunk = DecodeChunk((10, 18), finished=True, finish_reason="stop", stop_reason=stop_reason)
    result = PrefillResult(first_token_id=18, finished=True, finish_reason="stop", stop_reason=stop_reason)
    assert decode_chunk_from_proto(decode_chunk_to_proto(chunk)) == chunk
    assert prefill_result_from_proto(prefill_result_to_proto(result)) == result
