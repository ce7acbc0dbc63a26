"""The unit a client receives: one chunk of a request's stream. Made by the router's lifecycle,
sent by its gRPC and HTTP edges, rebuilt by the SDK (`pdserve.client`): the same class on both sides."""

from __future__ import annotations

from dataclasses import dataclass, field

from pdserve.logprobs import PositionLogprobs
from pdserve.timings import Timings


@dataclass
class GenerationChunk:
    """New tokens for the client. Invariant: a request's stream ends with exactly one chunk with
    `finished` set, and only that chunk carries `finish_reason` and `timings`."""

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finished: bool = False
    finish_reason: str = ""
    timings: Timings | None = None
    stop_reason: int | str | None = None  # finish_reason "stop": the stop string, stop token id, or None (EOS)
    logprobs: list[PositionLogprobs] = field(default_factory=list)  # one per token_ids when sampling.logprobs is set
    prompt_logprobs: list[PositionLogprobs] | None = None  # first chunk, when sampling.prompt_logprobs is set
