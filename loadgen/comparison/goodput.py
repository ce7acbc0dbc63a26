"""Goodput per system and SLO pair from the runs of a comparison (pure): which runs count (quiet
ones), the attainment curves, the goodput on the rate grid, the ratios to system A, and when a
system is settled (higher rates only cost time)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loadgen.metrics import SLO
from loadgen.runner import RunResult
from loadgen.sweep import goodput_on_grid

if TYPE_CHECKING:
    from loadgen.comparison.config import CompareConfig

NOISY_OTHER_CORES = 0.25  # other processes averaging more than this during a run make it "noisy"


@dataclass(frozen=True)
class SLOPair:
    name: str  # "tight" / "loose"
    slo: SLO

    def describe(self) -> str:
        return f"TTFT <= {self.slo.ttft_s * 1000:g} ms, TPOT <= {self.slo.tpot_s * 1000:g} ms"


@dataclass(frozen=True)
class Measurement:
    system: str  # "A", "B", "B-tcp" or "C"
    rate_rps: float
    result: RunResult
    summaries: dict[str, dict[str, Any]]  # SLO pair name -> loadgen.metrics.summarize(...)
    other_load_cores: float  # CPU other processes used during the run (loadgen.proc_cpu.OtherLoad)
    restarted: bool  # the system was found dead before this run and restarted
    attempts: int = 1  # > 1: earlier attempts were noisy and measured again (this is the quietest)
    kv_producer_cpu_s: float | None = None  # pdserve: CPU of the prefill worker's KV server threads during the run
    host_ms_per_product: float | None = None  # the machine's speed just before the run (loadgen.host_probe); None: unchecked
    host_product: str = "float32"  # which product that check timed (loadgen.host_probe.PRODUCTS)
    host_wake_us: float | None = None  # the cross-core wake-up round trip just before the run (loadgen.host_probe)
    admission: tuple = ()  # pdserve with SLOs: its router's calibration through the run (loadgen.comparison.admission)


@dataclass(frozen=True)
class Skipped:
    """A (system, rate) point not measured, and why (the time budget)."""

    system: str
    rate_rps: float
    reason: str


def attainment_curves(measurements: Sequence[Measurement], pair: str) -> dict[str, list[tuple[float, float]]]:
    """system -> [(rate, attainment)] sorted by rate."""
    curves: dict[str, list[tuple[float, float]]] = {}
    for m in sorted(measurements, key=lambda m: (m.system, m.rate_rps)):
        curves.setdefault(m.system, []).append((m.rate_rps, m.summaries[pair]["slo_attainment"]))
    return curves


def is_noisy(m: Measurement) -> bool:
    return m.other_load_cores > NOISY_OTHER_CORES


def quiet_runs(measurements: Sequence[Measurement]) -> list[Measurement]:
    """The runs goodput is computed from: each system's quiet runs (a run during which other
    processes took more than NOISY_OTHER_CORES of the two cores measured them, not the system);
    a system without any quiet run keeps all of its runs."""
    kept = []
    for system in sorted({m.system for m in measurements}):
        runs = [m for m in measurements if m.system == system]
        kept += [m for m in runs if not is_noisy(m)] or runs
    return kept


def goodputs(measurements: Sequence[Measurement], pairs: Sequence[SLOPair],
             target: float) -> dict[str, dict[str, tuple[float, bool]]]:
    """pair -> system -> (goodput_rps, bracketed), from each system's quiet runs on the rate grid."""
    return {p.name: {system: goodput_on_grid(curve, target)
                     for system, curve in attainment_curves(quiet_runs(measurements), p.name).items()}
            for p in pairs}


def is_vllm(system: str) -> bool:
    """A, or an A-<n> (vLLM with --max-num-batched-tokens n)."""
    return system == "A" or system.startswith("A-")


def best_vllm(by_system: dict[str, tuple[float, bool]]) -> tuple[str, tuple[float, bool]] | None:
    """A*: the vLLM system with the highest goodput under one SLO pair, and its goodput; None
    when no vLLM system was measured."""
    candidates = {s: v for s, v in by_system.items() if is_vllm(s)}
    if not candidates:
        return None
    name = max(candidates, key=lambda s: (candidates[s][0], s == "A"))
    return name, candidates[name]


def ratio(b_rps: float, a_rps: float) -> float | None:
    """B/A; None when both are 0, inf when only A is."""
    if a_rps == 0:
        return None if b_rps == 0 else float("inf")
    return b_rps / a_rps


def format_goodput(value: tuple[float, bool], rates: Sequence[float]) -> str:
    goodput_rps, bracketed = value
    if bracketed:
        return f"{goodput_rps:.2f}"
    return f"< {min(rates):g}" if goodput_rps == 0 else f">= {goodput_rps:g}"


def settled(measurements: Sequence[Measurement], system: str, config: CompareConfig) -> bool:
    """True once `system` missed `config.attainment_target` under the loose SLO pair (the last of
    `config.slo_pairs`, and so under every pair) in `config.stop_after_failures` quiet runs: its
    goodput is known, higher rates only cost time."""
    loose = config.slo_pairs[-1].name
    misses = sum(m.system == system and m.summaries[loose]["slo_attainment"] < config.attainment_target
                 for m in quiet_runs(measurements))
    return misses >= config.stop_after_failures
