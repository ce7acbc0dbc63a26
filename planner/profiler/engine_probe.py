"""Timing a real vLLM engine: prefill alone, and decode steps at a batch size and context.

Every measurement goes through `AsyncLLM.generate`, the same path a pdserve worker uses, so the
times include what a worker pays per step (scheduling, IPC to the engine core, sampling, output
processing), not just the model's forward pass.

- prefill: one request of `prompt_tokens` fresh token ids and `max_tokens=1`, alone in the
  engine: submit -> its only output. The engine chunks it by its token budget, as in serving.
- decode: `batch_size` requests of `context_per_seq` prompt tokens each, started together with
  `ignore_eos`; once every one has its second token the batch only decodes, and the step time is
  (time of the last token - time of the first steady token) / tokens between, per request, the
  median over the batch (robust to outputs coalesced by a busy event loop); the steps in which an
  early request decodes beside the later ones' chunked prefills are left out; `steady_decode`.

Prompts never share a prefix with one another (a fresh random first token each), so a prefix
cache cannot shorten a prefill; the profiler still runs the engine with prefix caching off.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from dataclasses import dataclass

import numpy as np

_request_ids = itertools.count()


@dataclass(frozen=True)
class DecodeMeasurement:
    batch_size: int
    context_tokens: int  # summed over the batch, at the middle of the measured steps
    step_s: float
    # the steady stretch the step was read over (`time.perf_counter` s: the clock of the profile's
    # interpreter series), so the step can be set against the machine's speed then
    start_s: float = 0.0
    end_s: float = 0.0


class EngineProbe:
    """Sends timed requests to one `AsyncLLM`. Token ids are drawn from [10, vocab_size)."""

    def __init__(self, engine, vocab_size: int, seed: int = 0) -> None:
        self.engine = engine
        self._rng = np.random.default_rng(seed)
        self._low, self._high = 10, max(11, vocab_size)
        self.last_span_s = (0.0, 0.0)   # when the last `prefill_s` ran

    def _prompt(self, num_tokens: int):
        from vllm.inputs import TokensPrompt

        ids = self._rng.integers(self._low, self._high, size=num_tokens)
        return TokensPrompt(prompt_token_ids=[int(i) for i in ids])

    @staticmethod
    def _params(max_tokens: int):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                              output_kind=RequestOutputKind.DELTA)

    async def run(self, prompt_tokens: int, max_tokens: int, on_output=None) -> "Marks":
        """(time, tokens so far) at each output of one request, times from `time.perf_counter`;
        `on_output(tokens so far)` at each. Cancelled, the engine aborts the request."""
        marks, produced = [], 0
        request_id = f"profile-{next(_request_ids)}"
        async for output in self.engine.generate(self._prompt(prompt_tokens), self._params(max_tokens), request_id):
            produced += len(output.outputs[0].token_ids)
            marks.append((time.perf_counter(), produced))
            if on_output is not None:
                on_output(produced)
        return marks

    async def hold_decoding(self, batch_size: int, context_per_seq: int, max_tokens: int,
                            decoding: asyncio.Event, tokens: list[int]) -> None:
        """Keeps `batch_size` requests decoding until cancelled (a batch that ends is started again);
        sets `decoding` once every request of the first batch has its second token (the batch is
        past its prefill) and counts in `tokens[0]` the tokens the slowest request decoded."""
        while True:
            produced, decoded_before = [0] * batch_size, tokens[0]

            def seen(i: int, n: int) -> None:
                produced[i] = n
                if min(produced) >= 2:
                    decoding.set()
                    tokens[0] = decoded_before + min(produced) - 1

            await asyncio.gather(*(self.run(context_per_seq, max_tokens, lambda n, i=i: seen(i, n))
                                   for i in range(batch_size)))

    async def prefill_s(self, prompt_tokens: int, repeats: int) -> float:
        """Median seconds from submitting a `prompt_tokens` prompt alone to its first token; when
        the repeats ran (`time.perf_counter` s, first start to last end) is left in `last_span_s`."""
        samples = []
        first_s = time.perf_counter()
        for _ in range(repeats):
            started = time.perf_counter()
            await self.run(prompt_tokens, 1)
            samples.append(time.perf_counter() - started)
        self.last_span_s = (first_s, time.perf_counter())
        return statistics.median(samples)

    async def decode(self, batch_size: int, context_per_seq: int, steps: int) -> DecodeMeasurement:
        """Step time of `batch_size` sequences decoding together, measured over about `steps`
        tokens after the whole batch is prefilled."""
        runs = await asyncio.gather(*(self.run(context_per_seq, steps + 1) for _ in range(batch_size)))
        return steady_decode(runs, batch_size, context_per_seq, steps)

    async def warm_up(self, prompt_tokens: int = 64, max_tokens: int = 8) -> None:
        """The first requests pay one-off costs (allocations, lazy imports); run two and discard."""
        await asyncio.gather(self.run(prompt_tokens, max_tokens), self.run(prompt_tokens, max_tokens))


Marks = list[tuple[float, int]]  # (time, tokens received so far) at each output of one request


MIN_STEADY_TOKENS = 4  # a request's steady stretch shorter than this is too short to time


def steady_decode(runs: list[Marks], batch_size: int, context_per_seq: int, steps: int) -> DecodeMeasurement:
    """The decode step time of requests that ran together, the median over the requests of:
    (time of its last token - time of its first token once every request had its second) / tokens
    between. (The second output is the first decoded one: behind it every prompt is in the batch
    and, in a cluster, its KV has arrived.) Before that, a request that started early decodes in
    the steps that compute the later ones' prompts (chunked prefill: at long contexts each such
    step takes a prefill's time), which is not a decode step and is left out however long it was.
    A request with fewer than `MIN_STEADY_TOKENS` tokens in its steady stretch is measured from its
    first token to its last instead (its TPOT). Context is the batch's total mid-stretch; the stretch
read spans from the earliest timed token to the latest."""
    all_started_at = max(marks[min(1, len(marks) - 1)][0] for marks in runs)
    per_request, generated, ends = [], [], []
    for marks in runs:
        if len(marks) < 2 or marks[-1][1] == marks[0][1]:
            continue
        steady = [(t, n) for t, n in marks if t > all_started_at]
        if len(steady) < 2 or steady[-1][1] - steady[0][1] < MIN_STEADY_TOKENS:
            steady = [marks[0], marks[-1]]
        (t0, n0), (t1, n1) = steady[0], steady[-1]
        per_request.append((t1 - t0) / (n1 - n0))
        generated.append((n0 + n1) / 2)
        ends.append((t0, t1))
    if not per_request:
        raise RuntimeError(f"decode at batch {batch_size}: no request produced two outputs in "
                           f"{steps} tokens; measure with more steps")
    context = round(batch_size * (context_per_seq + statistics.mean(generated)))
    return DecodeMeasurement(batch_size, context, statistics.median(per_request),
                             min(t0 for t0, _ in ends), max(t1 for _, t1 in ends))
