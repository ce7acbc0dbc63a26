"""A worker process's configuration, filled from the command line (and env at the entry point)."""

from __future__ import annotations

import socket
import uuid
from dataclasses import dataclass, field


from kv_transfer.transports.base import TransportName
from pdserve.engine import EngineSettings
from pdserve.roles import Role, check_role


@dataclass(frozen=True)
class WorkerConfig:
    role: Role
    engine: EngineSettings
    redis_url: str
    cluster: str = "default"
    worker_id: str = field(default_factory=lambda: f"w-{uuid.uuid4().hex[:8]}")
    bind_host: str = "127.0.0.1"
    advertise_host: str = "127.0.0.1"   # the address other processes reach this worker at
    grpc_port: int = 0                  # 0: any free port
    kv_port: int = 0                    # prefill: KV transfer server port; 0: a free port picked at start
    transport: TransportName = "auto"
    lease_s: float = 30.0
    heartbeat_s: float = 1.0
    ttl_s: float = 3.0
    drain_timeout_s: float = 30.0       # SIGTERM -> in-flight requests done (prefill: and KV pulled); see drain.py

    def __post_init__(self) -> None:
        check_role(self.role)
        if self.ttl_s <= self.heartbeat_s:
            raise ValueError(f"ttl_s ({self.ttl_s}) must exceed heartbeat_s ({self.heartbeat_s}) or the lease lapses")
        if self.drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must be >= 0 seconds (0: stop at once), got {self.drain_timeout_s}")


def free_port(host: str) -> int:
    """A port that was free a moment ago (the caller binds it soon after)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
