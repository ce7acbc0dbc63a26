"""Which points `pdserve profile` measures: a pure function of the engine's limits.

Every point must be runnable by the engine it is measured on: a prompt shorter than
`max_model_len`, a decode batch within `max_num_seqs` whose sequences (prompt + generated) fit
both the context length and the KV cache. The full plan covers the ranges the simulator
extrapolates over; the quick one is the fewest points the fits accept (tests, smoke runs).
"""

from __future__ import annotations

from dataclasses import dataclass

FULL_PROMPTS = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
FULL_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
# SHORT_CONTEXT is the prompt of the serving probe's batches too: the engine's step at the same
# batch and context is what a served step is compared with, measured, not extrapolated. It also
# separates a step's cost per sequence from its cost per context token, which longer contexts alone
# cannot (at a fixed context per sequence the two grow together).
SHORT_CONTEXT = 16
FULL_CONTEXTS = (SHORT_CONTEXT, 128, 512, 1024)
QUICK_PROMPTS = (32, 256, 1024)
# prompts are measured again in chunks of CHUNKED_BUDGET tokens (the smallest token budget `pdserve
# plan` searches, planner.search.DEFAULT_TOKEN_BUDGETS), on an engine of that budget: what a chunked
# prompt's attention over its earlier chunks costs (planner.perf_model's e), which one-chunk rows
# cannot show. Prompts of 2-8 chunks, to CHUNKED_LONGEST tokens (beyond, each repeat costs seconds
# more and adds nothing a shorter one does not show); not in a quick plan.
CHUNKED_BUDGET = 256
CHUNKED_LONGEST = 2048
QUICK_BATCHES = (1, 4, 16)
QUICK_CONTEXTS = (SHORT_CONTEXT, 64, 512)


class PlanError(ValueError):
    """The engine's limits leave too few measurable points; the message says which limit to raise."""


@dataclass(frozen=True)
class ProfilePlan:
    prefill_prompt_tokens: tuple[int, ...]
    prefill_repeats: int
    decode_points: tuple[tuple[int, int], ...]  # (batch size, prompt tokens per sequence)
    decode_steps: int
    transfer_blocks: tuple[int, ...]
    transfer_repeats: int
    chunked_budget: int = 0  # the token budget of the chunked rows' engine (0: none measured)
    chunked_prompt_tokens: tuple[int, ...] = ()

    @property
    def num_points(self) -> int:
        """Progress steps of one engine's tables: each row, and the chunked rows' engine start."""
        chunked = len(self.chunked_prompt_tokens) + 1 if self.chunked_prompt_tokens else 0
        return len(self.prefill_prompt_tokens) + len(self.decode_points) + chunked


def make_plan(max_model_len: int, max_num_seqs: int, kv_cache_tokens: int, block_size: int,
              quick: bool = False) -> ProfilePlan:
    """The points to measure for an engine with these limits (`kv_cache_tokens`: tokens its KV
    cache holds). Transfers span one block to a whole `max_model_len` prompt's blocks, the range
    the cluster moves. Raises `PlanError` when fewer than the fits need remain."""
    steps = 16 if quick else 32
    longest = steps + 1
    prompts = tuple(n for n in (QUICK_PROMPTS if quick else FULL_PROMPTS) if n < max_model_len)
    if len(prompts) < 3:
        prompts = tuple(sorted({max(1, max_model_len // d) for d in (16, 4, 2)}))
    if len(set(prompts)) < 3:
        raise PlanError(f"max_model_len {max_model_len} leaves fewer than 3 prompt lengths to measure; raise it")
    # the ends of the ranges the planner is asked about, measured rather than extrapolated to: the
    # longest prompt the engine takes (one token left to generate), the longest decode context, the
    # largest batch
    prompts = _with_end(prompts, max_model_len - 1)
    batches = _with_end(tuple(b for b in (QUICK_BATCHES if quick else FULL_BATCHES) if b <= max_num_seqs),
                        max_num_seqs)
    contexts = _with_end(QUICK_CONTEXTS if quick else FULL_CONTEXTS, max_model_len - longest)
    points = tuple((b, c) for b in batches for c in contexts
                   if c + longest <= max_model_len and b * (c + longest) <= kv_cache_tokens)
    if len(points) < 3 or len({b for b, _ in points}) < 2:
        raise PlanError(f"only {len(points)} decode points fit max_num_seqs={max_num_seqs}, "
                        f"max_model_len={max_model_len} and a KV cache of {kv_cache_tokens} tokens; "
                        "raise --kv-cache-mb or --max-num-seqs")
    chunked_budget = max(CHUNKED_BUDGET, max_num_seqs)  # vLLM's step takes at least max_num_seqs tokens
    chunked = () if quick else tuple(n for n in FULL_PROMPTS
                                     if 2 * chunked_budget <= n <= CHUNKED_LONGEST and n < max_model_len)
    return ProfilePlan(
        prefill_prompt_tokens=prompts,
        prefill_repeats=2 if quick else 3,
        decode_points=points,
        decode_steps=steps,
        transfer_blocks=_transfer_blocks(-(-max_model_len // block_size), quick),
        transfer_repeats=5,
        chunked_budget=chunked_budget if len(chunked) >= 2 else 0,
        chunked_prompt_tokens=chunked if len(chunked) >= 2 else (),
    )


def _with_end(values: tuple[int, ...], end: int) -> tuple[int, ...]:
    """`values` up to `end`, with `end` itself as the last point (a range measured to its end)."""
    kept = tuple(v for v in values if v < end)
    return kept + (end,) if end >= 1 else kept


def _transfer_blocks(max_blocks: int, quick: bool) -> tuple[int, ...]:
    """1 block up to a full-context prompt's blocks (at least 16, so sizes differ >= 16x)."""
    largest = max(16, max_blocks)
    if quick:
        return (1, largest)
    return tuple(sorted({1, max(2, largest // 16), max(3, largest // 4), largest}))
