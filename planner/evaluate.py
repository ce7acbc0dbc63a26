"""The simulator as the search's oracle: attainment at a rate, and pool sizes for a load.

These close over a workload, the engine settings and the fitted model, and are what
`pdserve plan` and the online planner pass to `planner.search`, `planner.decision` and
`planner.model_error`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from loadgen.metrics import SLO
from loadgen.workload import RequestSpec, combine, poisson, uniform_lengths
from pdserve.roles import Topology as TopologyKind
from planner.decision import PlanFn, PredictFn, SloScale
from planner.model_error import Latencies, LatencyFn
from planner.perf_model import PerfModel
from planner.pool_sizes import PoolSizes
from planner.rate_search import SearchSettings
from planner.search import AttainmentFn, fewest_devices
from planner.simulator import SimSettings, Topology, simulate

WorkloadAt = Callable[[float], Sequence[RequestSpec]]  # rate_rps -> the requests sent at that rate


def with_router_slo(settings: SimSettings, slo: SLO) -> SimSettings:
    """`settings` whose simulated router has `slo` set (as `pdserve router --slo-ttft-ms/--slo-tpot-ms`
    would): placement aims at it and, with `RouterSettings.admission` on, admission refuses by it;
    an SLO not set in `slo` keeps the router's own (by default none)."""
    router = settings.router
    return replace(settings, router=replace(router, ttft_slo_s=slo.ttft_s or router.ttft_slo_s,
                                            tpot_slo_s=slo.tpot_s or router.tpot_slo_s))


def make_attainment_fn(workload_at: WorkloadAt, settings: SimSettings, model: PerfModel,
                       slo: SLO) -> AttainmentFn:
    """attainment(topology, rate): the share of `workload_at(rate)` meeting `slo` in simulation, the
    simulated router with `slo` set (refused requests are misses). Results are memoized per
    (topology, rate)."""
    settings = with_router_slo(settings, slo)
    cache: dict[tuple[Topology, float], float] = {}

    def attainment(topology: Topology, rate_rps: float) -> float:
        key = (topology, rate_rps)
        if key not in cache:
            cache[key] = simulate(workload_at(rate_rps), topology, settings, model).attainment(slo)
        return cache[key]

    return attainment


def synthetic_workload(num_requests: int, mean_prompt_tokens: float, mean_output_tokens: float,
                       range_ratio: float = 0.5, seed: int = 0) -> WorkloadAt:
    """Poisson arrivals at the asked rate, lengths uniform within +-range_ratio of the means."""
    lengths = uniform_lengths(num_requests, max(1, round(mean_prompt_tokens)), max(1, round(mean_output_tokens)),
                              range_ratio, seed)
    return lambda rate_rps: combine(poisson(rate_rps, num_requests, seed), lengths)


def make_plan_fn(settings: SimSettings, model: PerfModel, slo: SLO, max_devices: int,
                 search: SearchSettings = SearchSettings(), num_requests: int = 500,
                 range_ratio: float = 0.5, seed: int = 0, kind: TopologyKind = "disaggregated",
                 worker_devices: int = 1) -> PlanFn:
    """plan(rate, mean prompt, mean output, slo_scale) -> the fewest pool sizes of topology `kind`
    meeting the SLOs (each multiplied by its `slo_scale`) at that load in simulation, or None if
    none within `max_devices` does. Aggregated sizes are PoolSizes(0, K): K workers serving both
    phases, each over `worker_devices` devices (K x `worker_devices` <= `max_devices`; the model's
    engine of that width, `PerfModel.on_devices`); hybrid sizes are searched as disaggregated ones
    are, simulated with the Local path. ValueError for a width on another kind, or one not profiled."""
    _check_width(model, kind, worker_devices)

    def plan(rate_rps: float, mean_prompt_tokens: float, mean_output_tokens: float,
             slo_scale: SloScale = SloScale()) -> PoolSizes | None:
        workload_at = synthetic_workload(num_requests, mean_prompt_tokens, mean_output_tokens, range_ratio, seed)
        scaled = SLO(ttft_s=slo.ttft_s * slo_scale.ttft if slo.ttft_s else None,
                     tpot_s=slo.tpot_s * slo_scale.tpot if slo.tpot_s else None, e2el_s=slo.e2el_s)
        attainment = make_attainment_fn(workload_at, settings, model, scaled)
        pick = fewest_devices(attainment, rate_rps, max_devices, search, kinds=(kind,),
                              widths=(worker_devices,)).of(kind)
        if pick is None:
            return None
        topology = pick[0]
        if kind == "aggregated":
            return PoolSizes(prefill=0, decode=topology.num_colocated)
        return PoolSizes(prefill=topology.num_prefill, decode=topology.num_decode)

    return plan


def _check_width(model: PerfModel, kind: TopologyKind, worker_devices: int) -> None:
    if worker_devices == 1:
        return
    if kind != "aggregated":
        raise ValueError(f"workers over {worker_devices} devices serve the aggregated topology only (a {kind} "
                         "worker is one device); plan that kind alone")
    try:
        model.on_devices(worker_devices)
    except KeyError as error:
        raise ValueError(error.args[0]) from None


def make_latency_fn(settings: SimSettings, model: PerfModel, num_requests: int = 500, range_ratio: float = 0.5,
                    seed: int = 0, worker_devices: int = 1) -> LatencyFn:
    """latency(sizes, rate, mean prompt, mean output) -> simulated p50/p90 TTFT and TPOT in seconds
    of the same synthetic workload `make_plan_fn` plans with, over the requests served (as the
    routers' window holds them: a refused request has no latency); None where no request has one
    (TPOT: no output > 1 token). Sizes without a prefill pool are an aggregated cluster's; others
    are simulated disaggregated (a hybrid cluster is judged as one: its Local path is not modelled here);
    an aggregated cluster's workers each span `worker_devices` devices."""
    _check_width(model, "aggregated", worker_devices)

    def latency(sizes: PoolSizes, rate_rps: float, mean_prompt_tokens: float,
                mean_output_tokens: float) -> Latencies:
        requests = synthetic_workload(num_requests, mean_prompt_tokens, mean_output_tokens, range_ratio, seed)(rate_rps)
        topology = (Topology.aggregated(sizes.decode, devices_per_instance=worker_devices)
                    if sizes.prefill == 0  # an aggregated cluster's sizes
                    else Topology.disaggregated(sizes.prefill, sizes.decode))
        result = simulate(requests, topology, settings, model)
        ttft_p50, ttft_p90 = p50_p90(result.ttft_s)
        tpot_p50, tpot_p90 = p50_p90(result.tpot_s)
        return Latencies(ttft_p50_s=ttft_p50, ttft_p90_s=ttft_p90, tpot_p50_s=tpot_p50, tpot_p90_s=tpot_p90)

    return latency


def p50_p90(values_s: np.ndarray) -> tuple[float | None, float | None]:
    """The median and 90th percentile of the values that are not NaN; (None, None) when none is."""
    known = values_s[~np.isnan(values_s)]
    if not len(known):
        return None, None
    p50, p90 = np.percentile(known, [50, 90])
    return float(p50), float(p90)


def make_predict_fn(settings: SimSettings, model: PerfModel, num_requests: int = 500, range_ratio: float = 0.5,
                    seed: int = 0, worker_devices: int = 1) -> PredictFn:
    """predict(sizes, rate, mean prompt, mean output) -> the p90s of `make_latency_fn`: simulated
    (TTFT p90, TPOT p90) in seconds (TPOT None if no output > 1 token)."""
    latency = make_latency_fn(settings, model, num_requests, range_ratio, seed, worker_devices)

    def predict(sizes: PoolSizes, rate_rps: float, mean_prompt_tokens: float,
                mean_output_tokens: float) -> tuple[float | None, float | None]:
        latencies = latency(sizes, rate_rps, mean_prompt_tokens, mean_output_tokens)
        return latencies.ttft_p90_s, latencies.tpot_p90_s

    return predict
