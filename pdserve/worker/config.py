"""A worker process's configuration, filled from the command line (and env at the entry point)."""

from __future__ import annotations

import random
import socket
import uuid
from dataclasses import dataclass, field


from kv_transfer.encryption import DEFAULT_ENCRYPTION, EncryptionMode, setting_problem
from kv_transfer.transports.base import TransportName
from pdserve.engine import EngineSettings
from pdserve.roles import Role, check_role


@dataclass(frozen=True)
class WorkerConfig:
    role: Role
    engine: EngineSettings
    redis_url: str = field(repr=False)   # may hold the Redis password (the entry point puts it there)
    cluster: str = "default"
    worker_id: str = field(default_factory=lambda: f"w-{uuid.uuid4().hex[:8]}")
    bind_host: str = "127.0.0.1"
    advertise_host: str = "127.0.0.1"   # the address other processes reach this worker at
    grpc_port: int = 0                  # 0: any free port
    kv_port: int = 0                    # prefill: KV transfer server port; 0: a free port picked at start
    transport: TransportName = "auto"
    lease_s: float = 30.0
    kv_pull_timeout_s: float = 30.0     # every wait of a KV pull or of serving one (kv_transfer's pull_timeout_s)
    heartbeat_s: float = 1.0
    ttl_s: float = 3.0
    drain_timeout_s: float = 30.0       # SIGTERM -> in-flight requests done (prefill: and KV pulled); see drain.py
    cluster_secret_file: str = ""       # worker gRPC's and the KV plane's cluster secret; "" = unauthenticated
    kv_encryption: EncryptionMode = DEFAULT_ENCRYPTION   # KV bytes encrypted: off / auto (between hosts) / on

    def __post_init__(self) -> None:
        check_role(self.role)
        if why := setting_problem(self.kv_encryption, self.transport, bool(self.cluster_secret_file)):
            raise ValueError(why)
        if self.ttl_s <= self.heartbeat_s:
            raise ValueError(f"ttl_s ({self.ttl_s}) must exceed heartbeat_s ({self.heartbeat_s}) or the lease lapses")
        if self.drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must be >= 0 seconds (0: stop at once), got {self.drain_timeout_s}")


LISTEN_PORTS_FROM = 20000   # above Ray's worker ports (10002-19999), below the kernel's ephemeral range


def ephemeral_range(text: str | None = None) -> tuple[int, int]:
    """The kernel's range for outgoing connections' source ports (and bind to port 0), from the
    text of /proc/sys/net/ipv4/ip_local_port_range; Linux's default when it cannot be read."""
    if text is None:
        try:
            text = open("/proc/sys/net/ipv4/ip_local_port_range").read()
        except OSError:
            text = ""
    fields = text.split()
    return (int(fields[0]), int(fields[1])) if len(fields) == 2 and all(f.isdigit() for f in fields) else (32768, 60999)


def free_port(host: str, attempts: int = 64) -> int:
    """A port that was free a moment ago (the caller binds it later, possibly seconds later, as a
    worker's KV port is bound by vLLM's model runner after the model loads). Taken below the
    ephemeral range when one is free there: in the range, any outgoing connection of any process
    (a Ray cluster makes hundreds) may take it in between; below it only another listener can."""
    low, _ = ephemeral_range()
    for port in random.sample(range(LISTEN_PORTS_FROM, low), min(attempts, max(0, low - LISTEN_PORTS_FROM))):
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
