"""Discrete-event simulation of a workload through simulated vLLM instances, placed by the
router's own policy (disaggregated, hybrid or aggregated pools).

    result = simulate(requests, Topology.hybrid(2, 3), SimSettings.from_profile(profile), model)
    result.attainment(SLO(ttft_s=1.0, tpot_s=0.1)); result.summary(slo)
"""

from planner.simulator.config import RouterSettings, SimSettings, SimulationError
from planner.simulator.cost import cost_model_from
from planner.simulator.engine import simulate
from planner.simulator.result import SimResult
from planner.simulator.speed import DecodeSpeed
from planner.simulator.topology import Topology

__all__ = ["DecodeSpeed", "RouterSettings", "SimResult", "SimSettings", "SimulationError", "Topology", "cost_model_from",
           "simulate"]
