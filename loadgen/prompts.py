"""Prompt synthesis: turn a `RequestSpec`'s token counts into the token ids a target is sent.

Prompts are token ids, so the server sees exactly `prompt_tokens` tokens without a tokenizer
round trip (vLLM's /v1/completions and pdserve's gRPC API both accept token ids). Ids are drawn
uniformly from [token_id_low, token_id_high): the default range is valid for any byte-level
tokenizer (every such vocabulary has at least 256 entries). Given a tokenizer, each prompt also
carries text of the same token length (`loadgen.text_prompts`), for targets that send text: the
ids are then drawn from that range's `text_safe_ids` (pass the whole vocabulary as the range, as
vLLM draws), and a prompt's `token_ids` are what its text encodes to.

Determinism and caching: request i's ids depend only on (seed, i), and a shared-prefix group g's
prefix only on (seed, g), so two runs with the same seed send identical prompts, requests of one
group share exactly `prefix_tokens` leading ids, and distinct requests share no prefix by design.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loadgen.seeds import Stream, rng
from loadgen.text_prompts import exact_length_text, text_safe_ids
from loadgen.workload import RequestSpec


@dataclass(frozen=True)
class Prompt:
    """What a target sends for one request."""

    token_ids: tuple[int, ...]
    max_tokens: int  # the target asks for this many output tokens (exactly, with vLLM's ignore_eos, min_tokens)
    text: str | None = None  # the prompt as text (encodes to token_ids); None without a tokenizer


@dataclass(frozen=True)
class PromptSynthesizer:
    """`tokenizer` (a Hugging Face tokenizer, see `loadgen.text_prompts.load_tokenizer`) makes every
    prompt carry text too; `tokenizer_id` names it in reports."""

    seed: int = 0
    token_id_low: int = 10
    token_id_high: int = 250
    tokenizer: Any = field(default=None, compare=False, repr=False)
    tokenizer_id: str | None = None
    _pool: np.ndarray | None = field(default=None, init=False, compare=False, repr=False)  # text-safe ids

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if not 0 <= self.token_id_low < self.token_id_high:
            raise ValueError(
                f"token id range [{self.token_id_low}, {self.token_id_high}) is empty or negative: "
                "pick 0 <= low < high <= the model's vocab_size"
            )
        if self.tokenizer is not None:
            object.__setattr__(self, "_pool", text_safe_ids(self.tokenizer, self.token_id_low, self.token_id_high))

    def prompt(self, spec: RequestSpec, index: int, warmup: bool = False) -> Prompt:
        """Request `index`'s (>= 0) prompt: the group's shared prefix (if any) then unique ids.
        Warm-up prompts come from a separate random stream and never carry a group prefix, so
        they warm no prefix the measured requests could hit."""
        stream = Stream.PROMPT_WARMUP if warmup else Stream.PROMPT_REQUEST
        if spec.prefix_group is None or warmup:
            ids = self._ids(stream, index, spec.prompt_tokens)
        else:
            prefix = self._ids(Stream.PROMPT_PREFIX, spec.prefix_group, spec.prefix_tokens)
            ids = prefix + self._ids(stream, index, spec.prompt_tokens - spec.prefix_tokens)
        if self.tokenizer is None:
            return Prompt(token_ids=ids, max_tokens=spec.output_tokens)
        fill = rng(self.seed, Stream.TEXT_FILL, int(warmup), index)
        text, text_ids = exact_length_text(self.tokenizer, ids, lambda count: list(self._draw(fill, count)))
        return Prompt(token_ids=text_ids, max_tokens=spec.output_tokens, text=text)

    def _ids(self, stream: Stream, key: int, count: int) -> tuple[int, ...]:
        return self._draw(rng(self.seed, stream, key), count)

    def _draw(self, generator: np.random.Generator, count: int) -> tuple[int, ...]:
        """`count` ids: uniform over [token_id_low, token_id_high), or over the text-safe ids."""
        if self._pool is None:
            return tuple(int(i) for i in generator.integers(self.token_id_low, self.token_id_high, size=count))
        return tuple(int(i) for i in self._pool[generator.integers(0, len(self._pool), size=count)])
