"""Whether a rate the search found can be served for longer than the requests it simulated.

The search simulates a finite set of requests (`pdserve plan --num-prompts`). When the prompts
arrive faster than the pool can compute them, a queue grows for as long as they keep arriving; a
short set ends before the queue pushes its TTFTs past the SLO, so the simulated attainment can
hold at a rate no pool sustains (seen: 40 trace prompts met a 3 s TTFT at 6.25 req/s on one
prefill core that computes 4 of them per second). `prefill_load` is the share of the prefilling
engines' time the prompts alone need over the window they arrive in: above 1 the rate holds only
for a burst of that length, whatever the schedule (decode work, which aggregated engines also do,
only adds to it).
"""

from __future__ import annotations

from collections.abc import Sequence

from loadgen.workload import RequestSpec
from planner.perf_model import PerfModel
from planner.simulator.topology import Topology


def prefill_load(requests: Sequence[RequestSpec], topology: Topology, model: PerfModel, chunk_tokens: int) -> float:
    """sum over prompts of their prefill time alone (chunked by `chunk_tokens`, on the model of the
    topology's engine width), over (engines that compute prompts x the arrival window). The window
    is the arrivals' span stretched by N / (N - 1), the mean gap the last arrival is owed; 0 for
    fewer than two requests. Engines that compute prompts: the prefill pool, plus every decode
    worker of a hybrid pool (each may prefill locally), or every aggregated worker."""
    if len(requests) < 2:
        return 0.0
    arrivals = [r.arrival_s for r in requests]
    window_s = (max(arrivals) - min(arrivals)) * len(requests) / (len(requests) - 1)
    if window_s <= 0:
        return float("inf")
    engine = model.on_devices(topology.devices_per_instance)
    work_s = sum(engine.prefill_s(r.prompt_tokens, chunk_tokens) for r in requests)
    if topology.kind == "aggregated":
        engines = topology.num_colocated
    elif topology.kind == "hybrid":
        engines = topology.num_prefill + topology.num_decode
    else:
        engines = topology.num_prefill
    return work_s / (engines * window_s)
