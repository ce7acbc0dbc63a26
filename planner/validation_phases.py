"""Where a prediction goes wrong: a request's latency split into the phases both the real cluster
and the simulator can time, measured against simulated, per rate.

The phases, in seconds per request (a request that has no such phase has NaN):
- `queue`: arrival at the router to its prompt's first engine step (the router's dispatch queue
  and the engine's own; measured: the router's `queued_s`; simulated: prefill start - arrival);
- `prefill`: from there to the first token at the client (hops and prefill compute, on whichever
  path computed it; measured: client TTFT - `queued_s`; simulated: first token + delivery -
  prefill start);
- `first_gap`: first token to second at the client (the handoff: Decode RPC, KV pull, admission,
  the first decode step; in a colocated engine its next step);
- `steady_gap`: the mean gap after the second token, (last - second) / (output - 2), for outputs of
  three tokens or more: the served decode step under the load of the moment.
TTFT = queue + prefill; TPOT = (first_gap + (output - 2) x steady_gap) / (output - 1).

Measured values come from loadgen's records (the client's chunk times, the router's per-phase
timings); a record whose chunks carry several tokens each makes its gaps approximate. Each side's
percentiles are over its own requests that have the phase (a refused or failed one has none).
The measured queue misses one wait the simulated one holds: vLLM stamps a request queued when its
engine core takes it in between steps, so the wait behind a step already running lands in the
measured prefill. Compare queue + prefill (TTFT) where a queue forms behind long steps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from planner.evaluate import p50_p90

PHASES = ("queue", "prefill", "first_gap", "steady_gap")
PHASE_TITLES = {"queue": "queue", "prefill": "prefill (+hops)", "first_gap": "first gap (handoff)",
                "steady_gap": "steady decode gap"}


def measured_phases(records: Sequence, count: int) -> dict[str, list[float]]:
    """Per phase, one value per sent request in index order (`record.index`), NaN where the record
    lacks it (failed, refused, no per-phase timings, too few tokens). `records`: loadgen's
    `RequestRecord`s (ok ones have `chunk_times_s` from sending; `phases.queued_s`)."""
    out = {phase: [math.nan] * count for phase in PHASES}
    for record in records:
        if not record.ok or not record.chunk_times_s or not 0 <= record.index < count:
            continue
        times, i = record.chunk_times_s, record.index
        if record.phases is not None:
            out["queue"][i] = record.phases.queued_s
            out["prefill"][i] = times[0] - record.phases.queued_s
        if len(times) >= 2:
            out["first_gap"][i] = times[1] - times[0]
        if len(times) >= 3 and record.output_tokens >= 3:
            out["steady_gap"][i] = (times[-1] - times[1]) / (record.output_tokens - 2)
    return out


def measured_local_share(records: Sequence) -> float | None:
    """The share of served requests whose prompt the decode worker computed itself (a hybrid's Local
    path: `phases.disaggregated` False), over the ok records that carry per-phase timings; None
    when none does. The simulator's counterpart is its summary's `local_prefill_share`: where the
    two differ, the simulated router placed otherwise than the real one."""
    known = [record.phases.disaggregated for record in records if record.ok and record.phases is not None]
    return sum(not d for d in known) / len(known) if known else None


def simulated_phases(timeline: Mapping[str, np.ndarray], output_tokens: np.ndarray,
                     delivery_s: float | np.ndarray = 0.0) -> dict[str, np.ndarray]:
    """The same phases from a `SimResult`'s timeline (NaN for a refused request and where the phase
    does not exist), `delivery_s` its serving latency on the first token."""
    arrival, start = timeline["arrival_s"], timeline["prefill_start_s"]
    first, first_decode, finish = timeline["first_token_s"], timeline["first_decode_token_s"], timeline["finish_s"]
    outputs = output_tokens.astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"queue": start - arrival,
                "prefill": first + delivery_s - start,
                "first_gap": np.where(outputs >= 2, first_decode - first, np.nan),
                "steady_gap": np.where(outputs >= 3, (finish - first_decode) / np.maximum(outputs - 2, 1), np.nan)}


@dataclass(frozen=True)
class PhaseRow:
    """One phase at one rate: p50 and p90 in seconds, measured and simulated (None: no request has it)."""

    phase: str
    measured_p50_s: float | None
    measured_p90_s: float | None
    simulated_p50_s: float | None
    simulated_p90_s: float | None

    def error(self, which: str) -> float | None:
        """(simulated - measured) / measured of "p50" or "p90"; None where either is missing or 0."""
        measured, simulated = getattr(self, f"measured_{which}_s"), getattr(self, f"simulated_{which}_s")
        if measured is None or simulated is None or measured <= 0:
            return None
        return (simulated - measured) / measured

    def as_dict(self) -> dict:
        return {"phase": self.phase, "measured_p50_ms": _ms(self.measured_p50_s),
                "measured_p90_ms": _ms(self.measured_p90_s), "simulated_p50_ms": _ms(self.simulated_p50_s),
                "simulated_p90_ms": _ms(self.simulated_p90_s)}


def phase_rows(measured: Mapping[str, Sequence[float]], simulated: Mapping[str, np.ndarray]) -> tuple[PhaseRow, ...]:
    """Each phase's p50/p90 on both sides."""
    rows = []
    for phase in PHASES:
        m50, m90 = p50_p90(np.asarray(measured.get(phase, ()), dtype=float))
        s50, s90 = p50_p90(np.asarray(simulated.get(phase, ()), dtype=float))
        rows.append(PhaseRow(phase, m50, m90, s50, s90))
    return tuple(rows)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)
