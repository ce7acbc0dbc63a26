"""The plain records of a KV transfer, shared by the connector's two halves, the transports and the
workers: a producer's lease grant, a consumer's pull and release, and how a pull went.

Nothing here imports vLLM: a transport's producer process (`kv_transfer.producer`, the throughput
pair, the fault-injection tests) uses these without the engine, and `import vllm` costs seconds of
CPU a process (12 s on an AVX2-only EPYC). `kv_transfer.metadata` wraps them in vLLM's connector types.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LeaseGrant:
    transfer_id: str
    request_id: str
    block_ids: tuple[int, ...]
    num_tokens: int
    lease_s: float


@dataclass(frozen=True)
class PullSpec:
    request_id: str
    transfer_id: str
    address: str
    remote_block_ids: tuple[int, ...]
    local_block_ids: tuple[int, ...]
    num_tokens: int   # prompt tokens whose KV the pull delivers


@dataclass(frozen=True)
class ReleaseSpec:
    transfer_id: str
    address: str


@dataclass(frozen=True)
class PullReport:
    """How one pull went. It reaches the decode worker as the finished request's
    `kv_transfer_params` (`as_params`), read back there with `from_params`."""

    num_bytes: int
    num_blocks: int
    seconds: float
    num_tokens: int = 0
    error: str = ""

    @property
    def num_loaded_tokens(self) -> int:
        """Prompt tokens whose KV the pull delivered: none when it failed (they were recomputed)."""
        return 0 if self.error else self.num_tokens

    def as_params(self) -> dict:
        return {"kv_transfer_bytes": self.num_bytes, "kv_transfer_blocks": self.num_blocks,
                "kv_transfer_s": self.seconds, "kv_loaded_tokens": self.num_loaded_tokens,
                "kv_load_error": self.error}

    @classmethod
    def from_params(cls, params: dict | None) -> "PullReport":
        """The report in a finished request's `kv_transfer_params`; all zeros when there is none
        (nothing was pulled). `from_params(r.as_params())` equals `r` except that a failed pull's
        `num_tokens` reads back as 0 (`num_loaded_tokens` is what crosses)."""
        params = params or {}
        return cls(num_bytes=int(params.get("kv_transfer_bytes", 0)),
                   num_blocks=int(params.get("kv_transfer_blocks", 0)),
                   seconds=float(params.get("kv_transfer_s", 0.0)),
                   num_tokens=int(params.get("kv_loaded_tokens", 0)),
                   error=str(params.get("kv_load_error", "")))
