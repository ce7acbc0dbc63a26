"""Which pool members to add or remove to reach a size. Pure: member states in, a plan out.

Rules, in order (a Kubernetes ReplicaSet's, adapted):
1. members that can no longer serve (`failed`: the process exited before it was ever ready;
   `dead`: Ray gave up restarting the actor) are always removed and, within the target, replaced;
2. when the pool is too big, members that serve nothing yet go first (`starting`, then
   `unreachable`: restarting or waiting for resources), newest first, then ready ones, newest first;
3. when it is too small, new members are added.
A plan never removes and adds healthy members in the same step; asking for the current size of a
healthy pool is a no-op.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pdserve.roles import Role
from launch.ray.spec import MemberState, member_index

_BROKEN = ("failed", "dead")
_REMOVAL_ORDER = {"starting": 0, "unreachable": 1, "ready": 2}


@dataclass(frozen=True)
class ScalePlan:
    remove: tuple[str, ...] = ()
    add: int = 0

    @property
    def empty(self) -> bool:
        return not self.remove and not self.add


def plan_scale(members: Sequence[MemberState], role: Role, replicas: int) -> ScalePlan:
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ValueError(f"replicas for {role} must be an int >= 0, got {replicas!r}")
    pool = [m for m in members if m.kind == role]
    broken = [m.member_id for m in pool if m.status in _BROKEN]
    healthy = [m for m in pool if m.status not in _BROKEN]
    excess = len(healthy) - replicas
    if excess <= 0:
        return ScalePlan(remove=tuple(broken), add=-excess)
    by_preference = sorted(healthy, key=lambda m: (_REMOVAL_ORDER.get(m.status, 0), -member_index(m.member_id)))
    return ScalePlan(remove=tuple(broken) + tuple(m.member_id for m in by_preference[:excess]), add=0)


def pool_sizes(kinds: Iterable[str]) -> dict[Role, int]:
    """Desired size of each pool: every member the cluster holds (given by kind), whatever its state."""
    kinds = list(kinds)
    return {"prefill": kinds.count("prefill"), "decode": kinds.count("decode")}
