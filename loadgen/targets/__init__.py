"""Targets the load generator can measure; each is an adapter behind `loadgen.targets.base.Target`.

- `openai_http.OpenAITarget`: any OpenAI-compatible server (vLLM's own, pdserve's router) through
  streaming `/v1/completions` or `/v1/chat/completions`.
- `pdserve_grpc.PdserveGrpcTarget`: pdserve's gRPC API through the SDK (`pdserve.client.AsyncClient`).
- `round_robin.RoundRobinTarget`: several servers measured as one, requests dealt in turn.
"""

from loadgen.targets.base import Delta, PhaseTimings, Target, TargetError

__all__ = ["Delta", "PhaseTimings", "Target", "TargetError"]
