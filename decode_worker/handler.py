"""The decode role: load the prompt's KV from its producer (or compute it), then stream tokens.

The prompt arrives with the first token appended (the prefill worker sampled it), so the engine
computes that one token itself and loads every earlier one; the connector reports how the load
went on the final output, which this handler returns on the last message. The request says how
many of its prompt tokens were output (`num_generated`): a seeded stream skips that many draws,
presence/frequency penalties count them, bad words look back over them, and a structured output's
grammar is advanced over them (pdserve.grammar_stream), so the continuation samples as one engine
would.
"""

from __future__ import annotations

from kv_transfer.records import PullReport
from pdserve.grammar_stream import GRAMMAR_PREFIX_ARG
from pdserve.engine import tokens_prompt
from pdserve.logprobs import rows_from_vllm
from pdserve.sampler_stream import PRIOR_OUTPUTS_ARG, SKIP_DRAWS_ARG, prior_outputs_needed, skip_draws_needed
from pdserve.worker.server import engine_queued_s
from pdserve.worker_api import DecodeChunk, DecodeRequest


class DecodeHandler:
    def __init__(self, runtime):
        self.runtime = runtime

    async def decode(self, request: DecodeRequest):
        """`request` was validated at the edge (sampling, the KV handle if any)."""
        from vllm.sampling_params import RequestOutputKind

        params = request.sampling.to_vllm(extra_args=continuation_args(request) or None,
                                          output_kind=RequestOutputKind.DELTA)
        prompt = tokens_prompt(request.prompt_token_ids, request.cache_salt)
        sampling = request.sampling
        async for output in self.runtime.engine.generate(prompt, params, request.request_id):
            completion = output.outputs[0]
            logprobs = {"logprobs": rows_from_vllm(completion.logprobs, sampling.num_logprobs,
                                                   sampling.logprob_token_ids),
                        "prompt_logprobs": rows_from_vllm(output.prompt_logprobs, sampling.prompt_logprobs)}
            if output.finished:
                yield _final_message(completion, output, logprobs)
            elif completion.token_ids or logprobs["prompt_logprobs"]:
                yield DecodeChunk(token_ids=tuple(completion.token_ids), **logprobs)

    async def release(self, transfer_id: str) -> bool:
        return False  # a decode worker holds no KV for others


def continuation_args(request: DecodeRequest) -> dict:
    """The engine's extra_args for `request`: the KV handle, and what continues the request's
    sampling exactly (pdserve.sampler_stream), each only when it applies."""
    sampling = request.sampling
    args: dict = {}
    if request.kv_handle is not None:
        args["kv_transfer_params"] = request.kv_handle.to_params()
    skip = skip_draws_needed(sampling.seed, sampling.temperature, request.num_generated)
    if skip:
        args[SKIP_DRAWS_ARG] = skip
    if request.num_generated and prior_outputs_needed(sampling.presence_penalty, sampling.frequency_penalty,
                                                      sampling.bad_words):
        args[PRIOR_OUTPUTS_ARG] = list(request.generated_token_ids)
    if request.num_generated and sampling.structured_outputs_json:
        args[GRAMMAR_PREFIX_ARG] = list(request.generated_token_ids)   # pdserve.grammar_stream
    return args


def _final_message(completion, output, logprobs: dict) -> DecodeChunk:
    report = PullReport.from_params(output.kv_transfer_params)
    return DecodeChunk(
        token_ids=tuple(completion.token_ids),
        finished=True,
        finish_reason=completion.finish_reason or "",
        kv_transfer_bytes=report.num_bytes,
        kv_transfer_s=report.seconds,
        kv_transfer_blocks=report.num_blocks,
        kv_loaded_tokens=report.num_loaded_tokens,
        kv_load_error=report.error,
        num_cached_tokens=output.num_cached_tokens or 0,
        queued_s=engine_queued_s(output),
        stop_reason=completion.stop_reason,
        **logprobs,
    )
