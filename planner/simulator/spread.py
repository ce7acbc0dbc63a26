"""The measured spread of served latencies, drawn (`ServingCosts.first_token_spread_s`,
`decode_step_spread_s`; see `planner.profiler.spread`).

Each decode-emitting step (a decode instance's, or a colocated one's with a running batch) takes
one draw of the decode step's spread on top of its modelled duration; each request's first token
one draw of the first token's, on top of `first_token_s` (what a draw could not take from a short
step goes to the instance's next: `jittered`). A draw picks one of the recorded
quantile points uniformly. Both streams are seeded and separate, so a run is deterministic and
the first tokens' draws (one per request, in request order) do not move with the step count.
With no spread recorded every draw is 0 and the simulator charges the medians, as before.
"""

from __future__ import annotations

import random

import numpy as np

from planner.serving_costs import ServingCosts

MIN_STEP_SHARE = 0.25  # a draw may shorten a step to this share of its modelled duration, no less


class ServiceSpread:
    def __init__(self, serving: ServingCosts, seed: int = 0) -> None:
        self._steps = serving.decode_step_spread_s
        self._first = serving.first_token_spread_s
        self._step_rng = random.Random(seed)
        self._first_rng = random.Random(seed + 1)

    def step_extra_s(self) -> float:
        """The next decode step's deviation from its modelled duration, seconds."""
        return self._step_rng.choice(self._steps) if self._steps else 0.0

    def first_token_extra_s(self, count: int) -> np.ndarray:
        """One first-token deviation per request, in request order, seconds."""
        if not self._first:
            return np.zeros(count)
        return np.array([self._first_rng.choice(self._first) for _ in range(count)], dtype=float)


def jittered(duration_s: float, extra_s: float, owed_s: float = 0.0, carry: bool = True) -> tuple[float, float]:
    """`duration_s` moved by a drawn `extra_s` and by what earlier steps' draws could not take
    (`owed_s` <= 0), kept at >= MIN_STEP_SHARE of itself; returns the step's duration and what this
    one could not take (<= 0), for the next step's draw, or 0 when not `carry`
    (`SimSettings.step_spread` "carried" or "cut").

    The spread is of the clients' gaps, and gaps bunch: a token late by 8 ms makes a gap 8 ms long
    and the next 8 ms short. Cut at the floor and dropped ("cut"), the short half of a wide
    spread is lost on short steps and the draws' mean rises (on a Zen 4 EPYC's tiny-model profile,
    p10 -4.0 / p90 +6.0 ms around 4 ms steps: +0.6 ms a step, BENCHMARKS "The served step's
    spread, carried"); carried, the next step takes it, as the next gap does."""
    wanted_s = duration_s + extra_s + min(0.0, owed_s)
    floor_s = MIN_STEP_SHARE * duration_s
    return max(floor_s, wanted_s), (min(0.0, wanted_s - floor_s) if carry else 0.0)
