"""The router's cost model from the planner's performance model: what the simulated router places
with, and what `pdserve plan --write-router-config` gives the real one.

`router.policies.placement.CostModel` has simpler forms than `planner.perf_model.PerfModel`; the
mapping, with n = mean prompt tokens, c = mean context of a decoding sequence (n + mean output / 2)
and k = the token budget (chunk size):
- prefill: fixed_s = a + served first-token latency + the prefill worker's CPU per request,
  per_token_s = b + its CPU per prompt token, per_token2_s = c2, the prefill step's coefficients
  and what serving adds: what a client waits for a prompt of at most k tokens alone, as the router
  observes a prefill; a longer one is computed in chunks of k (chunk_tokens = k): each chunk after
  the first pays the step's overhead again (per_chunk_s = a) and its queries over the earlier
  chunks (per_prior_unit_s = e), as `PerfModel.prefill_s(n, k)` says;
- decode step: step_fixed_s = step + served step overhead; step_per_seq_s = per_seq + per context
  token x c + served CPU per token (the context term at the mean context; a knee is not kept; the
  served terms are the profile's line, `ServingCosts.decode_step_s` and `decode_cpu_s_per_token`,
  where the simulator's own steps charge its table by batch);
- KV transfer: transfer_fixed_s = latency + served handoff; transfer_per_token_s = KV bytes per
  token / bandwidth (of the planned transport);
- local_interference_per_decode: what one running decode adds to each of the ceil(n/k) steps of a
  Local prefill of n tokens (its step_per_seq_s), over that prefill's time alone.
"""

from __future__ import annotations

from planner.perf_model import PerfModel
from planner.simulator.config import SimSettings
from router.policies.placement import CostModel


def cost_model_from(model: PerfModel, settings: SimSettings, mean_prompt_tokens: float,
                    mean_output_tokens: float) -> CostModel:
    """The router's CostModel for `model` on `settings` (transport, token budget, KV bytes per
    token, serving costs) at a workload of these mean lengths. Pure; every field >= 0."""
    if not (mean_prompt_tokens >= 1 and mean_output_tokens >= 1):
        raise ValueError(f"mean lengths must be >= 1 token, got prompt {mean_prompt_tokens}, "
                         f"output {mean_output_tokens}")
    p, d, serving = model.prefill, model.decode, settings.serving
    transfer = model.transfer.get(settings.transport)
    if transfer is None:
        raise KeyError(f"transport {settings.transport!r} is not in the profile; measured: {sorted(model.transfer)}")
    context_tokens = mean_prompt_tokens + mean_output_tokens / 2
    step_per_seq_s = d.per_seq_s + d.per_context_token_s * context_tokens + serving.decode_cpu_s_per_token
    prompt_tokens = max(1, round(mean_prompt_tokens))
    chunks = -(-prompt_tokens // settings.token_budget)
    return CostModel(
        fixed_s=p.step_s + serving.first_token_s + serving.prefill_cpu_s_per_request,
        per_token_s=p.per_token_s + serving.prefill_cpu_s_per_prompt_token, per_token2_s=p.per_token2_s,
        step_fixed_s=d.step_s + serving.decode_step_s, step_per_seq_s=step_per_seq_s,
        transfer_fixed_s=transfer.latency_s + serving.handoff_s + serving.idle_join_s,   # a lone handoff's whole
        transfer_per_token_s=settings.kv_bytes_per_token / transfer.bytes_per_s,
        local_interference_per_decode=chunks * step_per_seq_s / model.prefill_s(prompt_tokens, settings.token_budget),
        chunk_tokens=settings.token_budget, per_chunk_s=p.step_s, per_prior_unit_s=p.per_prior_unit_s)
