"""The router's in-process messages. Protobuf and JSON stay at the API edges."""

from __future__ import annotations

from dataclasses import dataclass, field

from pdserve.sampling import Sampling
from pdserve.timings import Timings


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: Sampling
    slo_class: str = ""


@dataclass
class Chunk:
    """New tokens for the client; the last chunk of a request has `finished` and `timings`."""

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finished: bool = False
    finish_reason: str = ""
    timings: Timings | None = None
