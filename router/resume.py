"""The lifecycle's decisions about decode attempts and the prefill lease: pure, no I/O.

- `resume_plan`: what a decode attempt asks for. Whatever happened before (a prefill that sampled
  the first token, or decode workers that died mid-stream), the client has received `generated`;
  the attempt continues exactly there: prompt = original prompt + `generated`, the budgets
  (max_tokens, min_tokens) reduced by `len(generated)`, so the client's totals are what it asked for;
  `num_generated` tells the decode worker which prompt tokens were output, so a seeded stream and
  the penalties go on as on one engine.
- `KVLease`: the prefill worker's hold on the prompt's KV, as the router sees it. The handle goes to
  the first decode attempt only; once abandoned (a decode attempt failed, or the walk ended before
  a decode finished) later attempts compute the prompt themselves, and the producer is told to
  release it exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from kv_transfer.handle import KVHandle
from pdserve.registry import WorkerRecord
from pdserve.sampling import Sampling
from pdserve.worker_api import DecodeRequest
from router.types import GenerationRequest


def attempt_request_id(request_id: str, attempt: int) -> str:
    """The engine-side id of decode attempt `attempt` (0-based): distinct per attempt, so a late
    abort of a dead attempt never hits the live one."""
    return request_id if attempt == 0 else f"{request_id}-retry{attempt}"


def remaining_sampling(sampling: Sampling, num_generated: int) -> Sampling:
    """The client's sampling with `num_generated` tokens already sent: max_tokens and min_tokens
    both reduced by them (min_tokens never below 0). The prompt's logprobs are asked of the engine
    that computes the prompt first only: once a token was sent, they were sent with it (and a
    continuation's "prompt" holds output tokens). Precondition: num_generated < max_tokens."""
    return replace(sampling, max_tokens=sampling.max_tokens - num_generated,
                   min_tokens=max(0, sampling.min_tokens - num_generated),
                   prompt_logprobs=sampling.prompt_logprobs if num_generated == 0 else None)


def resume_plan(request: GenerationRequest, generated: Sequence[int], attempt: int,
                kv_handle: KVHandle | None) -> DecodeRequest | None:
    """Decode attempt `attempt` for `request` after the client received `generated`; None when the
    client already has max_tokens tokens (nothing is left to decode). `kv_handle` is the producer's
    KV of prompt + first token, or None when the decode worker computes the prompt itself."""
    if len(generated) >= request.sampling.max_tokens:
        return None
    return DecodeRequest(
        request_id=attempt_request_id(request.request_id, attempt),
        prompt_token_ids=tuple(request.prompt_token_ids) + tuple(generated),
        sampling=remaining_sampling(request.sampling, len(generated)),
        kv_handle=kv_handle,
        num_generated=len(generated),
        cache_salt=request.cache_salt,
    )


@dataclass
class KVLease:
    """The KV a prefill worker holds for one request under `transfer_id`. Invariant: `abandon()`
    returns True at most once, so the producer is told to release at most once per request."""

    worker: WorkerRecord
    transfer_id: str
    handle: KVHandle | None     # None: the producer named no blocks (nothing to pull)
    abandoned: bool = False

    def handle_for_next_attempt(self) -> KVHandle | None:
        """The handle while nobody gave up on it; None after `abandon()` (the prompt is recomputed)."""
        return None if self.abandoned else self.handle

    def abandon(self) -> bool:
        """Drops the handle. True the first time only: the caller must then ask the producer to release."""
        if self.abandoned:
            return False
        self.abandoned = True
        return True
