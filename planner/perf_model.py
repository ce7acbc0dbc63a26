"""A performance model fitted to a profile: the time of each phase, in stated functional forms.

Forms (n = tokens, seconds):

- prefill step over chunks [s_i, s_i + k_i):
      a + b * sum(k_i) + c * sum((s_i + k_i)^2 - s_i^2) + e * sum(k_i * s_i)
  A whole prompt of n tokens chunked by k therefore costs  ceil(n/k) * a + b*n + c*n^2 + e * P(n, k)
  (`prior_units`: P = sum of k_i * s_i, 0 for a prompt in one chunk, about (n^2 - n*k) / 2 chunked):
  the per-step overhead is paid once per chunk and the causal attention telescopes to n^2, and a
  chunk's queries over the prompt's earlier tokens, read back from the paged KV cache, cost e more
  or less than the same attention in one pass. e >= -2c: per chunk the form is
  a + b*k + c*k^2 + (2c + e)*k*s, and neither part may be negative. Both signs are measured: on the
  slow Zen 4 EPYC prompts of 512-2,000 tokens took 1.01-1.17x as long in 256-token chunks as in one
  (BENCHMARKS, "What streaming costs the prefill core, and a prompt in small chunks"): e > 0; on an
  AMX Xeon 0.92-1.01x, where a, b and c alone say 1.13x, because there the one-pass n^2 is not
  attention alone (a step of 512-2,048 tokens runs slower per token than its 256-token chunks): e < 0.
  e is fitted where the profile measured chunked prompts (`pdserve profile`'s rows at a small token
  budget); 0 otherwise (the telescoped attention, neither dearer nor cheaper).
- decode step:   a + b * batch_size + c * context + d * max(0, context - knee)
  (context summed over the batch). Past `knee` tokens of context each further token costs c + d.
  The knee is the measured context that fits best; d = 0 (one slope) when a knee does not help.
  (Profiles measured before the decode probe stopped averaging chunked-prefill steps into its
  long-context points showed a steep knee that was that defect; measured again, the AVX-512 EPYC
  profile fits one slope at 3.2% MAPE.)
- KV transfer:   latency + kv_bytes / bandwidth            (one line per transport)
- colocated (mixed) step, vLLM's chunked prefill riding with decodes: one overhead
  max(a_prefill, a_decode) plus both pools' per-token terms.

A profile with wide engines (`Profile.wide`: one engine over several devices) gets a model per
width, fitted to that width's own tables in the same forms (`PerfModel.on_devices`); transfers
are the profile's.

Coefficients are fitted by least squares on relative error (rows weighted 1/measured, so a
10 ms step counts as much as a 1 s prefill) with non-negative coefficients (the best subset
is kept when an unconstrained fit goes negative). The fit error is the mean absolute
percentage error (MAPE) per phase, over the profile's own rows.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from planner.profile import DecodeSample, PrefillSample, Profile
from router.policies.placement.cost import least_prior_unit_s, prior_units


@dataclass(frozen=True)
class PrefillCoeffs:
    step_s: float
    per_token_s: float
    per_token2_s: float
    per_prior_unit_s: float = 0.0  # e: per unit of sum(k_i * s_i), a chunk's queries over earlier chunks (>= -2c)

    def __post_init__(self) -> None:
        if self.per_prior_unit_s < least_prior_unit_s(self.per_token2_s):
            raise ValueError(f"PrefillCoeffs.per_prior_unit_s must be >= -2 * per_token2_s "
                             f"({-2 * self.per_token2_s!r}), got {self.per_prior_unit_s!r}: below it a chunk's "
                             f"queries over earlier tokens would cost less than nothing")

    def times(self, factor: float) -> PrefillCoeffs:
        return PrefillCoeffs(self.step_s * factor, self.per_token_s * factor, self.per_token2_s * factor,
                             self.per_prior_unit_s * factor)


@dataclass(frozen=True)
class DecodeCoeffs:
    step_s: float
    per_seq_s: float
    per_context_token_s: float
    per_context_token_past_knee_s: float = 0.0  # extra, per token of context past the knee
    context_knee_tokens: int = 0

    def context_s(self, context_tokens: int) -> float:
        """The context's share of a step."""
        past_knee = max(0, context_tokens - self.context_knee_tokens)
        return self.per_context_token_s * context_tokens + self.per_context_token_past_knee_s * past_knee

    def times(self, factor: float) -> DecodeCoeffs:
        return DecodeCoeffs(self.step_s * factor, self.per_seq_s * factor, self.per_context_token_s * factor,
                            self.per_context_token_past_knee_s * factor, self.context_knee_tokens)


@dataclass(frozen=True)
class TransferCoeffs:
    latency_s: float
    bytes_per_s: float

    def __post_init__(self) -> None:
        if not self.bytes_per_s > 0:
            raise ValueError(f"TransferCoeffs.bytes_per_s must be > 0, got {self.bytes_per_s}")


def _same_speed(factor: float) -> bool:
    """Whether a speed factor changes nothing (1.0); ValueError unless it is finite and > 0."""
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"a speed factor must be a finite number > 0, got {factor}")
    return factor == 1.0


@dataclass(frozen=True)
class PerfModel:
    """Predicts phase times. Every method is pure and returns seconds >= 0."""

    prefill: PrefillCoeffs
    decode: DecodeCoeffs
    transfer: dict[str, TransferCoeffs] = field(default_factory=dict)
    wide: tuple[tuple[int, PerfModel], ...] = ()  # (devices, the model of one engine over that many)

    def on_devices(self, devices: int) -> PerfModel:
        """The model of one engine spread over `devices` devices: this one for 1, else the profile's
        wide engine of that width; KeyError naming the widths measured when there is none."""
        if devices == 1:
            return self
        for width, model in self.wide:
            if width == devices:
                return model
        raise KeyError(f"no engine over {devices} devices was profiled (measured widths: {list(self.widths)}); "
                       "re-run `pdserve profile --through cluster` to measure one over every core")

    def slower(self, factor: float) -> PerfModel:
        """This model on a machine `factor` times slower: every compute time (prefill, decode step,
        each wide engine's) and every KV transfer's time multiplied by it. What the plan's robust
        pick asks of a topology: does it still meet the SLOs if the machine runs that much slower
        than it was profiled (a shared VM's speed moves by 1.1-2x; `pdserve plan --speed-margin`)?"""
        if _same_speed(factor):
            return self
        return PerfModel(
            prefill=self.prefill.times(factor),
            decode=self.decode.times(factor),
            transfer={name: TransferCoeffs(t.latency_s * factor, t.bytes_per_s / factor)
                      for name, t in self.transfer.items()},
            wide=tuple((width, model.slower(factor)) for width, model in self.wide))

    def prompts_slower(self, factor: float) -> PerfModel:
        """This model with only its prompts' compute `factor` times slower: the prefill coefficients
        (here and in each wide engine), not the decode step nor the transfers. What a speed check
        in the engines' dtype measures: a prompt-sized half-precision GEMM is compute-bound, as a
        prefill is, while a decode step reads its weights from memory (on the AMX Xeon the prompts
        ran 1.3x slower than profiled while the decode step held within 1.04x)."""
        if _same_speed(factor):
            return self
        return PerfModel(prefill=self.prefill.times(factor), decode=self.decode, transfer=self.transfer,
                         wide=tuple((width, model.prompts_slower(factor)) for width, model in self.wide))

    def decodes_slower(self, factor: float) -> PerfModel:
        """This model with only its decode steps `factor` times slower (here and in each wide
        engine): what the interpreter check measures. A small model's decode step is the engine's
        scheduling and its kernels' dispatch, interpreter-bound, not its arithmetic (on a Zen 4 EPYC
        VM a lone decode step ran 0.97-2.2x the profile's from one quarter second to the next with
        the compute check unmoved; BENCHMARKS, "The decode step under load")."""
        if _same_speed(factor):
            return self
        return PerfModel(prefill=self.prefill, decode=self.decode.times(factor), transfer=self.transfer,
                         wide=tuple((width, model.decodes_slower(factor)) for width, model in self.wide))

    @property
    def widths(self) -> tuple[int, ...]:
        """The devices one engine may span: 1 and every wide engine profiled."""
        return (1, *(width for width, _ in self.wide))

    def prefill_step_s(self, num_tokens: int, attention_units: float, prior: float = 0.0) -> float:
        """One prefill-only step computing `num_tokens` whose attention units are
        sum((s+k)^2 - s^2) over its chunks and `prior` sum(k * s); 0 for an empty step."""
        if num_tokens <= 0:
            return 0.0
        p = self.prefill
        return p.step_s + p.per_token_s * num_tokens + p.per_token2_s * attention_units + p.per_prior_unit_s * prior

    def prefill_s(self, prompt_tokens: int, chunk_tokens: int) -> float:
        """A whole prompt alone, chunked by `chunk_tokens` (what the profile measures)."""
        num_chunks = -(-prompt_tokens // chunk_tokens)
        p = self.prefill
        return (num_chunks * p.step_s + p.per_token_s * prompt_tokens + p.per_token2_s * prompt_tokens**2
                + p.per_prior_unit_s * prior_units(prompt_tokens, chunk_tokens))

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        if batch_size <= 0:
            return 0.0
        d = self.decode
        return d.step_s + d.per_seq_s * batch_size + d.context_s(context_tokens)

    def mixed_step_s(self, prefill_tokens: int, attention_units: float,
                     batch_size: int, context_tokens: int, prior: float = 0.0) -> float:
        """A colocated step: prefill chunks (`attention_units`, `prior` as in `prefill_step_s`) and
        decodes in one forward pass."""
        if prefill_tokens <= 0:
            return self.decode_step_s(batch_size, context_tokens)
        if batch_size <= 0:
            return self.prefill_step_s(prefill_tokens, attention_units, prior)
        p, d = self.prefill, self.decode
        return (max(p.step_s, d.step_s) + p.per_token_s * prefill_tokens + p.per_token2_s * attention_units
                + p.per_prior_unit_s * prior + d.per_seq_s * batch_size + d.context_s(context_tokens))

    def transfer_s(self, kv_bytes: int, transport: str) -> float:
        coeffs = self.transfer.get(transport)
        if coeffs is None:
            raise KeyError(f"transport {transport!r} is not in the profile; "
                           f"measured transports: {sorted(self.transfer)}")
        return coeffs.latency_s + kv_bytes / coeffs.bytes_per_s


@dataclass(frozen=True)
class MeasuredRange:
    """How far the profile measured: its longest prompt, longest sequence in a decode batch (prompt +
    generated tokens), largest decode batch. A prediction past them is an extrapolation of the forms."""

    longest_prompt_tokens: int
    longest_sequence_tokens: int
    largest_batch: int

    @classmethod
    def of(cls, profile: Profile) -> MeasuredRange:
        return cls(max((r.prompt_tokens for r in profile.prefill), default=0),
                   max((r.context_tokens // max(1, r.batch_size) for r in profile.decode), default=0),
                   max((r.batch_size for r in profile.decode), default=0))

    def beyond(self, longest_prompt_tokens: int, longest_sequence_tokens: int, largest_batch: int) -> list[str]:
        """What a workload asks of the model past what was measured, one sentence each (none: inside)."""
        notes = []
        if longest_prompt_tokens > self.longest_prompt_tokens:
            notes.append(f"prompts reach {longest_prompt_tokens} tokens; prefill was measured to "
                         f"{self.longest_prompt_tokens}")
        if longest_sequence_tokens > self.longest_sequence_tokens:
            notes.append(f"sequences reach {longest_sequence_tokens} tokens; decode steps were measured with "
                         f"sequences of up to {self.longest_sequence_tokens}")
        if largest_batch > self.largest_batch:
            notes.append(f"decode batches may reach {largest_batch}; they were measured to {self.largest_batch}")
        return notes


@dataclass(frozen=True)
class FitReport:
    model: PerfModel
    prefill_mape: float
    decode_mape: float
    transfer_mape: dict[str, float]
    measured: MeasuredRange | None = None
    wide_mape: dict[int, tuple[float, float]] = field(default_factory=dict)  # devices -> prefill, decode MAPE

    def lines(self) -> list[str]:
        out = _engine_lines(self.model, self.prefill_mape, self.decode_mape, "")
        for devices, model in self.model.wide:
            out += _engine_lines(model, *self.wide_mape[devices], f" [one engine on {devices} devices]")
        for name, t in sorted(self.model.transfer.items()):
            out.append(f"kv transfer [{name}] = {t.latency_s * 1e3:.3f} ms + bytes / "
                       f"{t.bytes_per_s / 1e9:.3f} GB/s   (MAPE {self.transfer_mape[name]:.1%})")
        return out


def _engine_lines(model: PerfModel, prefill_mape: float, decode_mape: float, where: str) -> list[str]:
    p, d = model.prefill, model.decode
    return [
        f"prefill step  = {p.step_s * 1e3:.3f} ms + {p.per_token_s * 1e6:.3f} us*tokens"
        f" + {p.per_token2_s * 1e9:.4f} ns*tokens^2"
        + (f" {'-' if p.per_prior_unit_s < 0 else '+'} {abs(p.per_prior_unit_s) * 1e9:.4f} ns*sum(chunk*earlier)"
           if p.per_prior_unit_s != 0 else "")
        + f"   (MAPE {prefill_mape:.1%}){where}",
        f"decode step   = {d.step_s * 1e3:.3f} ms + {d.per_seq_s * 1e3:.4f} ms*batch"
        f" + {d.per_context_token_s * 1e6:.4f} us*context"
        + (f" + {d.per_context_token_past_knee_s * 1e6:.4f} us*(context - {d.context_knee_tokens})+"
           if d.per_context_token_past_knee_s > 0 else "")
        + f"   (MAPE {decode_mape:.1%}){where}",
    ]


def fit_nonnegative(features: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Least squares on relative error with every coefficient >= 0.

    Solves each subset of columns (there are at most four) and keeps the non-negative
    solution with the smallest weighted residual; dropped columns get 0.
    """
    weights = 1.0 / measured
    a, y = features * weights[:, None], measured * weights
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    a = a / scale  # unit columns: n^2 and a constant differ by 1e7
    best, best_residual = np.zeros(features.shape[1]), math.inf
    columns = range(features.shape[1])
    for size in range(features.shape[1], 0, -1):
        for subset in itertools.combinations(columns, size):
            coef, *_ = np.linalg.lstsq(a[:, subset], y, rcond=None)
            if np.any(coef < 0):
                continue
            residual = float(np.sum((a[:, subset] @ coef - y) ** 2))
            if residual < best_residual - 1e-15:
                best, best_residual = np.zeros(features.shape[1]), residual
                best[list(subset)] = coef
    return best / scale


def mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted - measured) / measured))


def fit_perf_model(profile: Profile) -> FitReport:
    """Fit every phase of `profile` (and each wide engine's tables); the report carries the model
    and its MAPE per phase."""
    prefill, prefill_mape = fit_prefill(profile.prefill)
    decode, decode_mape = fit_decode(profile.decode)
    transfer, transfer_mape = _fit_transfers(profile)
    wide, wide_mape = [], {}
    for engine in profile.wide:
        wide_prefill, wide_prefill_mape = fit_prefill(engine.prefill)
        wide_decode, wide_decode_mape = fit_decode(engine.decode)
        wide.append((engine.devices, PerfModel(wide_prefill, wide_decode, transfer)))
        wide_mape[engine.devices] = (wide_prefill_mape, wide_decode_mape)
    model = PerfModel(prefill, decode, transfer, tuple(wide))
    return FitReport(model, prefill_mape, decode_mape, transfer_mape, MeasuredRange.of(profile), wide_mape)


def fit_prefill(rows: Sequence[PrefillSample]) -> tuple[PrefillCoeffs, float]:
    """The prefill form fitted to `rows`, and its MAPE. The chunked-attention term e is fitted only
    where at least `MIN_CHUNKED_ROWS` prompt lengths were measured both in one pass and in several chunks
    of at most half the prompt (`pdserve profile`'s rows at a small token budget beside the engine's
    own): e is read from how the two differ at the same length. A prompt that just overflows one chunk
    (the engine's longest, in two) says too little of it, and rows chunked at every length (an engine
    whose own budget is small) cannot tell it from c; there a, b and c are fitted as before.

    e is fitted as the chunk's whole cost over earlier tokens, 2c + e >= 0, beside c * sum(k_i^2)
    (n^2 = sum(k_i^2) + 2 * P): so both signs of e are open to the fit, down to the -2c at which a
    chunk's queries over earlier tokens would cost nothing."""
    units = np.array([prior_units(r.prompt_tokens, r.chunk_tokens) for r in rows], float)
    tokens = np.array([r.prompt_tokens for r in rows], float)
    features = np.column_stack([[r.num_chunks for r in rows], tokens, tokens**2 - 2 * units, units])
    measured = np.array([r.prefill_s for r in rows])
    if len(lengths_measured_both_ways(rows)) < MIN_CHUNKED_ROWS:   # telescoped: c * n^2 chunked or not
        telescoped = np.column_stack([features[:, :2], tokens**2])
        c = fit_nonnegative(telescoped, measured)
        return PrefillCoeffs(*map(float, c)), mape(telescoped @ c, measured)
    a, b, c, over_earlier = fit_nonnegative(features, measured)
    coeffs = PrefillCoeffs(float(a), float(b), float(c), float(over_earlier - 2 * c))
    return coeffs, mape(features @ np.array([a, b, c, over_earlier]), measured)


MIN_CHUNKED_ROWS = 2  # prompt lengths measured both ways before the chunked-attention term is fitted


def lengths_measured_both_ways(rows: Sequence[PrefillSample]) -> set[int]:
    """The prompt lengths of `rows` measured in one pass and in chunks of at most half the prompt."""
    one_pass = {r.prompt_tokens for r in rows if r.num_chunks == 1}
    return {r.prompt_tokens for r in rows if r.num_chunks >= 2 and 2 * r.chunk_tokens <= r.prompt_tokens} & one_pass


def _fit_transfers(profile: Profile) -> tuple[dict[str, TransferCoeffs], dict[str, float]]:
    transfer, transfer_mape = {}, {}
    for name in profile.transports:
        rows = [r for r in profile.kv_transfer if r.transport == name]
        x = np.array([[1.0, r.kv_bytes] for r in rows])
        y = np.array([r.transfer_s for r in rows])
        c = fit_nonnegative(x, y)
        if c[1] <= 0:
            raise ValueError(f"kv_transfer rows for {name!r} do not grow with kv_bytes; "
                             "re-measure with sizes that differ by at least 10x")
        transfer[name] = TransferCoeffs(latency_s=float(c[0]), bytes_per_s=float(1.0 / c[1]))
        transfer_mape[name] = mape(x @ c, y)
    return transfer, transfer_mape


MIN_ROWS_PAST_KNEE = 3  # a knee is tried only where at least this many rows lie past it
MIN_KNEE_GAIN = 0.005   # and kept only when it lowers the MAPE by at least half a point


def fit_decode(rows: Sequence[DecodeSample]) -> tuple[DecodeCoeffs, float]:
    """The decode form fitted to `rows` with the knee at each measured context in turn; the best
    knee is kept only where it fits the rows clearly better than one slope (`MIN_KNEE_GAIN`)."""
    batch = np.array([r.batch_size for r in rows], float)
    context = np.array([r.context_tokens for r in rows], float)
    measured = np.array([r.step_s for r in rows])
    one_slope = np.column_stack([np.ones_like(batch), batch, context])
    c = fit_nonnegative(one_slope, measured)
    one_slope_fit = (mape(one_slope @ c, measured), DecodeCoeffs(*map(float, c)))
    best = one_slope_fit
    for knee in sorted(set(context.tolist())):
        if np.count_nonzero(context > knee) < MIN_ROWS_PAST_KNEE:
            continue
        features = np.column_stack([one_slope, np.maximum(0.0, context - knee)])
        c = fit_nonnegative(features, measured)
        error = mape(features @ c, measured)
        if c[3] > 0 and error < best[0]:
            best = (error, DecodeCoeffs(*map(float, c[:3]), per_context_token_past_knee_s=float(c[3]),
                                        context_knee_tokens=int(knee)))
    if best[0] > one_slope_fit[0] - MIN_KNEE_GAIN:
        best = one_slope_fit
    return best[1], best[0]
