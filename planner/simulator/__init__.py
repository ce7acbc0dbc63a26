"""Discrete-event simulation of a workload through simulated vLLM instances.

    result = simulate(requests, Topology.disaggregated(2, 3), SimSettings.from_profile(profile), model)
    result.attainment(SLO(ttft_s=1.0, tpot_s=0.1)); result.summary(slo)
"""

from planner.simulator.config import SimSettings, SimulationError, Topology
from planner.simulator.engine import simulate
from planner.simulator.result import SimResult

__all__ = ["SimResult", "SimSettings", "SimulationError", "Topology", "simulate"]
