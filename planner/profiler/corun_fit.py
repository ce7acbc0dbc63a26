"""The pure half of the co-run probe (`planner.profiler.corun_probe`, which measures): the plan of
its rounds and the stretches the profile keeps from them. No I/O: plain values in and out.

Each round times the prompt and the decode step alone, then together (each beside the other
engine's work), then alone again. Each together is compared with the mean of the alones around
it, so a host whose speed drifts moves both sides of the ratio. A round whose two alones of either
kind differ by more than `DRIFT_TOLERANCE` drifted while measured: it does not count
(`steady_round`), and while fewer than `CorunPlan.rounds` rounds are steady the probe runs more, at
most `CorunPlan.max_rounds` in all (`more_rounds_needed`). An AMX Xeon VM whose speed moved 1.46x
during its profile kept a prompt's stretch of 1.60x from three unbracketed rounds; five rounds on
the same VM after measured 1.01x, and the validation resimulated with it had its 1P+1D TTFT p50
errors fall from 44-166% to 10-37% (BENCHMARKS, "Across shapes on an AMX Xeon over shm").
`corun_stretches` turns the rounds into the profile's two ratios: the median over the steady rounds
(all of them if none is) of together / alone (`ServingCosts.corun_prefill_stretch`,
`corun_decode_stretch`), `chargeable_stretch` what the profile keeps of each.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from planner.serving_costs import CORUN_RANGE


@dataclass(frozen=True)
class CorunPlan:
    prompt_tokens: int = 1024
    batch: int = 16
    context_tokens: int = 256   # per request of a measured decode run
    decode_steps: int = 48
    repeats: int = 3            # prefills per prompt measurement
    rounds: int = 3             # steady rounds wanted (`steady_round`)
    hold_context_tokens: int = 64   # per request of the batch the decode side keeps decoding beside a prompt
    hold_tokens: int = 512          # ... and each request's length before the batch starts again
    max_rounds: int = 6             # rounds in all, steady or not, before the probe keeps what it has

    @property
    def steps(self) -> int:
        """Progress steps: the two engines up, then six measurements a round (more where rounds drift)."""
        return 1 + 6 * self.rounds


def corun_plan(max_model_len: int, max_num_seqs: int, kv_tokens: int, quick: bool) -> CorunPlan:
    """The profile's plan: a prompt of 1,024 tokens (the trace's typical length; 256 `quick`) within
    the context, 16 decoding requests (at most `max_num_seqs`), 3 rounds. Beside a
    prompt the decode side keeps a batch of short prompts decoding, up to 512 tokens each (within
    the context and the `kv_tokens` the KV cache holds, so nothing is preempted): its prefills are a
    small part of its time. `quick` keeps three rounds of three prefills: a median of one round is
    one hiccup of a shared host (a quick profile once measured a 256-token prompt 2.5x its time
    alone)."""
    prompt = min(256 if quick else 1024, max_model_len - 1)
    batch = max(1, min(16, max_num_seqs))
    context = max(1, min(256, max_model_len - 64))
    hold_context = max(1, min(64, max_model_len // 4))
    hold = max(2, min(512, max_model_len - hold_context - 1, kv_tokens // batch - hold_context - 1))
    return CorunPlan(prompt, batch, context, 16 if quick else 48, 3, 3, hold_context, hold, max_rounds=6)


@dataclass(frozen=True)
class CorunRound:
    prompt_alone_s: float
    prompt_together_s: float
    step_alone_s: float
    step_together_s: float
    tokens_beside: int = 0    # tokens the other engine's held batch decoded during the prompt's measurement
    prompts_beside: int = 0   # prompts the other engine computed during the decode's
    prompt_alone_after_s: float = 0.0   # the prompt alone again after the together measurements (0: not measured)
    step_alone_after_s: float = 0.0     # the decode step alone again (0: not measured)

    @property
    def prompt_ratio(self) -> float:
        """The prompt's time together over the mean of its times alone around it."""
        return self.prompt_together_s / _bracketed(self.prompt_alone_s, self.prompt_alone_after_s)

    @property
    def step_ratio(self) -> float:
        """The decode step's time together over the mean of its times alone around it."""
        return self.step_together_s / _bracketed(self.step_alone_s, self.step_alone_after_s)


def _bracketed(before_s: float, after_s: float) -> float:
    return (before_s + after_s) / 2 if after_s > 0 else before_s


DRIFT_TOLERANCE = 0.15   # the two alones of a steady round differ by at most this share


def steady_round(r: CorunRound, tolerance: float = DRIFT_TOLERANCE) -> bool:
    """Whether the host held its speed through round `r`: each kind's time alone after the together
    measurements within `tolerance` of its time alone before (a round without the second alones,
    an older probe's, counts as steady: nothing says otherwise)."""
    return all(after <= 0 or abs(after / before - 1) <= tolerance
               for before, after in ((r.prompt_alone_s, r.prompt_alone_after_s),
                                     (r.step_alone_s, r.step_alone_after_s)))


def more_rounds_needed(rounds: list[CorunRound], wanted: int, most: int) -> bool:
    """Whether to measure another round: fewer than `wanted` are steady and fewer than `most` ran."""
    return sum(map(steady_round, rounds)) < wanted and len(rounds) < most


def corun_stretches(rounds: list[CorunRound]) -> tuple[float, float]:
    """(prompt, decode step): the median over the steady rounds (`steady_round`; all of `rounds`
    where none is) of each one's time together over its times alone around it."""
    if not rounds:
        raise ValueError("no co-run rounds were measured")
    kept = [r for r in rounds if steady_round(r)] or rounds
    return statistics.median(r.prompt_ratio for r in kept), statistics.median(r.step_ratio for r in kept)


def chargeable_stretch(measured: float) -> float:
    """The stretch the profile keeps for a `measured` one: within `CORUN_RANGE`, rounded to 4
    places. Outside it the measurement is broken (a host that stalled one side), and the bound is
    closer to the truth than the number; the profile's note shows both."""
    low, high = CORUN_RANGE
    return round(min(high, max(low, measured)), 4)
