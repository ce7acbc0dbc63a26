"""One `--seed`, independent random streams: every purpose randomness serves draws from its own
generator, `numpy.random.default_rng([seed, stream, *keys])`.

Why: two draws from `default_rng(seed)` for different purposes are the *same* bit stream, so a
shared-prefix group drawn with integers(0, K) from the seed that also drew the suffix lengths is
a function of the length (K=4: group 0 gets the shortest suffixes), and gamma gaps drawn from the
seed of the lengths are correlated with them. Seed sequences built from distinct entropy lists are
statistically independent (numpy's `SeedSequence` hashes the whole list), so each stream below
is independent of every other for any seed.

Contract: a stream's number never changes once released (it would change every seeded workload),
and numbers are never reused for another purpose.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np


class Stream(IntEnum):
    PROMPT_PREFIX = 1  # a shared-prefix group's prefix token ids (key: the group)
    PROMPT_REQUEST = 2  # a request's own token ids (key: the request index)
    PROMPT_WARMUP = 3  # a warm-up request's token ids (key: its index)
    ARRIVALS = 4  # inter-arrival gaps
    LENGTHS = 5  # prompt / output lengths
    PREFIX_GROUPS = 6  # which system prompt a shared-prefix request gets
    TEXT_FILL = 7  # ids appended when a text prompt re-encodes short (keys: warm-up 0/1, index)


def rng(seed: int, stream: Stream, *keys: int) -> np.random.Generator:
    """The generator for `stream` (and optional integer keys, e.g. a request index) under `seed`
    (an integer >= 0). Same arguments, same draws."""
    if seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed}")
    return np.random.default_rng([seed, int(stream), *keys])
