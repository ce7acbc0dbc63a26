"""Beam search behind the OpenAI API (`use_beam_search`), served as vLLM's server serves it: the
search (`router.beam_search`) runs in the router, each step of each beam a one-token request
through the cluster (`Lifecycle.generate`, so admitted, placed, counted and traced as any); the
`n` best beams of each prompt are the prompt's choices, each a finished chunk shaped by the
same `router.openai_response` as sampled choices.

What vLLM's beam search reads (`to_beam_search_params`): `n` (the width), `max_tokens` (capped to
the context), `temperature` (the steps' sampling), `ignore_eos`, `length_penalty`,
`include_stop_str_in_output` (EOS kept in `token_ids`, never in the text), `skip_special_tokens`;
the answer's `echo`, `logprobs` (each step's position: the sampled token and the top 2 * n, with
no text, as vLLM's steps do not detokenize), `return_token_ids`. Every other sampling field
(stop strings, penalties, seed, structured outputs, ...) is ignored, as vLLM ignores it.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import AsyncIterator, Awaitable, Callable

from vllm.logprobs import Logprob
from vllm.sampling_params import BeamSearchParams

from pdserve.errors import InvalidRequest
from pdserve.generation import GenerationChunk
from pdserve.logprobs import TopLogprob
from pdserve.sampling import Sampling, engine_error_field, is_engine_input_error
from router.beam_search import FinishedBeam, Step, StepLogprobs, search
from router.openai_schema import context_room
from router.types import GenerationRequest

STREAM_REFUSAL = "Streaming is not currently supported with beam search"   # vLLM's, for a completion


def beam_params(body, room: int) -> BeamSearchParams:
    """vLLM's `to_beam_search_params` of `body` for a prompt leaving `room` tokens in the context
    (`max_tokens` capped to it as `get_max_tokens` caps it); a width vLLM refuses is 400."""
    asked, _ = body.asked_output_tokens()
    max_tokens = room if asked is None else min(asked, room)
    try:
        return BeamSearchParams(beam_width=body.n, max_tokens=max_tokens, ignore_eos=body.ignore_eos,
                                temperature=1.0 if body.temperature is None else body.temperature,
                                length_penalty=body.length_penalty,
                                include_stop_str_in_output=body.include_stop_str_in_output,
                                skip_special_tokens=body.skip_special_tokens)
    except Exception as error:   # vLLM's VLLMValidationError is no ValueError
        if not is_engine_input_error(error):
            raise
        raise InvalidRequest(str(error), field=engine_error_field(error) or "n") from error


def step_sampling(params: BeamSearchParams) -> Sampling:
    """vLLM's sampling of one step: one token, `2 * beam_width` logprobs, the request's temperature."""
    return Sampling.validated(max_tokens=1, temperature=params.temperature, logprobs=2 * params.beam_width)


def step_request(request_id: str, tokens: list[int], sampling: Sampling, slo_class: str = "",
                 cache_salt: str = "") -> GenerationRequest:
    return GenerationRequest(request_id, list(tokens), sampling, slo_class, cache_salt)


def cluster_step(generate: Callable[[GenerationRequest], AsyncIterator[GenerationChunk]], request_id: str,
                 sampling: Sampling, slo_class: str, cache_salt: str) -> Step:
    """A step of one beam as one request through the cluster (`generate`: `Lifecycle.generate`):
    its one token's logprobs as vLLM's `dict[int, Logprob]`, in the engine's order, without text."""
    async def step(tokens: list[int], index: int) -> StepLogprobs:
        request = step_request(f"{request_id}-{uuid.uuid4().hex}-beam-{index}", tokens, sampling, slo_class,
                               cache_salt)
        position = ()
        async with contextlib.aclosing(generate(request)) as chunks:
            async for chunk in chunks:
                if chunk.logprobs and not position:
                    position = chunk.logprobs[0]
        return {entry.token_id: Logprob(entry.logprob, entry.rank, None) for entry in position}
    return step


def beam_chunk(request_id: str, beam: FinishedBeam, decode: Callable[[list[int], bool], str],
               params: BeamSearchParams) -> GenerationChunk:
    """A best beam as a choice's one (finished) chunk; `decode(ids, skip_special_tokens)` is the
    tokenizer's. No timings: the beam is many requests."""
    positions = [tuple(TopLogprob(token_id, logprob.logprob, logprob.rank, logprob.decoded_token)
                       for token_id, logprob in position.items()) for position in beam.logprobs]
    return GenerationChunk(request_id, list(beam.token_ids), decode(beam.text_token_ids, params.skip_special_tokens),
                           True, beam.finish_reason, None, beam.stop_reason, positions, None)


class SharedSearch:
    """One prompt's search, started by the first of its `n` choices' streams that asks for it
    (so nothing runs before the response is read), awaited by all of them; cancelled with the
    stream that awaits it when the client goes away."""

    def __init__(self, run: Callable[[], Awaitable[list[GenerationChunk]]]):
        self._run, self._task = run, None

    async def beams(self) -> list[GenerationChunk]:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())
        return await self._task

    async def stream(self, index: int) -> AsyncIterator[GenerationChunk]:
        """Choice `index` of the prompt (the `index`-th best beam) as a stream of one chunk; of none
        when the search ended with fewer beams (no step was run), as vLLM answers fewer choices."""
        beams = await self.beams()
        if index < len(beams):
            yield beams[index]


def beam_streams(lifecycle, body, request_id: str, prompts: list[list[int]]) -> list[AsyncIterator[GenerationChunk]]:
    """Each prompt's `n` choices as streams (choice prompt * n + beam), every prompt's first step
    admitted now (refused before any byte is sent, as a sampled request is)."""
    hf, eos = lifecycle.tokenizer.hf, lifecycle.tokenizer.eos_token_id
    decode = lambda ids, skip: hf.decode(ids, skip_special_tokens=skip)  # noqa: E731
    streams: list[AsyncIterator[GenerationChunk]] = []
    for prompt_index, prompt_ids in enumerate(prompts):
        params = beam_params(body, context_room(len(prompt_ids), lifecycle.config.max_model_len))
        sampling = step_sampling(params)
        lifecycle.admit(step_request(request_id, prompt_ids, sampling, body.slo_class, body.cache_salt or ""))
        step = cluster_step(lifecycle.generate, f"{request_id}-{prompt_index}", sampling, body.slo_class,
                            body.cache_salt or "")

        async def run(prompt_ids=prompt_ids, params=params, step=step, prompt_index=prompt_index):
            beams = await search(prompt_ids, params, eos, step)
            return [beam_chunk(f"{request_id}-{prompt_index * params.beam_width + i}", beam, decode, params)
                    for i, beam in enumerate(beams)]

        shared = SharedSearch(run)
        streams += [shared.stream(beam) for beam in range(body.n)]
    return streams
