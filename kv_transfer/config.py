"""The connector's settings, read from vLLM's `kv_transfer_config.kv_connector_extra_config`.

The worker process that builds the engine writes them (see `pdserve.engine`); both connector roles
read the same values, so the scheduler can advertise the address the worker-side server binds.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Literal

from kv_transfer.encryption import DEFAULT_ENCRYPTION, EncryptionMode, setting_problem
from kv_transfer.faults import FAULTS_ENV, FaultPlan

logger = logging.getLogger(__name__)

CONNECTOR_NAME = "PDConnector"
CONNECTOR_MODULE = "kv_transfer.connector"


@dataclass(frozen=True)
class ConnectorConfig:
    transport: Literal["tcp", "torch", "shm", "auto"] = "tcp"
    host: str = "127.0.0.1"          # where consumers reach the producer's transfer server
    bind_host: str = ""              # where it listens; "" = `host` (use 0.0.0.0 in containers)
    port: int = 0                    # producer: transfer server port (must be fixed, not 0, to advertise)
    model: str = ""                  # a display name; the handshake compares the checkpoint's fingerprint
    lease_s: float = 30.0            # producer: how long KV waits for its consumer
    pull_timeout_s: float = 30.0     # every wait inside a pull or its serving: sockets and process groups
    max_parallel_pulls: int = 4
    tcp_congestion: str = "cubic"    # KV connections' congestion control ("" = the host's; see kv_transfer.sockets)
    grant_token: str = ""            # producer: the secret with which its scheduler half grants leases at once
                                     # (kv_transfer.grants); "" = grants ride the next engine step only
    cluster_secret_file: str = ""    # the file holding the KV plane's cluster secret (kv_transfer.auth);
                                     # "" = unauthenticated (warned). The path, never the secret: vLLM logs its config
    worker_id: str = ""              # this worker's identity on the KV plane, which transfers are bound to
                                     # ("" = kv_transfer.auth.process_credentials()'s)
    kv_encryption: EncryptionMode = DEFAULT_ENCRYPTION   # off / auto (between hosts) / on: kv_transfer.encryption
    fault_plan: str = ""             # TESTS AND CHAOS RUNS ONLY: faults injected into transfers (kv_transfer.faults);
                                     # "" in production. The environment's FAULTS_ENV fills it in `from_extra`

    def __post_init__(self) -> None:
        if self.transport not in ("tcp", "torch", "shm", "auto"):
            raise ValueError(f"transport must be 'tcp', 'torch', 'shm' or 'auto', not {self.transport!r}")
        if self.lease_s <= 0 or self.pull_timeout_s <= 0:
            raise ValueError("lease_s and pull_timeout_s must be positive seconds")
        if not isinstance(self.tcp_congestion, str):
            raise ValueError(f"tcp_congestion must be a congestion control name or '', not {self.tcp_congestion!r}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port {self.port} is not a TCP port")
        FaultPlan.parse(self.fault_plan)   # a bad plan fails here, with the item that is wrong
        if why := setting_problem(self.kv_encryption, self.transport, bool(self.cluster_secret_file)):
            raise ValueError(why)

    @classmethod
    def from_extra(cls, extra: dict | None, environ: dict | None = None) -> "ConnectorConfig":
        """The config from vLLM's extra config; `fault_plan`, when the extra has none, from the
        environment's `FAULTS_ENV` (tests and chaos runs), logged loudly in every process."""
        extra = dict(extra or {})
        known = {name: extra[name] for name in cls.__dataclass_fields__ if name in extra}
        environ = os.environ if environ is None else environ
        if not known.get("fault_plan") and environ.get(FAULTS_ENV):
            known["fault_plan"] = environ[FAULTS_ENV]
        config = cls(**known)
        if config.fault_plan:
            logger.warning("KV TRANSFER FAULT INJECTION IS ON (%s=%r): for tests and chaos runs only, never "
                           "in production", FAULTS_ENV, config.fault_plan)
        return config

    @property
    def faults(self) -> FaultPlan | None:
        """The parsed `fault_plan` (None: no faults, the production case)."""
        plan = FaultPlan.parse(self.fault_plan)
        return plan if plan else None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"
