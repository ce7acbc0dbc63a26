"""Sizing the prefill and decode pools against TTFT/TPOT goodput targets.

Offline: `profile` (the measured tables, a versioned JSON file) -> `perf_model` (fitted
functional forms) -> `simulator` (discrete-event replay of a workload through disaggregated,
hybrid or aggregated pools, placed by the router's own policy) -> `search` (goodput per device
over topologies, pool sizes and the hybrid local prefill cap) -> `router_config` (the router's
cost and placement files for the pick).
Online: `decision.decide` (pure: observed load in, target pool sizes out) drives an
`actuators.base.Actuator`.
"""
