"""What a pdserve cluster on Ray is made of, as plain values. No Ray, no I/O: tested with values.

- `RayClusterSpec`: the local `ClusterSpec` (engine, pools, transport, ports, cores) plus where the
  Ray cluster is, where Redis is, and what each role (router, prefill, decode) asks Ray for;
- `actor_options`: the Ray resource requests of one member;
- the command each member's actor runs is `launch.commands`' (`ClusterSpec.router_argv`,
  `ClusterSpec.worker_argv`, `redis_argv`), the same command lines the local launcher runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from launch.commands import ClusterSpec
from launch.credentials import ClusterCredentials
from pdserve.roles import ROLES
Kind = Literal["router", "prefill", "decode", "redis"]
MemberStatus = Literal["starting", "ready", "failed", "unreachable", "dead"]
CLUSTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


@dataclass(frozen=True)
class RoleResources:
    """What one member of a role asks Ray for: logical CPUs (they decide placement) and whole GPUs
    (Ray sets the member's CUDA_VISIBLE_DEVICES to them)."""

    num_cpus: float = 1.0
    num_gpus: int = 0

    def __post_init__(self) -> None:
        if self.num_cpus < 0:
            raise ValueError(f"num_cpus must be >= 0, got {self.num_cpus}")
        if isinstance(self.num_gpus, bool) or not isinstance(self.num_gpus, int) or self.num_gpus < 0:
            raise ValueError(f"num_gpus must be a whole number >= 0 (GPUs per worker), got {self.num_gpus!r}")


@dataclass(frozen=True)
class RayClusterSpec:
    cluster: ClusterSpec
    address: str = "auto"              # the Ray cluster: "auto", "HOST:PORT" or "ray://HOST:PORT"
    auth_token_file: str = ""          # the Ray cluster's token for this driver; "": Ray's places (launch.ray.auth)
    redis_url: str = ""                # "": run redis-server in a Ray actor
    redis_password: str = field(default="", repr=False)   # with redis_url: that Redis's password ("": none)
    router: RoleResources = field(default_factory=lambda: RoleResources(num_cpus=1.0))
    prefill: RoleResources = field(default_factory=lambda: RoleResources(num_cpus=1.0))
    decode: RoleResources = field(default_factory=lambda: RoleResources(num_cpus=1.0))
    max_restarts: int = -1             # per member actor; -1: restart for ever
    ready_timeout_s: float = 300.0
    stop_timeout_s: float = 60.0       # a worker's drain, then SIGKILL

    def __post_init__(self) -> None:
        if not CLUSTER_NAME.match(self.cluster.cluster):
            raise ValueError(f"cluster name {self.cluster.cluster!r}: use letters, digits, '-', '_' or '.' "
                             "(it names the Ray namespace and the Redis key prefix), e.g. 'default'")
        if not self.address:
            raise ValueError("Ray address is empty: pass 'auto' (a cluster started with `ray start` on this "
                             "host) or HOST:PORT of the head node")
        if self.redis_url and not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"redis_url {self.redis_url!r} must look like redis://HOST:PORT/0")
        if self.redis_password and not self.redis_url:
            raise ValueError("a Redis password is for the Redis of --redis-url; without it pdserve runs its own "
                             "Redis with a password it generates")
        if self.max_restarts < -1:
            raise ValueError(f"max_restarts must be -1 (for ever) or >= 0, got {self.max_restarts}")
        if self.ready_timeout_s <= 0 or self.stop_timeout_s <= 0:
            raise ValueError("ready_timeout_s and stop_timeout_s must be > 0")
        if self.cluster.grpc_port and self.cluster.grpc_port == self.cluster.http_port:
            raise ValueError(f"router gRPC and HTTP ports are both {self.cluster.grpc_port}: pick two ports")
        _check_one_gpu_per_worker(self)

    @property
    def namespace(self) -> str:
        return namespace_for(self.cluster.cluster)

    def resources(self, kind: Kind) -> RoleResources:
        if kind == "router":
            return self.router
        if kind == "prefill":
            return self.prefill
        if kind == "decode":
            return self.decode
        return RoleResources(num_cpus=0.0)  # redis: tiny, and must never wait for a free CPU


def _check_one_gpu_per_worker(spec: RayClusterSpec) -> None:
    """Every Ray member is a prefill or decode worker, and those run on at most one GPU: each
    tensor-parallel rank holds a shard of the KV heads and pdserve's KV connector moves one rank's
    cache, so a worker spanning several GPUs would hand decode half a KV cache."""
    why = "pdserve's KV connector moves one tensor-parallel rank's KV cache"
    for role in ROLES:
        if spec.resources(role).num_gpus > 1:
            raise ValueError(f"{role} workers ask for {spec.resources(role).num_gpus} GPUs each, but a prefill or "
                             f"decode worker runs on one GPU ({why}): ask for 1 (--{role}-gpus 1) and add "
                             f"workers (--{role} N) instead")
    if spec.cluster.engine.tensor_parallel_size > 1:
        raise ValueError(f"--tensor-parallel-size {spec.cluster.engine.tensor_parallel_size}: prefill and decode "
                         f"engines run with 1 ({why}); add workers instead")


@dataclass(frozen=True)
class Launch:
    """What one member actor runs: `python -m cli.main <pdserve_args> --host NODE_IP --ready-file F`,
    or redis-server when kind is "redis" (pdserve_args empty). The actor adds the node-local parts,
    the files holding `credentials` among them (`launch.credentials.write_member_files`): a worker
    and the router get their paths, Redis requires the password."""

    member_id: str
    kind: Kind
    pdserve_args: tuple[str, ...] = ()
    log_dir: str = ""                  # on the member's node; "": a fresh temporary folder there
    credentials: ClusterCredentials | None = None   # None: unauthenticated (the processes warn)


@dataclass(frozen=True)
class MemberState:
    member_id: str
    kind: Kind
    status: MemberStatus
    address: str = ""                  # gRPC address (workers), "GRPC HTTP_URL" (router), redis URL
    node_ip: str = ""
    actor_pid: int = -1
    child_pid: int = -1
    log_path: str = ""
    detail: str = ""                   # why failed / unreachable
    metrics_url: str = ""              # Prometheus endpoint: a worker's --metrics-port, the router's HTTP /metrics


def namespace_for(cluster: str) -> str:
    """The Ray namespace holding one pdserve cluster's named actors."""
    return f"pdserve-{cluster}"


def actor_options(spec: RayClusterSpec, kind: Kind, member_id: str) -> dict:
    """Ray `.options()` for one member."""
    resources = spec.resources(kind)
    restarts = 0 if kind == "redis" else spec.max_restarts  # a new Redis would have a new address
    return {
        "name": member_id,
        "namespace": spec.namespace,
        "num_cpus": resources.num_cpus,
        "num_gpus": resources.num_gpus,
        "max_restarts": restarts,
        "max_task_retries": -1 if restarts else 0,  # calls made while it restarts wait for the new one
        "max_concurrency": 4,                       # state() answers while ready() waits
    }


def member_id(kind: Kind, index: int) -> str:
    """Pool members are `prefill-0`, `decode-1`, ... (the local launcher's names); the router and
    Redis are `router` and `redis`. The id is also the worker's id in the Redis registry."""
    return kind if kind in ("router", "redis") else f"{kind}-{index}"


def member_index(member: str) -> int:
    """The creation index of a pool member id (`decode-7` -> 7); -1 for router and redis."""
    head, _, tail = member.rpartition("-")
    return int(tail) if head and tail.isdigit() else -1
