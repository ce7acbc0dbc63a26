"""`RayCluster`: a pdserve cluster on an existing Ray cluster, with `LocalCluster`'s interface.

    cluster = RayCluster(RayClusterSpec(ClusterSpec(engine=...), address="auto")).start()
    cluster.grpc_target, cluster.http_url, cluster.redis_url
    cluster.add_worker("decode"); cluster.remove_worker("decode-3"); cluster.scale("decode", 2)
    cluster.stop()

`start()` creates the cluster's controller actor (`launch.ray.controller`), owned by this
process: the cluster lives as long as this process does. `RayCluster.attach(address, name)`
reaches a cluster another process started (the planner's Ray actuator does this); `stop()` on an
attached handle stops that cluster too.
"""

from __future__ import annotations

import time

import ray
from ray.exceptions import RayActorError

from launch.credentials import ClusterCredentials
from launch.ray.connect import RayClusterError, connect_ray
from launch.ray.controller import ClusterController, Endpoints
from launch.ray.scaling import ScalePlan
from pdserve.redis_auth import url_with_password
from pdserve.roles import Role
from launch.ray.spec import MemberState, RayClusterSpec, namespace_for

CONTROLLER = "controller"
CALL_TIMEOUT_S = 30.0


class RayCluster:
    def __init__(self, spec: RayClusterSpec | None, controller=None, cluster_name: str = ""):
        self.spec = spec
        self.name = spec.cluster.cluster if spec else cluster_name
        self._controller = controller
        self._endpoints: Endpoints | None = None

    # ---- lifecycle -------------------------------------------------------------------------------
    def start(self) -> "RayCluster":
        """Starts Redis (unless `spec.redis_url`), the router and both pools; returns when all serve."""
        connect_ray(self.spec.address, self.spec.auth_token_file)
        if _find_controller(self.name) is not None:
            raise RayClusterError(
                f"a pdserve cluster named {self.name!r} already runs on this Ray cluster (namespace "
                f"{namespace_for(self.name)}): stop it (Ctrl-C on its `pdserve up --ray`) or pick another --cluster")
        self._controller = ClusterController.options(
            name=CONTROLLER, namespace=namespace_for(self.name), num_cpus=0, max_concurrency=16, max_restarts=0,
        ).remote(self.spec)
        try:
            self._endpoints = ray.get(self._controller.start.remote())
        except BaseException:
            self.stop()
            raise
        return self

    @classmethod
    def attach(cls, address: str, cluster: str = "default", timeout_s: float = 0.0,
               auth_token_file: str = "") -> "RayCluster":
        """The cluster `pdserve up --ray ADDRESS --cluster NAME` started; waits up to `timeout_s`
        for its controller to exist and for the cluster to serve. `auth_token_file`: as
        `launch.ray.connect.connect_ray`."""
        connect_ray(address, auth_token_file)
        deadline = time.monotonic() + timeout_s
        while True:
            controller = _find_controller(cluster)
            endpoints = ray.get(controller.endpoints.remote(), timeout=CALL_TIMEOUT_S) if controller else None
            if endpoints is not None:
                attached = cls(None, controller, cluster)
                attached._endpoints = endpoints
                return attached
            if time.monotonic() >= deadline:
                raise RayClusterError(
                    f"no pdserve cluster named {cluster!r} serves on the Ray cluster at {address!r}"
                    + (" yet (it is starting)" if controller else
                       f": start one with `pdserve up --ray {address} --cluster {cluster} --model ...`"))
            time.sleep(0.5)

    def stop(self) -> None:
        """Drains the workers, stops the router and Redis, and ends every actor of the cluster."""
        if self._controller is None:
            return
        try:
            ray.get(self._controller.shutdown.remote())
        except RayActorError:
            pass  # the controller is gone, and its members went with it
        finally:
            ray.kill(self._controller, no_restart=True)
            self._controller = None

    def __enter__(self) -> "RayCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- endpoints -------------------------------------------------------------------------------
    @property
    def grpc_target(self) -> str:
        return self._fresh_endpoints().grpc_target

    @property
    def http_url(self) -> str:
        return self._fresh_endpoints().http_url

    @property
    def redis_url(self) -> str:
        """The registry, without its password (safe to print)."""
        return self._fresh_endpoints().redis_url

    @property
    def credentials(self) -> ClusterCredentials | None:
        """The cluster secret and the Redis password the controller made for this cluster."""
        return self._fresh_endpoints().credentials

    @property
    def redis_client_url(self) -> str:
        """`redis_url` with the password in it, for this process's own connections."""
        credentials = self.credentials
        return url_with_password(self.redis_url, credentials.redis_password if credentials else None)

    # ---- pools (LocalCluster's names) --------------------------------------------------------------
    def add_worker(self, role: Role, wait: bool = True) -> str:
        return self._call("add_member", role, wait)

    def remove_worker(self, worker_id: str) -> int:
        """Drains and stops the worker (SIGTERM); returns its exit code."""
        return self._call("remove_member", worker_id)

    def scale(self, role: Role, replicas: int, wait: bool = False) -> ScalePlan:
        return self._call("scale", role, replicas, wait)

    def pool_sizes(self) -> dict[Role, int]:
        return self._call("pool_sizes")

    def members(self) -> list[MemberState]:
        return self._call("members")

    def member(self, member_id: str) -> MemberState:
        by_id = {m.member_id: m for m in self.members()}
        if member_id not in by_id:
            raise KeyError(f"no member {member_id!r}; members are {sorted(by_id)}")
        return by_id[member_id]

    def wait_ready(self, member_id: str, timeout_s: float = 300.0) -> str:
        return self._call("wait_ready", member_id, timeout_s)

    def worker_ids(self, role: Role) -> list[str]:
        return [m.member_id for m in self.members() if m.kind == role]

    def worker_address(self, worker_id: str) -> str:
        return self.member(worker_id).address

    # ---- helpers ---------------------------------------------------------------------------------
    def _call(self, method: str, *args):
        if self._controller is None:
            raise RayClusterError(f"cluster {self.name!r} is stopped")
        try:
            return ray.get(getattr(self._controller, method).remote(*args))
        except RayActorError as error:
            raise RayClusterError(f"the controller of cluster {self.name!r} is gone (its `pdserve up --ray` "
                                  f"exited?): {error}") from error

    def _fresh_endpoints(self) -> Endpoints:
        endpoints = self._call("endpoints")
        self._endpoints = endpoints or self._endpoints
        if self._endpoints is None:
            raise RayClusterError(f"cluster {self.name!r} has not started yet")
        return self._endpoints


def _find_controller(cluster: str):
    try:
        return ray.get_actor(CONTROLLER, namespace=namespace_for(cluster))
    except ValueError:
        return None
