"""Sizing the prefill and decode pools against TTFT/TPOT goodput targets.

Offline: `profile` (the measured tables, a versioned JSON file) -> `perf_model` (fitted
functional forms) -> `simulator` (discrete-event replay of a workload through N prefill +
M decode instances, or colocated instances) -> `search` (goodput per device over pool splits).
Online: `decision.decide` (pure: observed load in, target pool sizes out) drives an
`actuators.base.Actuator`.
"""
