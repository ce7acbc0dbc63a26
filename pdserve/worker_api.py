"""Router <-> worker messages as dataclasses: the inside of `proto/pdserve/v1/worker.proto`.

Both ends speak these; protobuf is converted only at the two edges (`pdserve.worker_proto`, used by
the router's gRPC worker client and by the worker's servicer). The KV handle travels typed
(`kv_transfer.handle.KVHandle`); on the wire it is the JSON string of `KVHandle.encode()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kv_transfer.handle import KVHandle
from pdserve.errors import InvalidRequest
from pdserve.logprobs import SampledLogprobs
from pdserve.sampling import Sampling

StopReason = int | str | None
"""vLLM's `CompletionOutput.stop_reason` when finish_reason is "stop": the stop token id, the stop
string the engine matched, or None (EOS). The router's text needs it: a request that stopped on a
token leaves that token out of the text (vLLM's detokenizer does), one that stopped on a string not."""


@dataclass(frozen=True)
class PrefillRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: Sampling          # the client's; the prefill worker runs it with max_tokens 1
    transfer_id: str            # pdserve's key for the KV handoff (never vLLM's request id)
    cache_salt: str = ""        # vLLM's prefix-cache salt ("": none)


@dataclass(frozen=True)
class PrefillResult:
    """The first token, and the producer's handle when a decode worker should continue.
    Invariant: `kv_handle` is None when `finished` (nobody will pull; the lease is already released)."""

    first_token_id: int
    finished: bool              # the request ended at its first token (eos, stop, max_tokens 1)
    finish_reason: str = ""
    kv_handle: KVHandle | None = None
    engine_s: float = 0.0       # time inside the prefill engine
    num_cached_tokens: int = 0  # prompt tokens served from the prefill engine's prefix cache
    queued_s: float = 0.0       # in the prefill engine's queue (vLLM: queued -> first scheduled)
    stop_reason: StopReason = None
    first_logprobs: SampledLogprobs | None = None        # when sampling.logprobs is set
    prompt_logprobs: tuple[SampledLogprobs, ...] = ()    # when sampling.prompt_logprobs is set: tokens 1..


@dataclass(frozen=True)
class DecodeRequest:
    """A continuation: the engine samples on from `prompt_token_ids`, whose last `num_generated`
    tokens the client already received as output (sampled on earlier engines: the prefill
    worker's first token, a dead decode worker's stream). The decode worker uses that count to
    continue the request's seeded random stream and its penalties exactly (pdserve.sampler_stream).
    Invariant: 0 <= num_generated < len(prompt_token_ids)."""

    request_id: str
    prompt_token_ids: tuple[int, ...]   # the prompt plus every token already sent to the client
    sampling: Sampling                  # max_tokens/min_tokens already reduced by those tokens
    kv_handle: KVHandle | None = None   # None: the decode worker computes the prompt itself
    num_generated: int = 0              # trailing prompt tokens that were output
    cache_salt: str = ""                # vLLM's prefix-cache salt ("": none)

    def __post_init__(self) -> None:
        if not 0 <= self.num_generated < max(1, len(self.prompt_token_ids)):
            raise InvalidRequest(f"num_generated must be in [0, {len(self.prompt_token_ids)}) (the tokens "
                                 f"before it are the prompt), got {self.num_generated}", field="num_generated")

    @property
    def generated_token_ids(self) -> tuple[int, ...]:
        return self.prompt_token_ids[len(self.prompt_token_ids) - self.num_generated:]


@dataclass(frozen=True)
class DecodeChunk:
    """New tokens of a decode stream. The fields after `finish_reason` are set on the final chunk only."""

    token_ids: tuple[int, ...] = ()
    finished: bool = False
    finish_reason: str = ""
    kv_transfer_bytes: int = 0
    kv_transfer_s: float = 0.0
    kv_transfer_blocks: int = 0
    num_cached_tokens: int = 0     # prompt tokens the engine did not compute (loaded or cached)
    kv_load_error: str = ""        # non-empty when the pull failed and the prompt was recomputed
    kv_loaded_tokens: int = 0      # prompt tokens whose KV was loaded from the producer
    queued_s: float = 0.0          # in the decode engine's queue
    stop_reason: StopReason = None
    logprobs: tuple[SampledLogprobs, ...] = ()         # one per token_ids, when sampling.logprobs is set
    prompt_logprobs: tuple[SampledLogprobs, ...] = ()  # first chunk, when sampling.prompt_logprobs is set
