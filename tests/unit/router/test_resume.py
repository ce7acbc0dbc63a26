"""Where a decode attempt resumes and when the prefill lease is given up: pure rules, plain values."""

import pytest

from kv_transfer.handle import KVHandle
from pdserve.errors import InvalidRequest
from pdserve.registry import WorkerRecord
from pdserve.sampling import Sampling
from pdserve.worker_api import DecodeRequest
from router.resume import KVLease, remaining_sampling, resume_plan
from router.types import GenerationRequest

HANDLE = KVHandle("x1", "10.0.0.5:7000", "prefill-0", (4, 5), 4)
PREFILL = WorkerRecord("prefill-a", "prefill", "tiny", "10.0.0.5:50061")


def _request(max_tokens=8, min_tokens=6):
    return GenerationRequest("req-1", [101, 102, 103], Sampling(max_tokens=max_tokens, min_tokens=min_tokens,
                                                                 temperature=0.0))


def test_the_first_decode_after_a_prefill_continues_from_the_first_token_with_the_handle():
    plan = resume_plan(_request(), [7], attempt=0, kv_handle=HANDLE)
    assert plan == DecodeRequest("req-1", (101, 102, 103, 7), Sampling(max_tokens=7, min_tokens=5, temperature=0.0),
                                 HANDLE, num_generated=1)


def test_a_resumed_decode_sends_prompt_plus_every_token_sent_and_reduces_both_budgets():
    plan = resume_plan(_request(), [7, 8, 9, 10], attempt=1, kv_handle=None)
    assert plan == DecodeRequest("req-1-retry1", (101, 102, 103, 7, 8, 9, 10),
                                 Sampling(max_tokens=4, min_tokens=2, temperature=0.0), None, num_generated=4)


def test_a_resumed_decode_keeps_the_requests_cache_salt():
    salted = GenerationRequest("req-1", [101, 102, 103], Sampling(max_tokens=8), cache_salt="tenant-a")
    assert resume_plan(salted, [7, 8], attempt=1, kv_handle=None).cache_salt == "tenant-a"


def test_min_tokens_already_met_becomes_zero():
    assert remaining_sampling(Sampling(max_tokens=8, min_tokens=2), 5) == Sampling(max_tokens=3, min_tokens=0)


def test_a_decode_only_request_starts_from_the_prompt_alone():
    plan = resume_plan(_request(), [], attempt=0, kv_handle=None)
    assert (plan.request_id, plan.prompt_token_ids, plan.sampling.max_tokens, plan.sampling.min_tokens,
            plan.num_generated) == ("req-1", (101, 102, 103), 8, 6, 0)


def test_nothing_is_left_to_decode_once_the_client_has_max_tokens():
    assert resume_plan(_request(max_tokens=3, min_tokens=0), [7, 8, 9], attempt=2, kv_handle=None) is None


def test_a_lease_is_abandoned_once_and_its_handle_is_never_offered_again():
    lease = KVLease(PREFILL, "x1", HANDLE)
    assert lease.handle_for_next_attempt() == HANDLE
    assert lease.abandon() is True      # the caller tells the producer to release
    assert lease.handle_for_next_attempt() is None
    assert lease.abandon() is False     # a second failure, or the walk's end: no second release


def test_a_decode_request_names_the_tokens_that_were_output_and_refuses_a_count_past_the_prompt():
    plan = resume_plan(_request(), [7, 8], attempt=1, kv_handle=None)
    assert plan.generated_token_ids == (7, 8)
    with pytest.raises(InvalidRequest, match="num_generated"):
        DecodeRequest("r", (1, 2), Sampling(), num_generated=2)   # nothing would be left as prompt
    with pytest.raises(InvalidRequest, match="num_generated"):
        DecodeRequest("r", (1, 2), Sampling(), num_generated=-1)


def test_logprobs_go_on_in_every_attempt_and_the_prompt_s_are_asked_of_the_engine_that_computes_it_first():
    request = GenerationRequest("req-1", [101, 102, 103], Sampling(max_tokens=8, logprobs=2, prompt_logprobs=1))
    local = resume_plan(request, [], attempt=0, kv_handle=None)
    after_prefill = resume_plan(request, [7], attempt=0, kv_handle=HANDLE)
    resumed = resume_plan(request, [7, 8], attempt=1, kv_handle=None)
    assert (local.sampling.logprobs, local.sampling.prompt_logprobs) == (2, 1)
    for plan in (after_prefill, resumed):   # the prompt's logprobs went out with the first token
        assert (plan.sampling.logprobs, plan.sampling.prompt_logprobs) == (2, None)
