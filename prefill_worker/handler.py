"""The prefill role: run the prompt, return its first token and the KV handle for a decode worker.

The engine is a KV producer: when the one-token request finishes, the connector keeps the prompt's
blocks under a lease and returns `kv_transfer_params` naming them. If the request is already over
at its first token (EOS, a stop string, or max_tokens 1), nobody will pull: the lease is released
here at once, so the blocks are freed now rather than at lease expiry.
"""

from __future__ import annotations

import asyncio
import time

from kv_transfer.consumer import release_transfer
from kv_transfer.handle import KVHandle, producer_params
from kv_transfer.wire import TransferError
from pdserve.engine import tokens_prompt
from pdserve.logprobs import rows_from_vllm
from pdserve.worker.server import engine_queued_s
from pdserve.worker_api import PrefillRequest, PrefillResult


class PrefillHandler:
    def __init__(self, runtime):
        self.runtime = runtime
        self._releasing: set[asyncio.Task] = set()

    async def prefill(self, request: PrefillRequest) -> PrefillResult:
        """`request` was validated at the edge (sampling, a non-empty transfer_id)."""
        sampling = request.sampling
        kv_params = producer_params(request.transfer_id)
        params = sampling.with_max_tokens(1).to_vllm(extra_args={"kv_transfer_params": kv_params})
        started = time.perf_counter()
        final = None
        async for output in self.runtime.engine.generate(
            tokens_prompt(request.prompt_token_ids, request.cache_salt), params, request.request_id
        ):
            final = output
        completion = final.outputs[0]
        stopped = completion.finish_reason == "stop" or sampling.max_tokens == 1
        handle = KVHandle.from_params(final.kv_transfer_params) if final.kv_transfer_params else None
        if stopped and handle is not None:
            self._release_after_reply(request.transfer_id)
            handle = None
        return PrefillResult(
            first_token_id=completion.token_ids[0],
            finished=stopped,
            finish_reason=completion.finish_reason or "",
            kv_handle=handle,
            engine_s=time.perf_counter() - started,
            num_cached_tokens=final.num_cached_tokens or 0,
            queued_s=engine_queued_s(final),
            stop_reason=completion.stop_reason,
            first_logprobs=next(iter(rows_from_vllm(completion.logprobs, sampling.num_logprobs,
                                                     sampling.logprob_token_ids)), None),
            prompt_logprobs=rows_from_vllm(final.prompt_logprobs, sampling.prompt_logprobs),
        )

    def _release_after_reply(self, transfer_id: str) -> None:
        """Frees a finished request's KV off the reply's path (the client is waiting for its token)."""
        task = asyncio.create_task(self.release(transfer_id))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def release(self, transfer_id: str) -> bool:
        """Frees the KV this worker holds for `transfer_id` (no-op if already released)."""
        try:
            return await asyncio.to_thread(release_transfer, self.runtime.kv_address, transfer_id)
        except (TransferError, OSError):
            return False  # the lease expires on its own
