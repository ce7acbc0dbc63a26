"""Targets the load generator can measure; each is an adapter behind `loadgen.targets.base.Target`.

- `openai_http.OpenAICompletionsTarget`: any OpenAI-compatible server (vLLM's own, pdserve's router)
  through streaming `/v1/completions`.
- `pdserve_grpc.PdserveGrpcTarget`: pdserve's gRPC API through the SDK (`pdserve.client.AsyncClient`).
"""

from loadgen.targets.base import Delta, PhaseTimings, Target, TargetError

__all__ = ["Delta", "PhaseTimings", "Target", "TargetError"]
