"""The ways a request can run, and what each is predicted to cost it and its neighbours.

- `Disaggregated(prefill_id, decode_id)`: a prefill worker computes the prompt and streams the first
  token; its KV moves to the decode worker, which generates the rest.
- `Local(decode_id)`: the decode worker computes the prompt itself (the aggregated case), in steps
  it shares with the decodes it is running: they stall while it does.

Approximation, on purpose: the wait behind a worker's queue is `CostModel.queue_s`: its prompts
as prompts of their mean size, each its own prefill (exact for one size; for mixed sizes it misses
the quadratic term's spread), less the time already spent on the first of them (charged in full,
a prompt about to finish cost a request behind it its whole prefill again, and admission refused
long prompts that would have met their SLO). Charging the queue as one prompt of all its tokens, as this did
before, overstated the quadratic term up to k-fold for k queued prompts and refused long prompts a
1P+1D cluster could serve. `OnlinePrefillFit` keeps the coefficients near the measured scale.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from router.policies.placement.cost import CostModel
from router.policies.placement.state import RequestView, WorkerView


@dataclass(frozen=True)
class Disaggregated:
    prefill_id: str
    decode_id: str

    @property
    def key(self) -> tuple[str, str, str]:
        """Orders paths deterministically (ties in the picker go to the smallest key)."""
        return ("disaggregated", self.prefill_id, self.decode_id)

    @property
    def computing_id(self) -> str:
        """The worker that computes the prompt."""
        return self.prefill_id


@dataclass(frozen=True)
class Local:
    decode_id: str

    @property
    def key(self) -> tuple[str, str, str]:
        return ("local", "", self.decode_id)

    @property
    def computing_id(self) -> str:
        return self.decode_id


Path = Disaggregated | Local


@dataclass(frozen=True)
class Prediction:
    """`ttft_s`: arrival at the worker to first token (the router's own queue not included).
    `decode_stall_s`: how long each decode already running on the decode worker waits because of
    this request (0 when none runs). `kv_transfer_s`: the KV move, paid before the second token.
    `decode_step_s`: the decode worker's step once this request has joined its batch.
    `ttft_wait_s`: the part of `ttft_s` spent waiting for the prompts queued ahead (0: none)."""

    ttft_s: float
    decode_stall_s: float
    kv_transfer_s: float
    decode_step_s: float
    ttft_wait_s: float = 0.0


def predict(path: Path, request: RequestView, workers_by_id: Mapping[str, WorkerView], cost: CostModel) -> Prediction:
    """The cost model's prediction for `request` on `path`. Raises KeyError if a worker is missing."""
    decode = workers_by_id[path.decode_id]
    step_s = cost.decode_step_s(decode.running_decodes + 1)
    if isinstance(path, Disaggregated):
        prefill = workers_by_id[path.prefill_id]
        queue_s = cost.queue_s(prefill.queued_prefill_tokens, prefill.queued_prefill_prompts, prefill.head_elapsed_s,
                               prefill.head_tokens)
        ttft_s = queue_s + cost.prefill_s(request.uncached_tokens(prefill))
        return Prediction(ttft_s, 0.0, cost.kv_transfer_s(request.num_prompt_tokens), step_s, ttft_wait_s=queue_s)
    slowdown = cost.local_prefill_slowdown(decode.running_decodes)
    own_prefill_s = cost.prefill_s(request.uncached_tokens(decode)) * slowdown
    queue_s = cost.queue_s(decode.queued_prefill_tokens, decode.queued_prefill_prompts, decode.head_elapsed_s,
                           decode.head_tokens)
    ttft_s = queue_s * slowdown + own_prefill_s + step_s
    stall_s = own_prefill_s if decode.running_decodes > 0 else 0.0
    return Prediction(ttft_s, stall_s, 0.0, step_s, ttft_wait_s=queue_s * slowdown)
