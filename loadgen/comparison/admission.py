"""What a pdserve router's admission scaled its predictions by during a run, against the requests it
admitted that then missed their SLOs.

The router publishes its calibration (`pdserve_router_admission_scale_ratio{quantity}` and
`pdserve_router_admission_calibration_observations{quantity}`, `router.policies.calibration`) and
its refusals by what decided them (`pdserve_router_admission_refusals_total{by}`); an
`AdmissionSampler` scrapes them through a run, and `admitted_misses` puts each admitted request that
missed the pair beside the TTFT calibration as it stood when the request was sent. That answers
the question an overload run leaves open: did the admitted misses come before the calibration had
learned anything (its factor the prior, 1, with few or no observations) or despite it?
`refusals_by` says which of the SLOs refused the run's refused requests.

Pure except `AdmissionSampler` (a thread and HTTP).
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field

from loadgen.metrics import SLO, meets_slo, tpot_s
from loadgen.runner import RequestRecord
from pdserve.errors import ADMISSION_REFUSED_BY, refused_by_kinds

# an admitted miss sent while the TTFT calibration held fewer than this many recent requests was decided on
# little evidence (the router's hard minimum before it pooled a prior: bench/overload.py and
# bench/calibration_warmup.py count misses by it, so runs before and after compare)
FEW_OBSERVATIONS = 16
# placement.json keys that restore that rule: the cost model alone until 16 are kept, then their quantile
OLD_RULE = {"calibration_prior": 1.0, "calibration_prior_weight": 0, "calibration_min_observations": 16}
SCALE = "pdserve_router_admission_scale_ratio"
OBSERVATIONS = "pdserve_router_admission_calibration_observations"
REFUSALS = "pdserve_router_admission_refusals_total"


@dataclass(frozen=True)
class AdmissionSample:
    """The calibration at `at_s` seconds from the run's start: quantity -> (factor, observations);
    and the router's refusals so far, by what decided them (`pdserve.errors.ADMISSION_REFUSED_BY`;
    empty from a router before that counter)."""

    at_s: float
    scales: dict[str, tuple[float, int]]
    refusals: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class AdmittedMiss:
    """An admitted request that missed the pair, and the TTFT calibration when it was sent (None:
    no sample before it)."""

    sent_s: float
    prompt_tokens: int
    ttft_s: float | None   # None: it failed
    tpot_s: float | None
    ttft_factor: float | None
    ttft_observations: int | None


def admission_scales(metrics_text: str) -> dict[str, tuple[float, int]]:
    """quantity -> (factor, observations) from a router's Prometheus text; {} when it publishes
    none (no SLO given to it, or a router before these metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    factors: dict[str, float] = {}
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            quantity = sample.labels.get("quantity")
            if sample.name == SCALE and quantity:
                factors[quantity] = sample.value
            elif sample.name == OBSERVATIONS and quantity:
                counts[quantity] = int(sample.value)
    return {q: (factors[q], counts.get(q, 0)) for q in factors}


def admission_refusals(metrics_text: str) -> dict[str, int]:
    """by -> refusals so far, from a router's Prometheus text; {} when it has refused none (a
    labelled counter shows no series before its first count)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {sample.labels["by"]: int(sample.value) for family in text_string_to_metric_families(metrics_text)
            for sample in family.samples if sample.name == REFUSALS and sample.labels.get("by")}


def refusals_by(samples: Sequence[AdmissionSample]) -> dict[str, int]:
    """The run's refusals by what decided them: the last sample's counts less the first's (a router
    started for the run counts from 0, a reused one from where it stood); {} with no samples."""
    if not samples:
        return {}
    first, last = samples[0].refusals, samples[-1].refusals
    counts = {by: last.get(by, 0) - first.get(by, 0) for by in ADMISSION_REFUSED_BY}
    return {by: count for by, count in counts.items() if count > 0}


def describe_refusals(refused: int, by: dict[str, int]) -> str:
    """"15 (tpot 12, ttft 3)": a run's refused requests and, where the router counted them, by what
    (refusals the counts do not cover, such as those before the first sample, are left unnamed)."""
    if not by:
        return str(refused)
    return f"{refused} ({refused_by_kinds(by)})"


def scale_at(samples: Sequence[AdmissionSample], at_s: float, quantity: str = "ttft") -> tuple[float, int] | None:
    """The last sample's (factor, observations) of `quantity` taken at or before `at_s`; None when
    none was."""
    before = [s for s in samples if s.at_s <= at_s and quantity in s.scales]
    return max(before, key=lambda s: s.at_s).scales[quantity] if before else None


def admitted_misses(records: Sequence[RequestRecord], samples: Sequence[AdmissionSample],
                    slo: SLO) -> list[AdmittedMiss]:
    """Every request not refused that missed `slo`, in send order, with the TTFT calibration as it
    stood when it was sent."""
    misses = []
    for record in sorted(records, key=lambda r: r.sent_s):
        if record.status == "refused" or meets_slo(record, slo):
            continue
        scale = scale_at(samples, record.sent_s)
        misses.append(AdmittedMiss(record.sent_s, record.prompt_tokens, record.ttft_s, tpot_s(record),
                                   scale[0] if scale else None, scale[1] if scale else None))
    return misses


def describe_misses(misses: Sequence[AdmittedMiss], few: int) -> str:
    """One line: how many admitted misses, and how many were sent while the TTFT calibration had
    fewer than `few` observations (learned from little: mostly its prior, or only it)."""
    if not misses:
        return "no admitted request missed"
    unknown = sum(m.ttft_observations is None for m in misses)
    early = sum(m.ttft_observations is not None and m.ttft_observations < few for m in misses)
    factors = [m.ttft_factor for m in misses if m.ttft_factor is not None]
    spread = f"; TTFT factor at their sending {min(factors):.2f}-{max(factors):.2f}" if factors else ""
    return (f"{len(misses)} admitted missed: {early} sent before the TTFT calibration had {few} "
            f"observations" + (f", {unknown} with no sample yet" if unknown else "") + spread)


@dataclass(frozen=True)
class AdmissionTotals:
    """One system's requests over several runs: how many were offered, refused, admitted and met
    the pair, and of the admitted misses how many were sent while the TTFT calibration held fewer
    than `few` observations (decided on little evidence; one sent before the first sample counts
    too: the calibration held nothing the run could see yet)."""

    system: str
    runs: int
    offered: int
    refused: int
    admitted_met: int
    missed_early: int

    @property
    def admitted(self) -> int:
        return self.offered - self.refused

    @property
    def admitted_missed(self) -> int:
        return self.admitted - self.admitted_met

    @property
    def among_admitted(self) -> float | None:
        """The share of the admitted that met the pair; None when none was admitted."""
        return self.admitted_met / self.admitted if self.admitted else None

    @property
    def good_share(self) -> float:
        """The share of the offered that met the pair (refusals are misses)."""
        return self.admitted_met / self.offered if self.offered else 0.0


def admission_totals(runs: Sequence[tuple[str, Sequence[RequestRecord], Sequence[AdmittedMiss]]], slo: SLO,
                     few: int) -> list[AdmissionTotals]:
    """Per system (sorted by name), its runs' (system, records, `admitted_misses` of them) added up."""
    by_system: dict[str, list] = {}
    for system, records, misses in runs:
        by_system.setdefault(system, []).append((records, misses))
    totals = []
    for system, own in sorted(by_system.items()):
        records = [r for run_records, _ in own for r in run_records]
        misses = [miss for _, run_misses in own for miss in run_misses]
        totals.append(AdmissionTotals(
            system, len(own), len(records), refused=sum(r.status == "refused" for r in records),
            admitted_met=sum(r.status != "refused" and meets_slo(r, slo) for r in records),
            missed_early=sum(m.ttft_observations is None or m.ttft_observations < few for m in misses)))
    return totals


class AdmissionSampler:
    """Scrapes a router's metrics every `every_s` seconds from `start()` to `stop()` (which returns
    the samples, times from `start()`). A scrape that fails is skipped: a sampler never fails a run."""

    def __init__(self, metrics_url: str, every_s: float = 0.5, timeout_s: float = 2.0):
        self.metrics_url, self.every_s, self.timeout_s = metrics_url, every_s, timeout_s
        self._samples: list[AdmissionSample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0

    def start(self) -> AdmissionSampler:
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="admission-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> tuple[AdmissionSample, ...]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s + self.every_s + 1.0)
        return tuple(self._samples)

    def _run(self) -> None:
        while not self._stop.is_set():
            at_s = time.monotonic() - self._started
            try:
                with urllib.request.urlopen(self.metrics_url, timeout=self.timeout_s) as reply:
                    text = reply.read().decode()
                scales, refusals = admission_scales(text), admission_refusals(text)
            except (OSError, ValueError):
                scales, refusals = {}, {}
            if scales:
                self._samples.append(AdmissionSample(round(at_s, 3), scales, refusals))
            self._stop.wait(self.every_s)
