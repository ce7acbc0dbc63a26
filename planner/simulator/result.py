"""What a simulation returns: every request's timeline as arrays, and the metrics loadgen reports.

Definitions match `vllm bench serve` and `loadgen.metrics`: TTFT = arrival to first token (out
of prefill when disaggregated); E2EL = arrival to last token; TPOT = (E2EL - TTFT)/(output - 1),
for outputs > 1 (0 for SLO checks otherwise); ITL = gaps between consecutive tokens, pooled.
The simulator's "arrival" is the send time of loadgen. `delivery_s` (the profile's serving
`first_token_s`) is what the router and the hops add to the first token and, alike, to the last:
it lengthens TTFT and E2EL and leaves TPOT as the engines make it.

A request the router's admission refused (`refused`; loadgen's status "refused", HTTP 429 /
RESOURCE_EXHAUSTED) has no latencies: its times and TTFT/TPOT/E2EL are NaN. As in
`loadgen.metrics.summarize` it is `failed` (and `refused`), not `completed`; latency distributions
and throughputs are over the served requests; SLO attainment is over every request sent (a refused
one misses) and `admitted_slo_attainment` over the ones not refused; goodput counts good requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loadgen.metrics import DEFAULT_PERCENTILES, SLO, distribution_ms
from planner.simulator.state import ItlLog, SimRequest
from planner.simulator.topology import Topology

TIMELINE = ("arrival_s", "prefill_start_s", "first_token_s", "handed_off_s", "transfer_start_s", "transfer_end_s",
            "first_decode_token_s", "finish_s")
NOT_PLACED = -1  # `decode_instance` of a refused request


@dataclass(frozen=True, eq=False)
class SimResult:
    """Arrays are indexed like the input workload. `busy_s` is each instance's total step time."""

    topology: Topology
    timeline: dict[str, np.ndarray]  # TIMELINE name -> seconds per request (NaN: not reached, or refused)
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    refused: np.ndarray  # bool per request: refused at arrival by the router's admission
    itl_step_s: np.ndarray  # decode step durations ...
    itl_weight: np.ndarray  # ... and how many requests saw each one as an inter-token gap
    busy_s: dict[str, list[float]]
    delivery_s: float | np.ndarray = 0.0  # serving latency added to what the client sees: one, or one per request
    # where the router placed each request: its path's decode-side instance (a one-token request
    # prefilled elsewhere never reaches it; NOT_PLACED: refused), and whether that instance
    # computed the prompt (Local; False for a refused request)
    decode_instance: np.ndarray | None = None
    local_prefill: np.ndarray | None = None
    # every prefill instance's step as it started, one row each: start s, duration s (what the
    # instance was busy: stretches and serving CPU in), the model's step s, the decode batch
    # stepping beside it (the tokens of the decode instances' running steps); (0, 4) without any
    prefill_steps: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))
    # every decode instance's step (disaggregated), one row each: start s, duration s, the model's
    # step plus the served line s (the traced steps' yardstick, `validation_step_report.model_and_served`,
    # whatever `served_step` charges), batch, joins
    decode_steps: np.ndarray = field(default_factory=lambda: np.zeros((0, 5)))

    @classmethod
    def from_requests(cls, requests: list[SimRequest], topology: Topology, itl: ItlLog,
                      busy_s: dict[str, list[float]], delivery_s: float | np.ndarray = 0.0,
                      prefill_steps: Sequence[tuple[float, float, float, int]] = (),
                      decode_steps: Sequence[tuple[float, float, float, int, int]] = ()) -> "SimResult":
        timeline = {name: np.array([getattr(r, name) for r in requests], dtype=float) for name in TIMELINE}
        return cls(topology, timeline,
                   prompt_tokens=np.array([r.prompt_tokens for r in requests], dtype=np.int64),
                   output_tokens=np.array([r.output_tokens for r in requests], dtype=np.int64),
                   refused=np.array([r.refused for r in requests], dtype=bool),
                   itl_step_s=np.array(itl.step_s, dtype=float), itl_weight=np.array(itl.weight, dtype=np.int64),
                   busy_s=busy_s, delivery_s=delivery_s,
                   decode_instance=np.array([NOT_PLACED if r.refused else r.decode_instance for r in requests],
                                            dtype=np.int64),
                   local_prefill=np.array([not r.refused and r.prefill_instance is None for r in requests],
                                          dtype=bool),
                   prefill_steps=np.array(prefill_steps, dtype=float).reshape(-1, 4),
                   decode_steps=np.array(decode_steps, dtype=float).reshape(-1, 5))

    @property
    def num_requests(self) -> int:
        """Every request sent, refused ones included."""
        return len(self.prompt_tokens)

    @property
    def served(self) -> np.ndarray:
        """Per request: the router admitted it (it ran to its last token)."""
        return ~self.refused

    @property
    def ttft_s(self) -> np.ndarray:
        """NaN for a refused request, as are `e2el_s` and `tpot_s`."""
        return self.timeline["first_token_s"] + self.delivery_s - self.timeline["arrival_s"]

    @property
    def e2el_s(self) -> np.ndarray:
        return self.timeline["finish_s"] + self.delivery_s - self.timeline["arrival_s"]

    @property
    def tpot_s(self) -> np.ndarray:
        """(E2EL - TTFT)/(output - 1); NaN for one-token outputs."""
        decode_s = self.timeline["finish_s"] - self.timeline["first_token_s"]
        steps = (self.output_tokens - 1).astype(float)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(steps > 0, decode_s / np.maximum(steps, 1), np.nan)

    @property
    def itl_s(self) -> np.ndarray:
        """Every inter-token gap: the handoff gaps (first -> second token) and the decode steps."""
        multi = (self.output_tokens > 1) & self.served
        handoff = (self.timeline["first_decode_token_s"] - self.timeline["first_token_s"])[multi]
        return np.concatenate([handoff, np.repeat(self.itl_step_s, self.itl_weight)])

    def handoff_split_ms(self) -> dict[str, float | None]:
        """Over the served requests of two tokens or more whose KV was pulled (not computed where
        they decode), the mean handoff split where the decode worker's join trace splits it
        (`planner.validation_joins`): `mean_handoff_hops_ms`, first token to the Decode call
        reaching the decode instance, and `mean_handoff_inside_ms`, from there to the first decode
        token (the step running, the pull, the join step), and `median_handoff_hops_ms`, the hops'
        median (what the trace's way in is compared with). None where no request pulled."""
        pulled = self.served & (self.output_tokens > 1) & ~self.local_prefill
        if not pulled.any():
            return {"mean_handoff_hops_ms": None, "mean_handoff_inside_ms": None, "median_handoff_hops_ms": None}
        t = self.timeline
        hops = (t["handed_off_s"] - t["first_token_s"])[pulled]
        inside = (t["first_decode_token_s"] - t["handed_off_s"])[pulled]
        return {"mean_handoff_hops_ms": float(hops.mean()) * 1e3, "mean_handoff_inside_ms": float(inside.mean()) * 1e3,
                "median_handoff_hops_ms": float(np.median(hops)) * 1e3}

    @property
    def duration_s(self) -> float:
        """First arrival to the last answer, the run's duration as loadgen measures it: a served
        request's last token, or a refused one's refusal (at its arrival)."""
        if self.num_requests == 0:
            return 0.0
        arrival_s = self.timeline["arrival_s"]
        answered_s = np.where(self.refused, arrival_s, self.timeline["finish_s"])
        return float(answered_s.max() - arrival_s.min())

    def meets_slo(self, slo: SLO) -> np.ndarray:
        """Per request: served and meets every SLO set (limits inclusive; one-token outputs have
        TPOT 0). A refused request never does."""
        good = self.served.copy()
        tpot = np.nan_to_num(self.tpot_s, nan=0.0)
        for values, limit in ((self.ttft_s, slo.ttft_s), (tpot, slo.tpot_s), (self.e2el_s, slo.e2el_s)):
            if limit is not None:
                good &= values <= limit
        return good

    def attainment(self, slo: SLO) -> float:
        """The share of every request sent that met `slo` (a refused one misses), as loadgen's."""
        return float(self.meets_slo(slo).mean()) if self.num_requests else 0.0

    def summary(self, slo: SLO | None = None, percentiles=DEFAULT_PERCENTILES) -> dict[str, Any]:
        """loadgen's summary keys (vLLM's names) for the simulated run, and `local_prefill_share`."""
        duration = self.duration_s or 1.0
        served = self.served
        num_served = int(served.sum())
        output_tokens = int(self.output_tokens[served].sum())
        out: dict[str, Any] = {
            "duration": duration,
            "num_prompts": self.num_requests,
            "completed": num_served,
            "failed": self.num_requests - num_served,
            "refused": self.num_requests - num_served,
            "total_input_tokens": int(self.prompt_tokens[served].sum()),
            "total_output_tokens": output_tokens,
            "request_throughput": num_served / duration,
            "output_throughput": output_tokens / duration,
            "request_goodput": None,
            "slo_attainment": None,
            "admitted_slo_attainment": None,
            # the simulator's own: the share of served prompts the router had a decode instance compute
            "local_prefill_share": float(self.local_prefill[served].mean()) if num_served else 0.0,
        }
        if slo is not None and slo.is_set:
            good = self.meets_slo(slo)
            out["request_goodput"] = float(good.sum()) / duration
            out["slo_attainment"] = self.attainment(slo)
            out["admitted_slo_attainment"] = float(good[served].mean()) if num_served else 0.0
        out |= self.handoff_split_ms()
        tpot = self.tpot_s[served]
        out |= distribution_ms("ttft", self.ttft_s[served], percentiles)
        out |= distribution_ms("tpot", tpot[~np.isnan(tpot)], percentiles)
        out |= distribution_ms("itl", self.itl_s, percentiles)
        out |= distribution_ms("e2el", self.e2el_s[served], percentiles)
        return out
