"""How long things take: the cost model every prediction uses, and an online fit of its prefill part.

`CostModel` is a prior (from a profile, or a fit); `OnlinePrefillFit` refines its prefill
coefficients from the prefills the router observes. Both are pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, fields, replace

import numpy as np


def prior_units(prompt_tokens: int, chunk_tokens: int) -> float:
    """sum(k_i * s_i) over the chunks of a prompt of `prompt_tokens` computed `chunk_tokens` at a
    time (s_i: the prompt's tokens before chunk i, k_i its size): the attention a chunked prefill's
    queries pay over earlier chunks, read back from the KV cache; 0 in one chunk. Pure."""
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be > 0, got {chunk_tokens}")
    full, rest = divmod(max(0, prompt_tokens), chunk_tokens)
    return float(chunk_tokens * chunk_tokens * (full * (full - 1) // 2) + rest * full * chunk_tokens)


def least_prior_unit_s(per_token2_s: float) -> float:
    """The least chunked term (`per_prior_unit_s`, e) a prefill form whose quadratic is
    `per_token2_s` (c) may have: -2c, where a chunk of k tokens after s earlier ones, costing
    c*k^2 + (2c + e)*k*s, would pay nothing for its queries over them (a hair below, for rounding). Pure."""
    return -2 * per_token2_s * (1 + 1e-12)


@dataclass(frozen=True)
class CostModel:
    """Seconds as functions of token counts. Every coefficient is finite and >= 0 but
    `per_prior_unit_s`, which is >= -2 * `per_token2_s` (a chunk's queries over the earlier chunks may
    cost less than the same attention in one pass, never less than nothing), so every cost is >= 0
    and non-decreasing in its argument. A count <= 0 costs 0 s (an empty queue waits for nothing), so
    `prefill_s(0) == 0` even with a fixed cost."""

    fixed_s: float                  # prefill: per-call overhead
    per_token_s: float              # prefill: linear (MLP, projections)
    step_fixed_s: float             # decode step: overhead of one step
    step_per_seq_s: float           # decode step: each sequence in the batch
    per_token2_s: float = 0.0       # prefill: quadratic (attention over the prompt)
    transfer_fixed_s: float = 0.0   # KV transfer: per transfer
    transfer_per_token_s: float = 0.0
    local_interference_per_decode: float = 0.0  # slowdown of a local prefill per running decode
    # prefill in chunks of `chunk_tokens` (the engine's token budget; 0: one chunk whatever the
    # length): each chunk after the first costs `per_chunk_s` more (a step's overhead), and its
    # queries over the earlier chunks `per_prior_unit_s` per unit of `prior_units` more than in one
    # pass (above; >= -2 * per_token2_s; the planner's `PerfModel` fits the same term)
    chunk_tokens: int = 0
    per_chunk_s: float = 0.0
    per_prior_unit_s: float = 0.0

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            chunked = field.name == "per_prior_unit_s"
            least = least_prior_unit_s(self.per_token2_s) if chunked else 0.0
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= least):
                bound = "-2 * per_token2_s" if chunked else "0"
                raise ValueError(f"CostModel.{field.name} must be a finite number >= {bound}, got {value!r}: a "
                                 f"negative cost predicts time running backwards; fit it on measured times or set it to 0")

    def prefill_s(self, num_tokens: int) -> float:
        """Compute time of `num_tokens` prompt tokens in one prefill, alone on a prefill worker (in
        chunks of `chunk_tokens` where that is set)."""
        if num_tokens <= 0:
            return 0.0
        seconds = self.fixed_s + self.per_token_s * num_tokens + self.per_token2_s * num_tokens * num_tokens
        if self.chunk_tokens > 0 and num_tokens > self.chunk_tokens:
            extra_chunks = -(-num_tokens // self.chunk_tokens) - 1
            seconds += extra_chunks * self.per_chunk_s + self.per_prior_unit_s * prior_units(num_tokens, self.chunk_tokens)
        return seconds

    def queue_s(self, num_tokens: int, num_prompts: int, head_elapsed_s: float = 0.0, head_tokens: int = 0) -> float:
        """Compute time left in a queue of `num_prompts` prompts totalling `num_tokens` tokens, each
        its own prefill. The first, of `head_tokens` tokens (0: not known) and begun
        `head_elapsed_s` ago, costs what is left of its own prefill (none once it runs past its
        prediction); the others (all of them, the head's size not known) cost `prefill_s` of their
        mean size each. Exact for prompts of one size; for mixed sizes it is below the truth by the
        quadratic term's spread (sum n^2 >= T^2/k), where charging the queue as one prompt of T
        tokens was above it by up to k times. A caller that counts no prompts (`num_prompts` 0 with
        tokens queued) gets the queue as one prompt."""
        if 0 < head_tokens <= num_tokens and num_prompts >= 1:
            head_left_s = max(0.0, self.prefill_s(head_tokens) - max(0.0, head_elapsed_s))
            return head_left_s + self._mean_sized_s(num_tokens - head_tokens, num_prompts - 1)
        return self._mean_sized_s(num_tokens, num_prompts)

    def _mean_sized_s(self, num_tokens: float, num_prompts: int) -> float:
        if num_tokens <= 0:
            return 0.0
        return self.prefill_s(num_tokens) if num_prompts <= 1 else num_prompts * self.prefill_s(num_tokens / num_prompts)

    def decode_step_s(self, batch: int) -> float:
        """One decode step of `batch` sequences: each of them gets one token after this long."""
        if batch <= 0:
            return 0.0
        return self.step_fixed_s + self.step_per_seq_s * batch

    def kv_transfer_s(self, num_tokens: int) -> float:
        """Moving the KV of `num_tokens` tokens from a prefill worker to a decode worker."""
        if num_tokens <= 0:
            return 0.0
        return self.transfer_fixed_s + self.transfer_per_token_s * num_tokens

    def local_prefill_slowdown(self, running_decodes: int) -> float:
        """>= 1: how much longer a prefill takes on a decode worker that is also running
        `running_decodes` decodes (they share its steps) than alone."""
        return 1.0 + self.local_interference_per_decode * max(0, running_decodes)


class OnlinePrefillFit:
    """The prior's prefill curve, rescaled to the prefills the router observes: least squares of
    observed seconds on (1, prior.prefill_s(n)) over the last `window` observations.

    Contract of `model(prior)`: the prior unchanged while fewer than `min_distinct_sizes` distinct
    prompt sizes are in the window; otherwise the prior with its prefill curve p(n) replaced by
    offset + scale x p(n), both >= 0: `offset` is what serving adds to every prefill (the hops,
    the worker's API process), `scale` how much slower or faster this worker computes than the
    prior says. When the sizes are too close together to separate the two (the column-scaled
    design's condition number above `max_condition`), scale alone; when neither fits with
    non-negative terms, the prior.

    Why the prior's shape and not a free (1, n, n^2) fit: the router mostly sees the sizes its
    traffic sends (chat prompts of a few hundred tokens), and a quadratic fitted there is noise
    when carried to a 2,000-token prompt (with 30 ms of noise on prompts under 900 tokens, a free
    fit put a 2,000-token prefill anywhere from 2.5 to 7 s against a true 3.0 s, and admission
    refused what the cluster could serve). The prior (a profile's, through `--cost-model`) was
    measured over the whole context; the observations correct its level. Observe compute time
    only (no queueing), of the tokens actually computed (prompt minus cached prefix), of prompts
    that shared no engine step with another (`router.scheduler.Scheduler.computed_alone`)."""

    def __init__(self, window: int = 256, min_distinct_sizes: int = 3, max_condition: float = 1e3):
        if window < 1 or min_distinct_sizes < 2:
            raise ValueError(f"need window >= 1 and min_distinct_sizes >= 2 (a line needs two sizes), got "
                             f"{window} and {min_distinct_sizes}")
        self.min_distinct_sizes = min_distinct_sizes
        self.max_condition = max_condition
        self._observations: deque[tuple[int, float]] = deque(maxlen=window)

    def __len__(self) -> int:
        return len(self._observations)

    def observe(self, num_tokens: int, seconds: float) -> None:
        """Adds one prefill of `num_tokens` computed tokens that took `seconds`; the oldest goes when full."""
        if num_tokens < 1 or not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"an observation needs num_tokens >= 1 and finite seconds >= 0, got {num_tokens}, "
                             f"{seconds!r}")
        self._observations.append((num_tokens, float(seconds)))

    def model(self, prior: CostModel) -> CostModel:
        if len({n for n, _ in self._observations}) < self.min_distinct_sizes:
            return prior
        predicted = np.array([prior.prefill_s(n) for n, _ in self._observations])
        seconds = np.array([s for _, s in self._observations])
        fitted = _offset_and_scale(predicted, seconds, self.max_condition)
        if fitted is None:
            return prior
        offset, scale = fitted
        return replace(prior, fixed_s=offset + scale * prior.fixed_s, per_token_s=scale * prior.per_token_s,
                       per_token2_s=scale * prior.per_token2_s, per_chunk_s=scale * prior.per_chunk_s,
                       per_prior_unit_s=scale * prior.per_prior_unit_s)


def _offset_and_scale(predicted: np.ndarray, seconds: np.ndarray, max_condition: float) -> tuple[float, float] | None:
    """(offset, scale) >= 0 minimising the squared error of offset + scale x predicted, or
    (0, scale) when the two cannot be told apart or the offset would be negative; None when even
    the scale is not positive. The predicted column is scaled to its largest value, so the
    condition number measures the sizes' spread, not the units."""
    top = float(predicted.max())
    if not top > 0:
        return None
    design = np.column_stack([np.ones_like(predicted), predicted / top])
    if np.linalg.matrix_rank(design) == 2 and np.linalg.cond(design) <= max_condition:
        (offset, scale), *_ = np.linalg.lstsq(design, seconds, rcond=None)
        if offset >= 0 and scale > 0:
            return float(offset), float(scale) / top
    scale = float(predicted @ seconds / (predicted @ predicted))
    return (0.0, scale) if scale > 0 else None
