"""The router's in-process messages. Protobuf and JSON stay at the API edges.

What the router streams back is `pdserve.generation.GenerationChunk`, the class the SDK returns;
what it sends workers is `pdserve.worker_api`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pdserve.sampling import Sampling


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: Sampling
    slo_class: str = ""
    cache_salt: str = ""     # vLLM's prefix-cache salt ("": none), given to every engine of the walk
    repetition_detection: Any = None   # vLLM's RepetitionDetectionParams: checked by the router (`router.output_text`)
