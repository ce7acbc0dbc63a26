"""The decode role: load the prompt's KV from its producer (or compute it), then stream tokens.

The prompt arrives with the first token appended (the prefill worker sampled it), so the engine
computes that one token itself and loads every earlier one; the connector reports how the load
went on the final output, which this handler returns on the last message.
"""

from __future__ import annotations

from kv_transfer.metadata import PullReport
from pdserve.worker.server import engine_queued_s
from pdserve.worker_api import DecodeChunk, DecodeRequest


class DecodeHandler:
    def __init__(self, runtime):
        self.runtime = runtime

    async def decode(self, request: DecodeRequest):
        """`request` was validated at the edge (sampling, the KV handle if any)."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        extra = {"kv_transfer_params": request.kv_handle.to_params()} if request.kv_handle is not None else None
        params = request.sampling.to_vllm(extra_args=extra, output_kind=RequestOutputKind.DELTA)
        prompt = TokensPrompt(prompt_token_ids=list(request.prompt_token_ids))
        async for output in self.runtime.engine.generate(prompt, params, request.request_id):
            completion = output.outputs[0]
            if output.finished:
                yield _final_message(completion, output)
            elif completion.token_ids:
                yield DecodeChunk(token_ids=tuple(completion.token_ids))

    async def release(self, transfer_id: str) -> bool:
        return False  # a decode worker holds no KV for others


def _final_message(completion, output) -> DecodeChunk:
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
    )
