"""A local cluster of processes: a private Redis, a router, prefill and decode workers.

Used by `pdserve up`, the demo, the tests, the benchmarks and the planner's local actuator.
Each process is `pdserve <command>` run by a `launch.supervisor.ChildProcess` (its own process
group, and it dies with this process, whichever thread started it); `add_worker`/`remove_worker`
change the pools while the cluster runs (removal is SIGTERM to the worker process alone, as a
container runtime sends it: the worker drains with its engine intact, then stops it).

Every cluster gets its own credentials: `start` writes a fresh random cluster secret to
`cluster-secret` and a Redis password to `redis-password` (both mode 0600) in the run directory
(`log_dir`), starts its Redis requiring the password, and gives every process the two paths
(`--cluster-secret-file`, `--redis-password-file`; never the secrets themselves). So only this
cluster's router can call its workers, only its workers can pull or release its KV, and only its
processes can register in or read its Redis (SECURITY.md).

Every worker serves Prometheus metrics (vLLM's `vllm:*` and pdserve's) on a port of its own,
`metrics_urls[worker_id]`; the router serves its own at `{http_url}/metrics`. Not a supervisor: a
worker that exits on its own (a dead engine exits non-zero, `pdserve.worker.watchdog`) is not
restarted here; Ray's member actors and Kubernetes restart theirs.

Where each process runs is `hosts(name)` (names: "redis", "router", the worker ids), a
`launch.commands.Host`: by default all on this host's loopback. With `hosts` given, each process
is started through its host's command prefix and listens on (a worker: and advertises) its host's
address, so one machine can stand in for several (tests/netns.py: a network namespace per host,
joined by veth links), as the processes of a real multi-host cluster would be placed.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import tempfile
import time
from pathlib import Path
from typing import Callable

import grpc

from kv_transfer.auth import create_secret_file, load_secret
from launch.commands import ClusterSpec, Host
from launch.redis_server import RedisServer, start_redis
from launch.supervisor import ChildProcess, pdserve_child
from pdserve.redis_auth import create_password_file
from pdserve.roles import Role
from pdserve.rpc_auth_grpc import worker_channel
from pdserve.worker.config import free_port

__all__ = ["ClusterSpec", "LocalCluster"]


class LocalCluster:
    def __init__(self, spec: ClusterSpec, hosts: Callable[[str], Host] | None = None):
        self.spec = spec
        self.hosts = hosts
        self.log_dir = Path(spec.log_dir or tempfile.mkdtemp(prefix="pdserve-logs-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.redis: RedisServer | None = None
        self.router: ChildProcess | None = None
        self.workers: dict[str, ChildProcess] = {}
        self.metrics_urls: dict[str, str] = {}  # worker id -> its Prometheus endpoint
        self._ids = itertools.count()
        self.grpc_target = ""
        self.http_url = ""
        self.secret_file = self.log_dir / "cluster-secret"   # written by `start`: worker gRPC's and the KV plane's
        self.redis_password_file = self.log_dir / "redis-password"   # written by `start`

    # ---- lifecycle -------------------------------------------------------------------------------
    def start(self, timeout_s: float = 240.0) -> "LocalCluster":
        """Starts Redis, the router and the workers; returns once the router routes to every worker
        (a worker's ready file says it serves; the router learns of it at its next registry refresh,
        and a request sent in between would find no worker)."""
        try:
            deadline = time.monotonic() + timeout_s
            create_secret_file(self.secret_file)
            create_password_file(self.redis_password_file)
            self.redis = start_redis(password_file=self.redis_password_file, host=self.host_of("redis"))
            self.router = self._spawn("router", [*self.spec.router_argv(self.redis.url, str(self.secret_file),
                                                                        str(self.redis_password_file)),
                                                 *self._listen_argv("router", advertise=False)])
            for role, count in (("prefill", self.spec.num_prefill), ("decode", self.spec.num_decode)):
                for index in range(count):
                    self.add_worker(role, wait=False, cpu_cores=self.spec.cores_of(role, index, count))
            self.wait_ready([self.router, *self.workers.values()], timeout_s)
            self.grpc_target, self.http_url = self.router.wait_ready(0).split()
            self.wait_routed(max(1.0, deadline - time.monotonic()))
            return self
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for process in [*self.workers.values(), self.router]:
            if process is not None:
                process.terminate()  # all drain at once; stop() below waits for each
        for process in [*self.workers.values(), self.router]:
            if process is not None:
                process.stop(timeout_s=30.0)
        if self.redis is not None:
            self.redis.stop()

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- pools ---------------------------------------------------------------------------------
    def add_worker(self, role: Role, wait: bool = True, timeout_s: float = 240.0, cpu_cores: str | None = None) -> str:
        """Starts one more worker of `role` on `cpu_cores` (default: the role's cores)."""
        worker_id = f"{role}-{next(self._ids)}"
        argv = self.spec.worker_argv(role, worker_id, self.redis.url, cpu_cores, str(self.secret_file),
                                     str(self.redis_password_file))
        metrics_port = free_port("127.0.0.1")
        process = self._spawn(worker_id, [*argv, *self._listen_argv(worker_id, advertise=True),
                                          "--metrics-port", str(metrics_port)])
        self.workers[worker_id] = process
        self.metrics_urls[worker_id] = f"http://{self.host_of(worker_id).address}:{metrics_port}/metrics"
        if wait:
            self.wait_ready([process], timeout_s)
        return worker_id

    def remove_worker(self, worker_id: str, timeout_s: float = 60.0) -> int:
        """Drains and stops the worker (SIGTERM); returns its exit code."""
        return self.workers.pop(worker_id).stop(timeout_s)

    def kill_worker(self, worker_id: str) -> None:
        """SIGKILL, as a crash: no drain, no deregistration."""
        self.workers.pop(worker_id).kill()

    # ---- the control plane, for chaos tests and runs ----------------------------------------------
    def kill_router(self) -> None:
        """SIGKILL the router, as a crash: streams in flight break, nothing drains."""
        self.router.kill()

    def start_router(self, timeout_s: float = 120.0, wait_routed: bool = True) -> None:
        """Starts a router again on the ports the last one had, so clients keep their target;
        returns once it serves and (`wait_routed`) routes to as many workers as the spec asks for."""
        grpc_port, http_port = int(self.grpc_target.rsplit(":", 1)[1]), int(self.http_url.rsplit(":", 1)[1])
        spec = dataclasses.replace(self.spec, grpc_port=grpc_port, http_port=http_port)
        self.router = self._spawn("router", [*spec.router_argv(self.redis.url, str(self.secret_file),
                                                               str(self.redis_password_file)),
                                             *self._listen_argv("router", advertise=False)])
        self.wait_ready([self.router], timeout_s)
        if wait_routed:
            self.wait_routed(timeout_s)

    def kill_redis(self) -> None:
        """SIGKILL Redis: the registry is gone until `restart_redis` (it keeps nothing on disk)."""
        self.redis.process.kill()

    def restart_redis(self, timeout_s: float = 10.0) -> None:
        """A new, empty Redis on the same address, port and password: the workers' heartbeats
        register them again, the router's refresh finds them."""
        old = self.redis
        self.redis = start_redis(port=old.port, timeout_s=timeout_s, password_file=self.redis_password_file,
                                 host=self.host_of("redis"))
        old.stop(timeout_s=1.0)   # its folder

    def worker_ids(self, role: Role) -> list[str]:
        return [w for w in self.workers if w.startswith(role)]

    def worker_address(self, worker_id: str) -> str:
        """The address a ready worker serves on (TimeoutError if it is not ready)."""
        return self.workers[worker_id].wait_ready(0)

    def worker_channel(self, worker_id: str) -> grpc.Channel:
        """A synchronous gRPC channel to a ready worker whose calls prove the cluster secret."""
        return worker_channel(self.worker_address(worker_id), load_secret(self.secret_file))

    # ---- processes -----------------------------------------------------------------------------
    def host_of(self, name: str) -> Host:
        """Where process `name` runs ("redis", "router" or a worker id)."""
        return self.hosts(name) if self.hosts is not None else Host()

    def _listen_argv(self, name: str, advertise: bool) -> list[str]:
        return self.host_of(name).listen_argv(advertise) if self.hosts is not None else []

    def _spawn(self, name: str, argv: list[str]) -> ChildProcess:
        return pdserve_child(argv, self.log_dir, name, command_prefix=self.host_of(name).command_prefix).start()

    def wait_ready(self, processes: list[ChildProcess], timeout_s: float) -> None:
        """Until every process is ready, within `timeout_s` in all; ChildExited (with its log) if one
        exits first, TimeoutError after the deadline."""
        deadline = time.monotonic() + timeout_s
        for process in processes:
            process.wait_ready(max(0.0, deadline - time.monotonic()))

    def wait_routed(self, timeout_s: float) -> None:
        """Waits until the router sees as many prefill and decode workers as the spec asks for. Asks
        its /health, which needs no API key (the router may require one of its clients)."""
        deadline = time.monotonic() + timeout_s
        while True:
            seen = router_health(self.http_url)
            prefill, decode = seen["prefill_workers"], seen["decode_workers"]
            if prefill >= self.spec.num_prefill and decode >= self.spec.num_decode:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the router sees {prefill} prefill and {decode} decode workers after "
                                   f"{timeout_s:.0f} s, not {self.spec.num_prefill} and {self.spec.num_decode}; "
                                   f"logs in {self.log_dir}")
            time.sleep(0.05)


def router_health(http_url: str, timeout_s: float = 10.0) -> dict:
    """GET {http_url}/health of a router this process started. Over https the certificate is not
    checked: the router is our own child, the answer holds counts only, and nothing secret is sent."""
    import ssl
    import urllib.request

    context = ssl._create_unverified_context() if http_url.startswith("https://") else None
    with urllib.request.urlopen(f"{http_url}/health", timeout=timeout_s, context=context) as response:
        return json.load(response)

