"""Real runs of the OpenAI HTTP target against a real local SSE server (see loadgen_sse_server)."""

import statistics

import pytest
from loadgen_sse_server import BROKEN_TOKENS, FAIL_TOKENS, ITL_S, MODEL, STALL_TOKENS, TTFT_S, SSEServer

from loadgen.metrics import summarize
from loadgen.prompts import PromptSynthesizer
from loadgen.runner import RunConfig, run
from loadgen.targets.openai_http import OpenAICompletionsTarget
from loadgen.workload import RequestSpec


@pytest.fixture
def server():
    with SSEServer() as running:
        yield running


async def _run(url, specs, config, model=None):
    target = OpenAICompletionsTarget(url, model=model)
    await target.open()
    try:
        return await run(target, specs, PromptSynthesizer(seed=1), config)
    finally:
        await target.close()


async def test_every_request_is_accounted_for_including_errors_and_timeouts(server):
    outputs = [5, FAIL_TOKENS, STALL_TOKENS, BROKEN_TOKENS, 8, 1, 6, 4]
    specs = [RequestSpec(0.02 * i, 20 + i, out) for i, out in enumerate(outputs)]
    result = await _run(server.url + "/v1", specs, RunConfig(warmup_requests=2, request_timeout_s=0.5))

    assert [r.status for r in result.records] == ["ok", "error", "timeout", "error", "ok", "ok", "ok", "ok"]
    assert result.records[1].error == "TargetError: HTTP 500: injected failure"
    assert result.records[3].error == "TargetError: stream error: injected stream error"
    assert result.records[2].error == "no complete response within 0.5 s"
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


async def test_requests_ask_for_exact_lengths_with_token_id_prompts(server):
    await _run(server.url, [RequestSpec(0.0, 12, 3)], RunConfig())
    (body,) = server.state.received
    assert body["model"] == MODEL  # discovered through GET /v1/models
    assert len(body["prompt"]) == 12 and all(isinstance(t, int) for t in body["prompt"])
    assert (body["max_tokens"], body["min_tokens"], body["ignore_eos"]) == (3, 3, True)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


async def test_fixed_concurrency_keeps_exactly_n_requests_in_flight(server):
    specs = [RequestSpec(0.0, 8, 10) for _ in range(9)]
    result = await _run(server.url, specs, RunConfig(mode="concurrency", max_concurrency=3))
    assert [r.status for r in result.records] == ["ok"] * 9
    assert server.state.max_in_flight == 3


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
