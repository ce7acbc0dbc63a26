"""A goodput comparison replayed through the simulator: every system as the planner models it, on
the very requests each of its runs sent (`bench/goodput_vs_vllm.py` keeps them), so that every point
of the comparison has the planner's prediction beside it, not only the plan's pick.

How each system of the comparison is modelled (`modelled_system`), on the comparison's two cores:
- A, A-<n> (vLLM's server): one engine over both cores, `1Cx2` (`@n`: its token budget), no router
  in front (nothing refused, no dispatch gate: every request joins the engine's queue at arrival,
  first come first served), with vLLM's server's own serving costs where the profile measured them
  (`Profile.vllm_server`, `pdserve profile --vllm-server`), else pdserve's (the profile's `serving`:
  what earlier replays charged, 1-3 ms a step where vLLM's API process took 8-9 on the Xeon);
- B, B-tcp: 1 prefill + 1 decode worker, a router without SLOs;
- B-slo: the same with the tight SLO pair on the router (admission); B-hybrid: 1P+1H, tight pair;
- B-agg: one aggregated pdserve worker over both cores, `1Cx2`, tight pair on the router;
- B*-<name> (tight, loose, or either with a variant: loose-q50): the plan's topology, its router files (cost model and placement policy) and SLOs.
C (two vLLM servers dealt round robin) is no topology of the planner's and is not modelled.
`run_speed_factor` says how much slower than at the profile the machine computed before a run
(its speed check over the profile's, the same product only), for a replay at the run's own speed.
The real routers of B, B-slo, B-hybrid and B-agg start from the CPU default cost model and
calibrate it online; the simulated ones use the profile's (the simulator's default).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from loadgen.comparison.config import PLAN_PREFIX
from loadgen.metrics import SLO
from loadgen.workload import RequestSpec
from planner.evaluate import with_router_slo
from planner.perf_model import PerfModel
from planner.profile import HardwareInfo
from planner.router_config import COST_FILE, PLACEMENT_FILE, PlannedCluster
from planner.serving_costs import ServingCosts
from planner.simulator import SimSettings, Topology, simulate
from router.policies.placement import CostModel, PlacementConfig

FIXED = {
    "B": Topology.disaggregated(1, 1),
    "B-tcp": Topology.disaggregated(1, 1),
    "B-slo": Topology.disaggregated(1, 1),
    "B-hybrid": Topology.hybrid(1, 1),
    "B-agg": Topology.aggregated(1, devices_per_instance=2),
}
TIGHT_ROUTERS = ("B-slo", "B-hybrid", "B-agg")  # given the tight SLO pair, as the comparison gives it


@dataclass(frozen=True)
class ModelledSystem:
    """A comparison system as the simulator runs it."""

    topology: Topology
    router_slo: SLO | None = None  # the SLOs its router was given; None: none
    router_dir: Path | None = None  # a plan's router files; None: the simulator's own cost model and policy
    routed: bool = True  # False: no router in front (vLLM's server): nothing is refused
    serving: ServingCosts | None = None  # its own serving costs; None: the settings' (pdserve's)


def modelled_system(key: str, tight: SLO, plans: dict[str, PlannedCluster],
                    vllm_server: ServingCosts | None = None) -> ModelledSystem | None:
    """`key`'s model (see the module's list), `tight` the comparison's tight SLO pair, `plans`
    each B*-<name>'s plan by name and `vllm_server` vLLM's server's serving costs (None: not
    measured); None for a system the planner has no topology for."""
    if key == "A" or key.startswith("A-"):
        budget = int(key[2:]) if key.startswith("A-") else 0
        return ModelledSystem(Topology.aggregated(1, budget, devices_per_instance=2), routed=False,
                              serving=vllm_server)
    if key in FIXED:
        return ModelledSystem(FIXED[key], tight if key in TIGHT_ROUTERS else None)
    if key.startswith(PLAN_PREFIX) and key[len(PLAN_PREFIX):] in plans:
        plan = plans[key[len(PLAN_PREFIX):]]
        return ModelledSystem(plan.topology, plan.slo, plan.directory)
    return None


def sent_requests(specs: Sequence[RequestSpec], record: dict[str, list]) -> list[RequestSpec]:
    """The run's requests (`specs`, the comparison's workload at that rate: what each asked for) at
    the times its client sent them (the run's `sent_s` column, counted from the first send). A
    record whose prompts differ from `specs` is another workload's: ValueError."""
    if list(record["prompt_tokens"]) != [spec.prompt_tokens for spec in specs]:
        raise ValueError("the run's prompts are not the workload's: rebuilt with other settings than the run's")
    first = min(record["sent_s"])
    return [replace(spec, arrival_s=sent - first) for spec, sent in zip(specs, record["sent_s"])]


def settings_for(system: ModelledSystem, settings: SimSettings) -> SimSettings:
    """`settings` with `system`'s router: its SLOs, a plan's files; for a system without a router,
    no admission and no dispatch gate (every request reaches the engine's own queue at arrival);
    a system with serving costs of its own runs with those."""
    if system.serving is not None:
        settings = replace(settings, serving=system.serving)
    if system.router_slo is not None:
        settings = with_router_slo(settings, system.router_slo)
    if system.router_dir is not None:
        cost = CostModel(**json.loads((system.router_dir / COST_FILE).read_text()))
        placement = PlacementConfig.from_file(system.router_dir / PLACEMENT_FILE)
        settings = replace(settings, router=replace(settings.router, cost=cost, placement=placement))
    if not system.routed:
        placement = replace(settings.router.placement, max_queued_prefill_tokens_per_worker=0)
        settings = replace(settings, router=replace(settings.router, admission=False, placement=placement))
    return settings


def simulated(requests: Sequence[RequestSpec], system: ModelledSystem, settings: SimSettings, model: PerfModel,
              slo_pairs: dict[str, SLO]) -> dict[str, dict[str, Any]]:
    """pair -> loadgen's summary of `requests` simulated through `system`, judged by that pair."""
    result = simulate(requests, system.topology, settings_for(system, settings), model)
    return {pair: result.summary(slo) for pair, slo in slo_pairs.items()}


def run_speed_factor(run: dict[str, Any], hardware: HardwareInfo) -> float | None:
    """How much slower than at the profile the machine computed just before `run` (a comparison
    run's record: its `host_ms_per_product` and `host_product`): the run's check over the mean of
    the profile's two (`hardware.machine_ms_start`/`_end`). None where it cannot be said: either
    side unchecked, or the two timed different products (a float32 check says nothing of a
    bfloat16 engine's speed; comparisons before `host_product` timed float32)."""
    run_ms = run.get("host_ms_per_product")
    same_product = run.get("host_product", "float32") == hardware.machine_product
    if not run_ms or run_ms <= 0 or not hardware.machine_ms or not same_product:
        return None
    return run_ms / hardware.machine_ms
