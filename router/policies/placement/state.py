"""The live state a placement decision reads, as plain frozen values.

The router's adapter builds these from the registry snapshot, its own in-flight bookkeeping and
the prefix index; nothing here knows where they came from. Every count is a snapshot: a decision
made on it is a prediction, and the adapter must update `queued_prefill_tokens` itself as soon as
it sends a prompt (the registry is up to a heartbeat old).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, ...] = ("prefill", "decode")


@dataclass(frozen=True)
class WorkerView:
    """One worker as the placement sees it.

    `queued_prefill_tokens`: prompt tokens this router sent there that are not prefilled yet (on a
    decode worker: prompts it computes itself, the Local path), in `queued_prefill_prompts` prompts
    (0: not counted; the queue is then charged as one prompt). `cached_prefix_tokens`: how many of
    THIS request's prompt tokens the worker holds in its prefix cache (from the prefix index; a
    per-request value, so a `WorkerView` is built per request). `accepts_local_prefill` only means
    something on a decode worker. `head_elapsed_s`: how long the worker has been computing the
    first of those queued prompts, by the router's books (since it was sent to an idle worker, or
    since the prompt before it came back), of `head_tokens` tokens (0: not known): the queue is
    charged what is left of it (`CostModel.queue_s`)."""

    worker_id: str
    role: Role
    accepts_local_prefill: bool
    queued_prefill_tokens: int
    running_decodes: int
    kv_blocks_free: int
    block_size: int
    cached_prefix_tokens: int = 0
    queued_prefill_prompts: int = 0
    head_elapsed_s: float = 0.0
    head_tokens: int = 0

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"worker {self.worker_id}: role must be one of {ROLES}, got {self.role!r}")
        if self.block_size < 1:
            raise ValueError(f"worker {self.worker_id}: block_size must be >= 1 token, got {self.block_size}")
        for name in ("queued_prefill_tokens", "running_decodes", "kv_blocks_free", "cached_prefix_tokens",
                     "queued_prefill_prompts", "head_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"worker {self.worker_id}: {name} must be >= 0, got {getattr(self, name)}")
        if not self.head_elapsed_s >= 0:
            raise ValueError(f"worker {self.worker_id}: head_elapsed_s must be >= 0 s, got {self.head_elapsed_s}")
        if self.queued_prefill_prompts > self.queued_prefill_tokens:
            raise ValueError(f"worker {self.worker_id}: {self.queued_prefill_prompts} queued prompts cannot hold "
                             f"{self.queued_prefill_tokens} tokens (each prompt has >= 1)")


@dataclass(frozen=True)
class RequestView:
    """What placement needs of a request. `slo_class` names a class of `PlacementConfig.class_rank`."""

    num_prompt_tokens: int
    max_tokens: int
    ttft_slo_s: float
    tpot_slo_s: float
    slo_class: str = ""

    def __post_init__(self) -> None:
        if self.num_prompt_tokens < 1 or self.max_tokens < 1:
            raise ValueError(f"a request needs >= 1 prompt token and max_tokens >= 1, got "
                             f"{self.num_prompt_tokens} and {self.max_tokens}")
        if not (self.ttft_slo_s > 0 and self.tpot_slo_s > 0):
            raise ValueError(f"SLOs must be > 0 s, got ttft {self.ttft_slo_s}, tpot {self.tpot_slo_s}")

    def uncached_tokens(self, worker: WorkerView) -> int:
        """Prompt tokens `worker` must compute: the prompt minus its cached prefix, and never less than
        one (the engine always computes the last prompt token, whose logits give the first token)."""
        return self.num_prompt_tokens - min(worker.cached_prefix_tokens, self.num_prompt_tokens - 1)

    def kv_blocks_needed(self, block_size: int) -> int:
        """Blocks the decode worker holds for this request at its longest: prompt + max_tokens."""
        return -(-(self.num_prompt_tokens + self.max_tokens) // block_size)
