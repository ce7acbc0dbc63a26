"""The workload shapes the planner's predictions are validated on (bench/validate_planner.py
`--shape`): a planner tuned on one shape must hold on the others. Each shape is a loadgen
`WorkloadConfig` whose rate and request count the run sets. Pure.

- `uniform`: the validation's original shape, lengths uniform in mean x (1 +- r), Poisson;
- `short-long`: short prompts, long outputs (decode-bound);
- `long-short`: prompts of 0.47-0.93x the context with ~24-token outputs (prefill-bound: where the
  handoff divided by few tokens dominates TPOT);
- `trace`: the conversation trace's prompt and output lengths, Poisson arrivals at the rate;
- `bursty`: the uniform lengths in gamma arrivals with a coefficient of variation of 3.
Lengths scale with the model's context so every shape fits it (prompt + output <= max_model_len).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from loadgen.harness import WorkloadConfig

SHAPE_NAMES = ("uniform", "short-long", "long-short", "trace", "bursty")
TRACE_MAX_OUTPUT_TOKENS = 256
BURSTY_CV = 3.0


@dataclass(frozen=True)
class Uniform:
    """The `uniform` shape's lengths (bench/validate_planner.py's --input-len/--output-len/--range-ratio)."""

    input_len: int = 128
    output_len: int = 64
    range_ratio: float = 0.5


@dataclass(frozen=True)
class Shape:
    name: str
    description: str
    workload: WorkloadConfig


def validation_shapes(max_model_len: int, uniform: Uniform = Uniform(), trace_path: Path | None = None,
                      seed: int = 0) -> dict[str, Shape]:
    """Every shape of `SHAPE_NAMES`, sized for a model of `max_model_len` tokens of context.
    ValueError when the context is too short for them (< 512 tokens) or the uniform lengths do not fit it."""
    if max_model_len < 512:
        raise ValueError(f"the validation shapes need a context of >= 512 tokens, got max_model_len {max_model_len}")
    if round(uniform.input_len * (1 + uniform.range_ratio)) + round(uniform.output_len * (1 + uniform.range_ratio)) \
            > max_model_len:
        raise ValueError(f"uniform lengths {uniform.input_len} + {uniform.output_len} x (1 + {uniform.range_ratio}) "
                         f"do not fit max_model_len {max_model_len}")
    lengths = dict(prompt_mean=uniform.input_len, output_mean=uniform.output_len, range_ratio=uniform.range_ratio)
    long_prompt = int(0.7 * max_model_len)  # x (1 +- 1/3): up to 0.93x the context, 32 output tokens beside it
    long_output = min(384, max_model_len // 4)
    trace_prompt_cap = max_model_len - TRACE_MAX_OUTPUT_TOKENS
    shapes = [
        Shape("uniform", f"prompts {_range(uniform.input_len, uniform.range_ratio)}, outputs "
                         f"{_range(uniform.output_len, uniform.range_ratio)} tokens, Poisson",
              WorkloadConfig(kind="random", arrival="poisson", **lengths, seed=seed)),
        Shape("short-long", f"prompts {_range(128, 0.5)}, outputs {_range(long_output, 0.5)} tokens, Poisson",
              WorkloadConfig(kind="random", arrival="poisson", prompt_mean=128, output_mean=long_output,
                             range_ratio=0.5, seed=seed)),
        Shape("long-short", f"prompts {_range(long_prompt, 1 / 3)}, outputs {_range(24, 1 / 3)} tokens, Poisson",
              WorkloadConfig(kind="random", arrival="poisson", prompt_mean=long_prompt, output_mean=24,
                             range_ratio=1 / 3, seed=seed)),
        Shape("trace", f"the conversation trace's lengths (prompts <= {trace_prompt_cap}, outputs <= "
                       f"{TRACE_MAX_OUTPUT_TOKENS} tokens), Poisson",
              WorkloadConfig(kind="trace", arrival="poisson", trace_path=trace_path,
                             max_prompt_tokens=trace_prompt_cap, max_output_tokens=TRACE_MAX_OUTPUT_TOKENS,
                             seed=seed)),
        Shape("bursty", f"the uniform lengths, gamma arrivals with cv {BURSTY_CV:g}",
              WorkloadConfig(kind="random", arrival="gamma", cv=BURSTY_CV, **lengths, seed=seed)),
    ]
    return {shape.name: shape for shape in shapes}


def _range(mean: int, ratio: float) -> str:
    return f"{round(mean * (1 - ratio))}-{round(mean * (1 + ratio))}"
