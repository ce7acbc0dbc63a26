"""The load generator against real servers: vLLM's own OpenAI server and a pdserve cluster (1
prefill + 1 decode, tcp), both on the tiny model. Every request sent is accounted for, failures
included: a prompt longer than the context is rejected (an error) and a run whose timeout no
request can meet times out entirely. pdserve's records carry the per-phase breakdown. vLLM's
server also takes the text prompts of exact token length and chat completions the OpenAI
target sends for strict servers.

One server at a time (2 shared cores): each fixture serves one test and stops after it.
"""

from __future__ import annotations

import asyncio

import pytest

from cluster_helpers import engine_settings
from loadgen.metrics import summarize
from loadgen.prompts import PromptSynthesizer
from loadgen.runner import RunConfig, RunResult, run
from loadgen.targets.openai_http import OpenAITarget, RequestShape
from loadgen.text_prompts import load_tokenizer
from loadgen.targets.pdserve_grpc import PdserveGrpcTarget
from loadgen.workload import RequestSpec, combine, poisson, uniform_lengths

pytestmark = pytest.mark.integration

NUM_REQUESTS = 12
TOO_LONG_INDEX = 5  # this request's prompt alone exceeds the 2048-token context
PROMPTS = PromptSynthesizer(seed=3)  # ids in [10, 250): inside the tiny model's vocabulary


def workload(max_model_len: int) -> list[RequestSpec]:
    lengths = uniform_lengths(NUM_REQUESTS, prompt_mean=96, output_mean=12, range_ratio=0.5, seed=3)
    lengths[TOO_LONG_INDEX] = (max_model_len + 10, 8)
    return combine(poisson(4.0, NUM_REQUESTS, seed=3), lengths)


def measure(target, specs: list[RequestSpec], config: RunConfig, prompts: PromptSynthesizer = PROMPTS) -> RunResult:
    async def go() -> RunResult:
        await target.open()
        try:
            return await run(target, specs, prompts, config)
        finally:
            await target.close()

    return asyncio.run(go())


def check_accounting(make_target, max_model_len: int) -> RunResult:
    """A run that must partly fail, checked request by request; then a run where all time out."""
    specs = workload(max_model_len)
    result = measure(make_target(), specs, RunConfig(warmup_requests=2, request_timeout_s=120.0))
    statuses = [r.status for r in result.records]
    assert len(result.records) == NUM_REQUESTS and [r.index for r in result.records] == list(range(NUM_REQUESTS))
    assert statuses.count("ok") + statuses.count("error") + statuses.count("timeout") == NUM_REQUESTS
    assert statuses[TOO_LONG_INDEX] == "error" and statuses.count("ok") == NUM_REQUESTS - 1
    ok = [r for r in result.records if r.ok]
    assert [r.output_tokens for r in ok] == [s.output_tokens for i, s in enumerate(specs) if i != TOO_LONG_INDEX]
    assert all(len(r.chunk_times_s) >= 1 and r.ttft_s <= r.e2el_s for r in ok)
    summary = summarize(result.records, result.duration_s)
    assert (summary["completed"], summary["failed"], summary["timed_out"]) == (NUM_REQUESTS - 1, 1, 0)
    assert summary["output_len_mismatches"] == 0

    hopeless = measure(make_target(), specs[:3], RunConfig(request_timeout_s=0.001))
    assert [r.status for r in hopeless.records] == ["timeout"] * 3
    return result


def check_text_and_chat(url: str, tiny_model) -> None:
    """Text completions without vLLM's fields (accepted; outputs may stop early at EOS), then chat
    with them: exact output lengths, at most one content chunk per token after the role-only
    opening chunk (the session's server runs vLLM's hermes tool parser, as the compatibility suite
    needs, and a parser sends no event for a token whose text is still empty: an incomplete UTF-8
    sequence of the tiny model's byte-level tokens)."""
    tokenizer = load_tokenizer(str(tiny_model))
    prompts = PromptSynthesizer(seed=5, token_id_low=0, token_id_high=tokenizer.vocab_size, tokenizer=tokenizer)
    specs = combine(poisson(4.0, 3, seed=5), [(40, 6), (90, 4), (17, 8)])
    plain = measure(OpenAITarget(url, shape=RequestShape(prompt_format="text", vllm_extensions=False)),
                    specs, RunConfig(request_timeout_s=120.0), prompts)
    assert [r.status for r in plain.records] == ["ok"] * 3 and plain.backend == "openai"
    assert [r.prompt_tokens for r in plain.records] == [40, 90, 17]
    assert all(1 <= r.output_tokens <= s.output_tokens for r, s in zip(plain.records, specs))  # may stop at EOS
    chat = measure(OpenAITarget(url, shape=RequestShape(endpoint="chat", prompt_format="text")),
                   specs, RunConfig(request_timeout_s=120.0), prompts)
    assert [r.status for r in chat.records] == ["ok"] * 3 and chat.backend == "openai-chat"
    assert [r.output_tokens for r in chat.records] == [6, 4, 8]  # min_tokens + ignore_eos: exact
    assert all(1 <= len(r.chunk_times_s) <= r.output_tokens for r in chat.records)
    assert all(list(r.chunk_times_s) == sorted(r.chunk_times_s) for r in chat.records)


def test_vllm_openai_server_run_accounts_for_every_request(vllm_openai_server, tiny_model):
    result = check_accounting(lambda: OpenAITarget(vllm_openai_server.url),
                              engine_settings(tiny_model).max_model_len)
    assert result.records[TOO_LONG_INDEX].error.startswith("TargetError: HTTP 400")
    assert all(r.phases is None for r in result.records)  # vLLM reports no phases
    check_text_and_chat(vllm_openai_server.url, tiny_model)


def test_pdserve_run_accounts_for_every_request_and_carries_phase_timings(tcp_cluster, tiny_model):
    """On the session's tcp cluster: this module's prompts (PROMPTS' seed) are its own, so none is
    a prefix another module's requests left cached."""
    result = check_accounting(lambda: PdserveGrpcTarget(tcp_cluster.grpc_target),
                              engine_settings(tiny_model).max_model_len)
    error = result.records[TOO_LONG_INDEX].error
    assert error.startswith("TargetError: invalid_request_error:") and "2058" in error
    ok = [r for r in result.records if r.ok]
    assert all(r.phases is not None and r.phases.disaggregated for r in ok)
    assert all(r.phases.prefill_s > 0 and r.phases.decode_s > 0 and r.phases.kv_transfer_bytes > 0 for r in ok)
    summary = summarize(result.records, result.duration_s)
    assert summary["disaggregated_requests"] == NUM_REQUESTS - 1 and summary["mean_prefill_ms"] > 0
    # the server's view and the client's agree: prefill ends before the client sees the first token
    assert all(r.phases.queued_s + r.phases.prefill_s <= r.ttft_s for r in ok)
