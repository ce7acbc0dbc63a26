"""Which topology the online planner runs the cluster in, chosen each interval from every allowed
kind's plan at the predicted load. Pure: no clock, no I/O (`planner.online` publishes the choice
for the routers, `pdserve.keys.topology_key`, and sizes the pools for it).

The kinds (`pdserve.roles.Topology`) differ in how the router places a request and in the pools:
disaggregated and hybrid run N prefill + M decode workers (hybrid lets a decode worker compute a
prompt itself when that meets the SLOs with more headroom); aggregated runs K decode workers that
serve both phases and no prefill pool. A plan of each kind is the fewest pool sizes of that kind
meeting the SLOs at the load (`PoolSizes(0, K)` for aggregated), or None when none within the
budget does.

Rules, in order (`choose_kind`):
1. a current kind the operator no longer allows is left at once, for the allowed kind with the
   fewest devices (the first allowed kind when none meets the SLOs);
2. within `cooldown_s` of the last switch the current kind stays (a switch drains workers and
   starts others; it is judged by its effect, as a scale is);
3. otherwise the kind with the fewest devices wins, but only when it needs at least
   `min_devices_saved` fewer than the current kind, or the current kind meets the SLOs at no size
   and it does; ties and smaller gains keep the current kind. Among equals, the allowed order
   decides (the operator's preference).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pdserve.roles import TOPOLOGIES
from pdserve.roles import Topology as TopologyKind
from planner.pool_sizes import PoolSizes


@dataclass(frozen=True)
class KindChoice:
    kind: TopologyKind
    reason: str  # "" when the current kind stays for want of a reason to leave it


def check_kinds(kinds: Sequence[str]) -> tuple[TopologyKind, ...]:
    """`kinds` as topology kinds, in the operator's order of preference; ValueError naming the fix."""
    unknown = [k for k in kinds if k not in TOPOLOGIES]
    if not kinds or unknown or len(set(kinds)) != len(kinds):
        raise ValueError(f"topologies must be distinct kinds among {', '.join(TOPOLOGIES)}, got {list(kinds)}")
    return tuple(kinds)  # type: ignore[return-value]


def check_worker_devices(worker_devices: int, kinds: Sequence[str]) -> None:
    """A worker spans >= 1 device, and more than one only in a cluster that stays aggregated: a
    prefill or decode worker is one device, and a switch would keep the pool's core sets. ValueError."""
    if worker_devices < 1 or (worker_devices > 1 and tuple(kinds) != ("aggregated",)):
        raise ValueError(f"--worker-devices {worker_devices}: a worker spans >= 1 device, and more than one only "
                         "in an aggregated cluster the planner does not switch (--topology aggregated, no other "
                         f"--topologies; got {', '.join(kinds)}): a prefill or decode worker is one device")


def choose_kind(current: TopologyKind, plans: Mapping[TopologyKind, PoolSizes | None],
                allowed: Sequence[TopologyKind], since_switch_s: float, cooldown_s: float,
                min_devices_saved: int = 1) -> KindChoice:
    """The kind for the next interval (the module docstring's rules). `plans` holds a plan for
    every allowed kind (None: no size of that kind meets the SLOs); a kind missing from it is
    taken as unplanned (None)."""
    feasible = {kind: plans[kind] for kind in allowed if plans.get(kind) is not None}
    fewest = min(feasible, key=lambda kind: (feasible[kind].total, allowed.index(kind)), default=None)
    if current not in allowed:
        chosen = fewest or allowed[0]
        why = f"{feasible[chosen]} meets the SLOs" if chosen in feasible else "no allowed kind meets the SLOs"
        return KindChoice(chosen, f"topology: {current} is not allowed; {chosen} ({why})")
    if fewest is None or fewest == current:
        return KindChoice(current, "")
    if since_switch_s < cooldown_s:
        return KindChoice(current, f"topology: hold {current}, switch cooldown ({since_switch_s:.0f}s < {cooldown_s:.0f}s)")
    ours = plans.get(current)
    if ours is None:
        return KindChoice(fewest, f"topology: {current} meets the SLOs at no size in the budget; "
                                  f"{fewest} does with {feasible[fewest]}")
    saved = ours.total - feasible[fewest].total
    if saved >= min_devices_saved:
        return KindChoice(fewest, f"topology: {fewest} needs {feasible[fewest]}, {saved} device(s) fewer than "
                                  f"{current} ({ours})")
    return KindChoice(current, "")


def bounds_for(kind: TopologyKind, min_sizes: PoolSizes, max_sizes: PoolSizes) -> tuple[PoolSizes, PoolSizes]:
    """The pool bounds of `kind` from the operator's (`PlannerConfig.min_sizes/max_sizes`): an
    aggregated cluster has no prefill pool and may spend the whole device budget on its workers;
    the other kinds keep the operator's bounds."""
    if kind == "aggregated":
        return PoolSizes(0, max(1, min_sizes.decode)), PoolSizes(0, max(1, max_sizes.total))
    return min_sizes, max_sizes
