"""Assembling the online planner: profile -> fitted model -> the plan, predict and latency functions
the loop (`planner.online.PlannerLoop`) asks. `pdserve planner` calls these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loadgen.metrics import SLO
from pdserve.roles import Topology as TopologyKind
from planner.evaluate import make_latency_fn, make_plan_fn, make_predict_fn
from planner.online import Oracle
from planner.perf_model import fit_perf_model
from planner.profile import load_profile
from planner.rate_search import SearchSettings
from planner.simulator import SimSettings


@dataclass(frozen=True)
class PlanModelSpec:
    """What the plan function simulates with."""

    profile_path: Path | None  # None: the example profile (bench model, 2 CPU cores)
    ttft_slo_s: float
    tpot_slo_s: float
    target_attainment: float = 0.9
    transport: str | None = None  # None: the profile's first
    sim_requests: int = 300  # requests per simulated probe: more is steadier, slower

    def __post_init__(self) -> None:
        if not (self.ttft_slo_s > 0 and self.tpot_slo_s > 0):
            raise ValueError(f"SLOs must be > 0 s, got TTFT {self.ttft_slo_s}, TPOT {self.tpot_slo_s}")
        if self.sim_requests < 20:
            raise ValueError(f"sim_requests must be >= 20 for a meaningful attainment, got {self.sim_requests}")


def build_oracle(spec: PlanModelSpec, max_devices: int, kinds: Sequence[TopologyKind] = ("disaggregated",),
                 worker_devices: int = 1) -> Oracle:
    """The plan (fewest pool sizes meeting the SLOs in simulation; one per topology kind in
    `kinds`, the first also as `plan`), predict (simulated p90s at given sizes) and latency
    (simulated p50s and p90s, what the loop's error tracker compares with the observed) functions
    of the profile's fitted model, and the fit itself. `worker_devices` > 1: the cluster is
    aggregated workers each over that many devices (`kinds` must be aggregated alone, and the
    profile must have measured an engine of that width); `max_devices` counts devices. The
    simulated routers admit as the live ones do, their predictions scaled by a calibration learned
    from the simulated requests (`RouterSettings.calibrated`, its default, as `pdserve plan`'s)."""
    from planner.profiles.example import EXAMPLE_PROFILE_PATH

    profile = load_profile(spec.profile_path or EXAMPLE_PROFILE_PATH)
    fit = fit_perf_model(profile)
    settings = SimSettings.from_profile(profile, spec.transport)
    slo = SLO(ttft_s=spec.ttft_slo_s, tpot_s=spec.tpot_slo_s)
    search = SearchSettings(target_attainment=spec.target_attainment)
    plans = {kind: make_plan_fn(settings, fit.model, slo, max_devices, search, num_requests=spec.sim_requests,
                                kind=kind, worker_devices=worker_devices)
             for kind in kinds}
    return Oracle(plan=plans[kinds[0]], plans=plans,
                  predict=make_predict_fn(settings, fit.model, num_requests=spec.sim_requests,
                                          worker_devices=worker_devices),
                  latency=make_latency_fn(settings, fit.model, num_requests=spec.sim_requests,
                                          worker_devices=worker_devices), fit=fit)
