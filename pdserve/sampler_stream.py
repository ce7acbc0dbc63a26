"""A request continued on another engine samples as one engine would; and vLLM's CPU rewind works.

vLLM gives a request with a `seed` its own `torch.Generator`, seeded once when the model runner
first sees the request, and draws from it once per sampled token: token i of the output uses
draw i (vLLM 0.32's CPU sampler, `TopKTopPSampler.forward_cpu`: one `torch.randint(0, 2**31,
(1,))` per step; with fp64 Gumbel noise, one vocab-sized `exponential_`).

**Continuation.** pdserve samples a request's tokens on more than one engine: the prefill worker
samples token 0; the decode worker continues from prompt + the tokens already sent; after a dead
decode worker, another one continues from there. Each engine seeds a fresh generator, so the
continuation's first token would use draw 0 where one engine would use draw g (g = tokens already
sent), and a seeded request would diverge from vLLM after its first token. A continuation
carries `extra_args[SKIP_DRAWS_ARG] = g`; the engine advances the fresh generator by g draws
before its first sample, so every token uses the draw one engine would have used. That is
"derived deterministically from seed and position": no sampler state travels.

**Penalties and bad words.** vLLM's presence and frequency penalties count the request's *output*
tokens, and its bad words look back over them. A continuation's engine sees the tokens already
sent as prompt, so it would not see them. A continuation carries them in
`extra_args[PRIOR_OUTPUTS_ARG]`; the engine's sampler then sees them as output, ahead of its own
(the repetition penalty, over prompt and output, already sees them). The penalties and the bad
words are vLLM's own, applied in vLLM's order.

**Rewind (a crash in vLLM 0.32 on CPU).** When a step samples for a request whose prompt is not
fully computed yet (a chunked prefill), vLLM discards the token and rewinds the generator with
`gen.set_offset(gen.get_offset() - 4)` (`gpu_model_runner._bookkeeping_sync`). A CPU generator
(mt19937) has no offset: the call raises and the engine core dies. Any client could kill a
worker, pdserve's or plain vLLM's, with one seeded request whose prompt spans two chunks (a long
prompt, or a short one while others use the step's token budget). Here a CPU generator becomes a
`RewindableCPUGenerator`: its state is saved before each sampler step (`mark`), and vLLM's rewind
restores it.

These are patches on vLLM 0.32's model runner, installed by pdserve's vLLM plugin in every vLLM
process (`install`): `InputBatch.add_request` swaps in the rewindable generator, holds the skip
and the prior outputs; `Sampler.forward` marks before it draws and shows the penalties and the
bad words the prior outputs. Where vLLM's internals differ (another release),
`install` logs and does nothing; pdserve then does not claim exact seeded continuation.
On CUDA the generator (Philox) has offsets: a skip advances it by 4 per draw, vLLM's own unit.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import torch

logger = logging.getLogger(__name__)

SKIP_DRAWS_ARG = "pdserve_skip_draws"   # extra_args: draws to take before the first sample (int >= 0)
PRIOR_OUTPUTS_ARG = "pdserve_prior_output_ids"  # extra_args: output tokens sampled on earlier engines
DRAW_OFFSET = 4                         # vLLM's unit of a CUDA generator's offset per draw (its rewind)
_SKIP_APPLIED = "_pdserve_skip_applied"  # on vLLM's per-request state: the skip is taken once, not on re-add


def skip_draws_needed(seed: int | None, temperature: float, num_generated: int) -> int:
    """The draws a continuation must skip: the tokens already sampled, when the request's stream
    is seeded and random (greedy draws nothing; an unseeded stream has no order to keep)."""
    return num_generated if seed is not None and temperature > 0 and num_generated > 0 else 0


class RewindableCPUGenerator(torch.Generator):
    """A CPU generator that answers vLLM's one rewind: `set_offset(get_offset() - DRAW_OFFSET)`
    after a step's draw restores the state saved by that step's `mark()`. Any other offset is
    refused (RuntimeError, as torch's CPU generator refuses every offset). It also holds the
    draws a continuation must skip until the sampler first marks it (`pending_skip`), so they
    are taken the way that sampler draws."""

    def __init__(self) -> None:   # torch's Generator takes its arguments in __new__: none here
        super().__init__()
        self.pending_skip = 0
        self._marks = 0
        self._saved = None

    def mark(self, *, fp64_gumbel: bool, vocab_size: int) -> None:
        """Called before a sampler step draws: takes a pending skip, then saves the state to
        return to if the step is discarded."""
        if self.pending_skip:
            advance(self, self.pending_skip, fp64_gumbel=fp64_gumbel, vocab_size=vocab_size)
            self.pending_skip = 0
        self._saved = self.get_state()
        self._marks += 1

    def get_offset(self) -> int:
        return self._marks * DRAW_OFFSET

    def set_offset(self, offset: int) -> "RewindableCPUGenerator":
        if offset != (self._marks - 1) * DRAW_OFFSET or self._saved is None:
            raise RuntimeError(f"a CPU generator rewinds one step only (offset {self.get_offset()} -> {offset})")
        self.set_state(self._saved)
        self._saved = None
        self._marks -= 1
        return self


def advance(generator: torch.Generator, num_draws: int, *, fp64_gumbel: bool = False, vocab_size: int = 0) -> None:
    """Takes `num_draws` sampler draws from `generator` exactly as vLLM 0.32's sampler takes them
    (see the module doc); CUDA: moves the Philox offset by DRAW_OFFSET per draw."""
    if num_draws <= 0:
        return
    if generator.device.type != "cpu":
        generator.set_offset(generator.get_offset() + DRAW_OFFSET * num_draws)
        return
    for _ in range(num_draws):
        if fp64_gumbel:
            torch.empty(vocab_size, dtype=torch.float64).exponential_(generator=generator)
        else:
            torch.randint(0, 2**31, (1,), generator=generator, dtype=torch.long)


def prior_outputs_needed(presence_penalty: float, frequency_penalty: float, bad_words: tuple[str, ...] = ()) -> bool:
    """Whether a continuation must carry the tokens already sent as prior outputs: the penalties
    count them, and vLLM's bad words look back over them (a word of several tokens is blocked at its
    last token when the output ends with the others, `v1/sample/ops/bad_words.py`)."""
    return presence_penalty != 0 or frequency_penalty != 0 or bool(bad_words)


class OutputsAfterPrior(list):
    """vLLM's live list of a request's output tokens, unchanged (the model runner appends to it and
    reads its length), carrying `prior`: the outputs sampled on earlier engines."""

    prior: tuple[int, ...] = ()


def with_prior_outputs(rows: list) -> list | None:
    """The sampler's per-row output token lists with each continuation's prior outputs in front;
    None when no row has any (the common case: nothing is copied)."""
    if not any(isinstance(row, OutputsAfterPrior) and row.prior for row in rows):
        return None
    return [list(row.prior) + row if isinstance(row, OutputsAfterPrior) and row.prior else row for row in rows]


def prepare_outputs(request_state) -> None:
    """Gives the request's output list its prior outputs, on every add (vLLM may rebind the list
    when it resumes a preempted request)."""
    params = request_state.sampling_params
    prior = ((params.extra_args or {}) if params is not None else {}).get(PRIOR_OUTPUTS_ARG)
    if not prior or isinstance(request_state.output_token_ids, OutputsAfterPrior):
        return
    outputs = OutputsAfterPrior(request_state.output_token_ids)
    outputs.prior = tuple(int(token) for token in prior)
    request_state.output_token_ids = outputs


def prepare_generator(request_state) -> None:
    """vLLM's per-request state as the input batch takes it: a CPU generator made rewindable and
    given the continuation's skip, a CUDA one advanced now; once per request (a preempted request
    is added again and must not skip twice)."""
    generator = request_state.generator
    if generator is None or getattr(request_state, _SKIP_APPLIED, False):
        return
    params = request_state.sampling_params
    skip = int(((params.extra_args or {}) if params is not None else {}).get(SKIP_DRAWS_ARG, 0))
    if generator.device.type == "cpu":
        copy = RewindableCPUGenerator()
        copy.set_state(generator.get_state())
        copy.pending_skip = skip
        request_state.generator = copy
    else:
        advance(generator, skip)
    setattr(request_state, _SKIP_APPLIED, True)


def mark_generators(generators: dict, *, fp64_gumbel: bool, vocab_size: int) -> None:
    for generator in generators.values():
        if isinstance(generator, RewindableCPUGenerator):
            generator.mark(fp64_gumbel=fp64_gumbel, vocab_size=vocab_size)


def install() -> bool:
    """Patches vLLM's input batch and sampler (module doc). True when installed; False, with a
    warning, where vLLM's internals are not the ones this was written against. Idempotent."""
    try:
        from vllm.v1.sample.sampler import Sampler
        from vllm.v1.worker.gpu_input_batch import InputBatch
    except ImportError as error:
        logger.warning("pdserve: seeded continuation not installed (%s)", error)
        return False
    if getattr(InputBatch.add_request, "_pdserve", False):
        return True
    add_request, forward = InputBatch.add_request, Sampler.forward

    @functools.wraps(add_request)
    def add_request_with_stream(self, request, *args, **kwargs):
        prepare_generator(request)
        prepare_outputs(request)
        return add_request(self, request, *args, **kwargs)

    @functools.wraps(forward)
    def forward_marked(self, logits, sampling_metadata, *args, **kwargs):
        mark_generators(sampling_metadata.generators, fp64_gumbel=bool(getattr(self, "use_fp64_gumbel", False)),
                        vocab_size=logits.shape[-1])
        rows = with_prior_outputs(sampling_metadata.output_token_ids)
        if rows is not None:
            sampling_metadata = dataclasses.replace(sampling_metadata, output_token_ids=rows)
        return forward(self, logits, sampling_metadata, *args, **kwargs)

    add_request_with_stream._pdserve = forward_marked._pdserve = True
    InputBatch.add_request, Sampler.forward = add_request_with_stream, forward_marked
    return True
