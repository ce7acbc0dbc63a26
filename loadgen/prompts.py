"""Prompt synthesis: turn a `RequestSpec`'s token counts into the token ids a target is sent.

Prompts are token ids, not text, so the server sees exactly `prompt_tokens` tokens without a
tokenizer round trip (vLLM's /v1/completions and pdserve's gRPC API both accept token ids).
Ids are drawn uniformly from [token_id_low, token_id_high): the default range is valid for any
byte-level tokenizer (every such vocabulary has at least 256 entries).

Determinism and caching: request i's ids depend only on (seed, i), and a shared-prefix group g's
prefix only on (seed, g), so two runs with the same seed send identical prompts, requests of one
group share exactly `prefix_tokens` leading ids, and distinct requests share no prefix by design.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from loadgen.workload import RequestSpec

_PREFIX_STREAM = 1  # separates the prefix random streams from the per-request ones
_REQUEST_STREAM = 2
_WARMUP_STREAM = 3


@dataclass(frozen=True)
class Prompt:
    """What a target sends for one request."""

    token_ids: tuple[int, ...]
    max_tokens: int  # the target asks for exactly this many output tokens (ignore_eos, min_tokens)


@dataclass(frozen=True)
class PromptSynthesizer:
    seed: int = 0
    token_id_low: int = 10
    token_id_high: int = 250

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if not 0 <= self.token_id_low < self.token_id_high:
            raise ValueError(
                f"token id range [{self.token_id_low}, {self.token_id_high}) is empty or negative: "
                "pick 0 <= low < high <= the model's vocab_size"
            )

    def prompt(self, spec: RequestSpec, index: int, warmup: bool = False) -> Prompt:
        """Request `index`'s (>= 0) prompt: the group's shared prefix (if any) then unique ids.
        Warm-up prompts come from a separate random stream and never carry a group prefix, so
        they warm no prefix the measured requests could hit."""
        if spec.prefix_group is None or warmup:
            stream = _WARMUP_STREAM if warmup else _REQUEST_STREAM
            return Prompt(self._ids((self.seed, stream, index), spec.prompt_tokens), spec.output_tokens)
        prefix = self._ids((self.seed, _PREFIX_STREAM, spec.prefix_group), spec.prefix_tokens)
        suffix = self._ids((self.seed, _REQUEST_STREAM, index), spec.prompt_tokens - spec.prefix_tokens)
        return Prompt(token_ids=prefix + suffix, max_tokens=spec.output_tokens)

    def _ids(self, key: tuple[int, int, int], count: int) -> tuple[int, ...]:
        rng = np.random.default_rng(list(key))
        return tuple(int(i) for i in rng.integers(self.token_id_low, self.token_id_high, size=count))
