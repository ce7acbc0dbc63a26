"""What the connector's two halves tell each other each engine step.

scheduler -> worker (`PDConnectorMetadata`): leases to hold (producer), pulls to run and producer
leases to release (consumer). worker -> scheduler (`PDWorkerMeta`): how each finished pull went,
so the decode request's final output can report bytes, seconds and errors. scheduler -> stat
loggers (`PDConnectorStats`): the gauges of `kv_transfer.stats`. The records inside them are
`kv_transfer.records`, which needs no vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata, KVConnectorWorkerMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from kv_transfer.records import LeaseGrant, PullReport, PullSpec, ReleaseSpec


@dataclass
class PDConnectorMetadata(KVConnectorMetadata):
    grants: list[LeaseGrant] = field(default_factory=list)
    pulls: list[PullSpec] = field(default_factory=list)
    releases: list[ReleaseSpec] = field(default_factory=list)


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
