"""The decode role: load the prompt's KV from its producer (or compute it), then stream tokens.

The prompt arrives with the first token appended (the prefill worker sampled it), so the engine
computes that one token itself and loads every earlier one; the connector reports how the load
went on the final output, which this handler returns on the last message.
"""

from __future__ import annotations

import json

from pdserve.sampling import Sampling
from pdserve.v1 import worker_pb2
from pdserve.worker.server import engine_queued_s


class DecodeHandler:
    def __init__(self, runtime):
        self.runtime = runtime

    async def decode(self, request: worker_pb2.DecodeRequest):
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        sampling = Sampling.from_proto(request.sampling)
        extra = {}
        if request.kv_transfer_params_json:
            extra["kv_transfer_params"] = json.loads(request.kv_transfer_params_json)
        params = sampling.to_vllm(extra_args=extra or None, output_kind=RequestOutputKind.DELTA)
        prompt = TokensPrompt(prompt_token_ids=list(request.prompt_token_ids))
        async for output in self.runtime.engine.generate(prompt, params, request.request_id):
            completion = output.outputs[0]
            if output.finished:
                yield _final_message(completion, output)
            elif completion.token_ids:
                yield worker_pb2.DecodeResponse(token_ids=completion.token_ids)

    async def release(self, transfer_id: str) -> bool:
        return False  # a decode worker holds no KV for others


def _final_message(completion, output) -> worker_pb2.DecodeResponse:
    report = output.kv_transfer_params or {}
    return worker_pb2.DecodeResponse(
        token_ids=completion.token_ids,
        finished=True,
        finish_reason=completion.finish_reason or "",
        kv_transfer_bytes=int(report.get("kv_transfer_bytes", 0)),
        kv_transfer_s=float(report.get("kv_transfer_s", 0.0)),
        kv_transfer_blocks=int(report.get("kv_transfer_blocks", 0)),
        kv_loaded_tokens=int(report.get("kv_loaded_tokens", 0)),
        kv_load_error=str(report.get("kv_load_error", "")),
        num_cached_tokens=output.num_cached_tokens or 0,
        queued_s=engine_queued_s(output),
    )
