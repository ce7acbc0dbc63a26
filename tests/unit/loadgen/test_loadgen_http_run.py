"""Real runs of the OpenAI HTTP target against a real local SSE server (see loadgen_sse_server):
accounting, exact request bodies per request shape, concurrency and its client-side queue."""

import statistics

import pytest
from loadgen_sse_server import BROKEN_TOKENS, FAIL_TOKENS, ITL_S, MODEL, STALL_TOKENS, TTFT_S, SSEServer

from loadgen.metrics import summarize
from loadgen.prompts import PromptSynthesizer
from loadgen.runner import RunConfig, run
from loadgen.targets.openai_http import OpenAITarget, RequestShape
from loadgen.targets.round_robin import RoundRobinTarget
from loadgen.text_prompts import load_tokenizer
from loadgen.workload import RequestSpec

STANDARD_STREAMING = {"temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}


@pytest.fixture
def server():
    with SSEServer() as running:
        yield running


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return load_tokenizer(str(tiny_model))


async def _run(url_or_target, specs, config, model=None, prompts=PromptSynthesizer(seed=1)):
    target = OpenAITarget(url_or_target, model=model) if isinstance(url_or_target, str) else url_or_target
    await target.open()
    try:
        return await run(target, specs, prompts, config)
    finally:
        await target.close()


async def test_every_request_is_accounted_for_including_errors_and_timeouts(server):
    outputs = [5, FAIL_TOKENS, STALL_TOKENS, BROKEN_TOKENS, 8, 1, 6, 4]
    specs = [RequestSpec(0.02 * i, 20 + i, out) for i, out in enumerate(outputs)]
    result = await _run(server.url + "/v1", specs, RunConfig(warmup_requests=2, request_timeout_s=2.0))
    # the timeout sits far above the ~0.12 s an ok request takes (CI once stalled one past 0.5 s)
    # and far below the 5 s stall

    assert [r.status for r in result.records] == ["ok", "error", "timeout", "error", "ok", "ok", "ok", "ok"]
    assert result.records[1].error == "TargetError: HTTP 500: injected failure"
    assert result.records[3].error == "TargetError: stream error: injected stream error"
    assert result.records[2].error == "no complete response within 2 s"
    ok = [r for r in result.records if r.ok]
    assert [r.output_tokens for r in ok] == [5, 8, 1, 6, 4]
    assert [len(r.itls_s) for r in ok] == [4, 7, 0, 5, 3]
    assert all(r.ttft_s >= TTFT_S for r in ok)
    assert statistics.median(g for r in ok for g in r.itls_s) == pytest.approx(ITL_S, abs=0.008)
    # open loop: never early, and not serialized behind the 5 s stall (generous bound: shared, noisy machine)
    assert all(r.scheduled_s - 0.005 <= r.sent_s < r.scheduled_s + 1.0 for r in result.records)

    summary = summarize(result.records, result.duration_s)
    assert (summary["completed"], summary["failed"], summary["timed_out"]) == (5, 3, 1)
    assert [r.status for r in result.warmup] == ["ok", "error"]  # warm-up uses the first lengths; failures kept
    assert len(server.state.received) == 2 + 8  # warm-up requests were sent but are not counted


async def test_default_requests_send_token_ids_and_vllms_exact_length_fields(server):
    spec = RequestSpec(0.0, 12, 3)
    await _run(server.url, [spec], RunConfig())
    (body,) = server.state.received
    ids = list(PromptSynthesizer(seed=1).prompt(spec, 0).token_ids)
    assert len(ids) == 12
    assert body == {"model": MODEL, "prompt": ids, "max_tokens": 3, **STANDARD_STREAMING,  # model: GET /v1/models
                    "min_tokens": 3, "ignore_eos": True}


async def test_text_prompts_without_vllm_extensions_send_only_openai_fields(server, tokenizer):
    spec = RequestSpec(0.0, 40, 3)
    prompts = PromptSynthesizer(seed=1, tokenizer=tokenizer)
    shape = RequestShape(prompt_format="text", vllm_extensions=False)
    result = await _run(OpenAITarget(server.url, shape=shape), [spec], RunConfig(), prompts=prompts)
    (body,) = server.state.received
    text = prompts.prompt(spec, 0).text
    assert body == {"model": MODEL, "prompt": text, "max_tokens": 3, **STANDARD_STREAMING}
    assert len(tokenizer.encode(text, add_special_tokens=False)) == 40 == result.records[0].prompt_tokens
    assert result.backend == "openai" and result.records[0].output_tokens == 3


@pytest.mark.parametrize("extensions", [False, True])
async def test_chat_sends_one_user_message_and_times_content_chunks_only(server, tokenizer, extensions):
    spec = RequestSpec(0.0, 24, 4)
    prompts = PromptSynthesizer(seed=1, tokenizer=tokenizer)
    shape = RequestShape(endpoint="chat", prompt_format="text", vllm_extensions=extensions)
    result = await _run(OpenAITarget(server.url, shape=shape), [spec], RunConfig(), prompts=prompts)
    (body,) = server.state.received
    expected = {"model": MODEL, "messages": [{"role": "user", "content": prompts.prompt(spec, 0).text}],
                "max_completion_tokens": 4, **STANDARD_STREAMING}
    assert body == (expected | {"min_tokens": 4, "ignore_eos": True} if extensions else expected)
    (record,) = result.records
    assert result.backend == "openai-chat" and record.ok and record.output_tokens == 4
    assert len(record.chunk_times_s) == 4  # the opening role-only chunk carries no token
    assert record.ttft_s >= TTFT_S


def test_chat_needs_text_prompts():
    with pytest.raises(ValueError, match="use prompt format 'text'"):
        RequestShape(endpoint="chat", prompt_format="token-ids")


async def test_a_text_target_fails_requests_whose_prompts_have_no_text(server):
    shape = RequestShape(prompt_format="text")
    result = await _run(OpenAITarget(server.url, shape=shape), [RequestSpec(0.0, 8, 2)], RunConfig())
    assert [r.error for r in result.records] == [
        "TargetError: no text: text prompts need prompts built with a tokenizer (--tokenizer)"]
    assert server.state.received == []


async def test_round_robin_deals_requests_to_its_servers_in_turn(server):
    with SSEServer() as other:
        target = RoundRobinTarget([OpenAITarget(server.url), OpenAITarget(other.url)])
        result = await _run(target, [RequestSpec(0.01 * i, 8 + i, 2) for i in range(5)], RunConfig())
        assert [r.status for r in result.records] == ["ok"] * 5
        assert [len(b["prompt"]) for b in server.state.received] == [8, 10, 12]
        assert [len(b["prompt"]) for b in other.state.received] == [9, 11]
        assert result.backend == "round-robin(2 x openai)"


async def test_fixed_concurrency_keeps_exactly_n_requests_in_flight(server):
    specs = [RequestSpec(0.0, 8, 10) for _ in range(9)]
    result = await _run(server.url, specs, RunConfig(mode="concurrency", max_concurrency=3))
    assert [r.status for r in result.records] == ["ok"] * 9
    assert server.state.max_in_flight == 3
    # closed loop: a request arrives when its slot frees, so it never queues for one
    assert [r.client_queue_s for r in result.records] == [0.0] * 9
    assert all(r.scheduled_s <= r.sent_s for r in result.records)
    assert max(r.scheduled_s for r in result.records[:3]) < 0.05 < min(r.scheduled_s for r in result.records[3:])


async def test_a_concurrency_cap_records_how_long_each_arrival_waited_for_a_slot(server):
    specs = [RequestSpec(0.0, 8, 5), RequestSpec(0.0, 8, 5), RequestSpec(0.0, 8, 5), RequestSpec(1.0, 8, 5)]
    result = await _run(server.url, specs, RunConfig(max_concurrency=1))
    first, second, third, late = result.records
    assert (first.client_queue_s, late.client_queue_s) == (0.0, 0.0)  # a slot was free at their arrival
    assert second.client_queue_s >= first.e2el_s  # waited for the first to finish
    assert third.client_queue_s >= second.client_queue_s + second.e2el_s
    for r in (second, third):  # from the arrival (0) to the send, which follows taking the slot at once
        assert r.client_queue_s == pytest.approx(r.sent_s - r.scheduled_s, abs=0.02)


async def test_duration_mode_stops_sending_and_finishes_in_flight_requests(server):
    config = RunConfig(mode="concurrency", max_concurrency=2, duration_s=0.5)
    result = await _run(server.url, [RequestSpec(0.0, 8, 5), RequestSpec(0.0, 8, 3)], config)
    assert 6 <= len(result.records) <= 16
    assert all(r.ok for r in result.records) and max(r.sent_s for r in result.records) < 0.5
    assert len(server.state.received) == len(result.records)
    assert len({tuple(b["prompt"]) for b in server.state.received}) == len(result.records)  # fresh prompts


async def test_unreachable_server_fails_every_request_visibly():
    specs = [RequestSpec(0.0, 4, 2) for _ in range(3)]
    result = await _run("http://127.0.0.1:9", specs, RunConfig(request_timeout_s=2.0), model="m")
    assert [r.status for r in result.records] == ["error"] * 3
    assert all(r.error.startswith("ConnectError") for r in result.records)


async def test_a_429_is_recorded_as_refused_and_counts_apart_from_errors(server):
    from loadgen.metrics import SLO
    from loadgen.targets.openai_http import retry_after_s
    from loadgen_sse_server import REFUSE_TOKENS

    specs = [RequestSpec(0.0, 20, 4), RequestSpec(0.01, 21, REFUSE_TOKENS), RequestSpec(0.02, 22, FAIL_TOKENS)]
    result = await _run(server.url + "/v1", specs, RunConfig(request_timeout_s=5.0))
    assert [r.status for r in result.records] == ["ok", "refused", "error"]
    assert result.records[1].error == "Refused: HTTP 429: overloaded"
    summary = summarize(result.records, result.duration_s, SLO(ttft_s=5.0))
    assert (summary["completed"], summary["failed"], summary["refused"]) == (1, 2, 1)
    assert summary["slo_attainment"] == pytest.approx(1 / 3)          # a refusal is a miss ...
    assert summary["admitted_slo_attainment"] == pytest.approx(1 / 2)  # ... but not among the admitted
    from loadgen.harness import run_with_progress   # its live counts know every status

    progress = await run_with_progress(OpenAITarget(server.url + "/v1"), specs, PromptSynthesizer(seed=1),
                                       RunConfig(request_timeout_s=5.0), show=False)
    assert [r.status for r in progress.records] == ["ok", "refused", "error"]
    assert (retry_after_s("3"), retry_after_s("Wed, 21 Oct 2026 07:28:00 GMT"), retry_after_s(None)) == (3.0, None, None)


async def test_run_all_ok_returns_a_served_run_and_names_the_first_failure_of_one_that_was_not(server):
    from loadgen.harness import run_all_ok

    served = await run_all_ok(OpenAITarget(server.url + "/v1"), [RequestSpec(0.0, 20, 4), RequestSpec(0.01, 21, 3)],
                              PromptSynthesizer(seed=1))
    assert [r.output_tokens for r in served.records] == [4, 3]
    with pytest.raises(RuntimeError, match="1 of 2 requests failed: TargetError: HTTP 500: injected failure"):
        await run_all_ok(OpenAITarget(server.url + "/v1"), [RequestSpec(0.0, 20, 4), RequestSpec(0.01, 21, FAIL_TOKENS)],
                         PromptSynthesizer(seed=1))
