"""The controller actor: one per pdserve cluster on Ray, the owner of every member actor.

It is the named actor `controller` in the namespace `pdserve-{cluster}`. `pdserve up --ray`
creates it (so it lives as long as that command does) and every other client, the planner's Ray
actuator included, finds it by name. Because it creates the members, they are *its* actors:
whoever asks for a new decode worker, the worker outlives the asker, and when the controller goes
away (Ctrl-C on `pdserve up`, or that process dying) Ray takes every member with it, and every
member's process follows (see `launch.ray.member`). Nothing is left running by accident.

Methods run on a thread pool (`max_concurrency`): `members()` answers while `scale()` drains.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from launch.credentials import ClusterCredentials
from launch.ray.member import MemberActor
from launch.ray.scaling import ScalePlan, plan_scale, pool_sizes
from pdserve.roles import Role
from launch.ray.spec import Kind, Launch, MemberState, RayClusterSpec, actor_options, member_id

STATE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Endpoints:
    grpc_target: str
    http_url: str
    redis_url: str                     # without the password, as every member's command line has it
    credentials: ClusterCredentials | None = None   # the cluster's, for its owner and the planner


@dataclass
class _Member:
    kind: Kind
    handle: object


class _ClusterController:
    def __init__(self, spec: RayClusterSpec):
        self.spec = spec
        self._members: dict[str, _Member] = {}
        self._lock = threading.Lock()          # guards _members
        self._scale_lock = threading.Lock()    # one resize at a time
        self._ids = itertools.count()
        self._redis_url = spec.redis_url
        self._endpoints: Endpoints | None = None
        # One per cluster, made here and handed to each member, which writes it to 0600 files on its node.
        self._credentials = ClusterCredentials.generate(spec.redis_password if spec.redis_url else None)

    # ---- whole cluster ---------------------------------------------------------------------------
    def start(self) -> Endpoints:
        """Redis (unless given), the router and both pools; returns once all of them serve."""
        timeout_s = self.spec.ready_timeout_s
        if not self._redis_url:
            redis = self._create("redis", Launch("redis", "redis", (), self.spec.cluster.log_dir, self._credentials))
            self._redis_url = self._wait(redis, timeout_s)
        router = self._create("router", Launch("router", "router", tuple(self.spec.cluster.router_argv(self._redis_url)),
                                               self.spec.cluster.log_dir, self._credentials))
        created = [self.add_member(role, wait=False) for role, count in
                   (("prefill", self.spec.cluster.num_prefill), ("decode", self.spec.cluster.num_decode))
                   for _ in range(count)]
        grpc_target, http_url = self._wait(router, timeout_s).split()
        for worker in created:
            self.wait_ready(worker, timeout_s)
        self._endpoints = Endpoints(grpc_target, http_url, self._redis_url, self._credentials)
        return self._endpoints

    def endpoints(self) -> Endpoints | None:
        """None until `start()` has returned; then where the router serves now (a restarted router
        may have moved to another node)."""
        if self._endpoints is None:
            return None
        router = self._get("router").handle
        state = self._state_of("router", "router", router.state.remote(), STATE_TIMEOUT_S)
        if state.status == "ready":
            grpc_target, http_url = state.address.split()
            self._endpoints = Endpoints(grpc_target, http_url, self._redis_url, self._credentials)
        return self._endpoints

    def shutdown(self) -> None:
        """Drains every worker at once, then stops the router and Redis; kills the actors."""
        with self._lock:
            members, self._members = dict(self._members), {}
        workers = [m for m in members.values() if m.kind in ("prefill", "decode")]
        others = [m for m in members.values() if m.kind not in ("prefill", "decode")]
        for group in (workers, others):
            refs = [m.handle.stop.remote(self.spec.stop_timeout_s) for m in group]
            if refs:
                ray.wait(refs, num_returns=len(refs), timeout=self.spec.stop_timeout_s + 10)
            for member in group:
                self._discard(member)

    # ---- pools -----------------------------------------------------------------------------------
    def add_member(self, role: Role, wait: bool = True) -> str:
        if role not in ("prefill", "decode"):
            raise ValueError(f"role must be 'prefill' or 'decode', got {role!r}")
        worker_id = member_id(role, next(self._ids))
        launch = Launch(worker_id, role, tuple(self.spec.cluster.worker_argv(role, worker_id, self._redis_url)),
                        self.spec.cluster.log_dir, self._credentials)
        self._create(role, launch)
        if wait:
            self.wait_ready(worker_id, self.spec.ready_timeout_s)
        return worker_id

    def wait_ready(self, member: str, timeout_s: float) -> str:
        return self._wait(self._get(member).handle, timeout_s)

    def remove_member(self, member: str) -> int:
        """Graceful: the worker drains and exits, then its actor is killed. Its exit code."""
        with self._lock:
            removed = self._members.pop(member, None)
        if removed is None:
            raise KeyError(f"no member {member!r}; members are {sorted(self._members)}")
        try:
            return ray.get(removed.handle.stop.remote(self.spec.stop_timeout_s), timeout=self.spec.stop_timeout_s + 10)
        except (RayActorError, GetTimeoutError):
            return -1  # already dead, or stuck: killed below either way
        finally:
            self._discard(removed)

    def scale(self, role: Role, replicas: int, wait: bool = False) -> ScalePlan:
        """Brings the pool to `replicas` (see `launch.ray.scaling`). Removals drain before this
        returns; additions are created (Ray accepted them) and, with `wait`, serving."""
        with self._scale_lock:
            plan = plan_scale(self.members(), role, replicas)
            for member in plan.remove:
                self.remove_member(member)
            added = [self.add_member(role, wait=False) for _ in range(plan.add)]
        for member in added if wait else ():
            self.wait_ready(member, self.spec.ready_timeout_s)
        return plan

    def pool_sizes(self) -> dict[Role, int]:
        with self._lock:
            return pool_sizes(member.kind for member in self._members.values())

    def members(self) -> list[MemberState]:
        """Every member's state; a member that does not answer within 2 s is `unreachable`
        (restarting, or waiting for resources), one Ray gave up on is `dead`."""
        with self._lock:
            members = dict(self._members)
        refs = {m: member.handle.state.remote() for m, member in members.items()}
        if refs:
            ray.wait(list(refs.values()), num_returns=len(refs), timeout=STATE_TIMEOUT_S)
        return [self._state_of(m, members[m].kind, ref) for m, ref in sorted(refs.items())]

    # ---- helpers ---------------------------------------------------------------------------------
    def _create(self, kind: Kind, launch: Launch):
        """The member's actor handle; Ray places and starts it in the background."""
        handle = MemberActor.options(**actor_options(self.spec, kind, launch.member_id)).remote(launch)
        with self._lock:
            self._members[launch.member_id] = _Member(kind, handle)
        return handle

    def _get(self, member: str) -> _Member:
        with self._lock:
            if member not in self._members:
                raise KeyError(f"no member {member!r}; members are {sorted(self._members)}")
            return self._members[member]

    def _wait(self, handle, timeout_s: float) -> str:
        try:
            return ray.get(handle.ready.remote(timeout_s), timeout=timeout_s + 5)
        except GetTimeoutError:
            raise TimeoutError(f"a member was not placed within {timeout_s:.0f} s: Ray has no node with the "
                               f"resources it asks for (see `ray status`; lower --prefill-cpus/--decode-cpus/--router-cpus)") from None

    @staticmethod
    def _state_of(member: str, kind: Kind, ref, timeout_s: float = 0.0) -> MemberState:
        try:
            return ray.get(ref, timeout=timeout_s)
        except GetTimeoutError:
            return MemberState(member, kind, "unreachable", detail="restarting, or waiting for resources")
        except RayActorError as error:
            return MemberState(member, kind, "dead", detail=str(error).splitlines()[0])

    @staticmethod
    def _discard(member: _Member) -> None:
        ray.kill(member.handle, no_restart=True)


ClusterController = ray.remote(_ClusterController)
