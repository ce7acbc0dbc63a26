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


def test_listed_logprob_token_ids_count_as_vllm_s_num_logprobs_and_cross_the_edge():
    listed = Sampling.validated(logprob_token_ids=(5, 7, 5))
    assert (listed.logprobs, listed.num_logprobs) == (None, 3)
    assert (Sampling(logprobs=2).num_logprobs, Sampling().num_logprobs) == (2, None)
    assert Sampling.from_proto(listed.to_proto()) == listed
    assert (listed.to_vllm().logprob_token_ids, Sampling().to_vllm().logprob_token_ids) == ([5, 7, 5], None)


@pytest.mark.parametrize("fields, field, message", [
    ({"logprob_token_ids": (5, 2048)}, "logprob_token_ids",
     "token_id(s) [2048] in logprob_token_ids contain out-of-vocab token ids. Vocabulary size: 2048"),
    ({"logprob_token_ids": (-1,)}, "logprob_token_ids",
     "token_id(s) [-1] in logprob_token_ids contain out-of-vocab token ids. Vocabulary size: 2048"),
    ({"logprob_token_ids": tuple(range(129))}, "logprob_token_ids",
     "Requested logprob_token_ids of length 129, which is greater than max allowed: 128"),
    ({"logprobs": 1, "logprob_token_ids": (3, 4)}, "logprob_token_ids",
     "When both logprobs and logprob_token_ids are set, logprobs must equal len(logprob_token_ids). Got logprobs=1, "
     "len(logprob_token_ids)=2."),
    ({"logprobs": 21}, "logprobs", "Requested sample logprobs of 21, which is greater than max allowed: 20"),
    ({"prompt_logprobs": -1}, "prompt_logprobs",
     "Requested prompt logprobs of 2048, which is greater than max allowed: 20"),
])
def test_what_vllm_checks_against_the_model_is_refused_with_its_message(fields, field, message):
    with pytest.raises(InvalidRequest) as error:
        Sampling.validated(**fields).check_for_model(2048)
    assert (error.value.field, str(error.value)) == (field, message)
