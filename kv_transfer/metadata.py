"""What the connector's two halves tell each other each engine step.

scheduler -> worker (`PDConnectorMetadata`): leases to hold (producer), pulls to run and producer
leases to release (consumer). worker -> scheduler (`PDWorkerMeta`): how each finished pull went,
so the decode request's final output can report bytes, seconds and errors. scheduler -> stat
loggers (`PDConnectorStats`): the gauges of `kv_transfer.stats`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata, KVConnectorWorkerMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats


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


@dataclass
class PDConnectorMetadata(KVConnectorMetadata):
    grants: list[LeaseGrant] = field(default_factory=list)
    pulls: list[PullSpec] = field(default_factory=list)
    releases: list[ReleaseSpec] = field(default_factory=list)


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


@dataclass
class PDWorkerMeta(KVConnectorWorkerMetadata):
    reports: dict[str, PullReport] = field(default_factory=dict)

    def aggregate(self, other: "KVConnectorWorkerMetadata") -> "KVConnectorWorkerMetadata":
        if isinstance(other, PDWorkerMeta):
            self.reports.update(other.reports)
        return self


@dataclass
class PDConnectorStats(KVConnectorStats):
    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> "PDConnectorStats":
        self.data = {**self.data, **(other.data or {})}
        return self

    def reduce(self) -> dict[str, int | float]:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not self.data
