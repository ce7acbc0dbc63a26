"""Beam search as vLLM's OpenAI server runs it (`vllm/entrypoints/generate/beam_search/online.py`):
outside the engines, in steps. Each step asks every live beam for one token with `2 * beam_width`
logprobs (one request through the cluster per beam, placed as any request, where a prefix cache
holds the beam's tokens, so a step computes about one new position per beam), then keeps the `beam_width` best
continuations; a beam that meets EOS (unless `ignore_eos`) is completed. After `max_tokens` steps
(or when no beam is left) the `beam_width` best beams by vLLM's `get_beam_search_score` (length
penalty) are the answer.

vLLM's own types and scoring are used (`BeamSearchSequence`, `BeamSearchParams`, `Logprob`,
`create_sort_beams_key_function`), and the candidates are chosen with the same numpy calls in the
same order, so ties break as in vLLM and the beams are vLLM's token for token. The decisions
(`advance`, `best_beams`, `finished_beam`) are pure; `search` is the loop, with the step (one
token of one beam) given as a function, so it runs on plain values in tests and on the cluster in
`router.openai_beam`.

Cost: a search of width W and M tokens is up to W * M one-token requests (each counted, traced and
admitted as any request).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Awaitable, Callable

import numpy as np
from vllm.entrypoints.generate.beam_search.utils import BeamSearchSequence, create_sort_beams_key_function
from vllm.logprobs import Logprob
from vllm.sampling_params import BeamSearchParams

StepLogprobs = dict[int, Logprob]   # one step's position: the sampled token first, then the top 2 * width
# One step of one beam: (the beam's tokens, the beam's index in the step) -> its next position's logprobs.
Step = Callable[[list[int], int], Awaitable[StepLogprobs]]
Candidate = tuple[float, int, BeamSearchSequence, StepLogprobs]   # vLLM's: (cum logprob, token, beam, position)


@dataclass(frozen=True)
class Advanced:
    """One step's outcome: the live beams (at most `beam_width`, best first) and the beams the step
    completed with EOS."""
    beams: list[BeamSearchSequence]
    completed: list[BeamSearchSequence]


@dataclass(frozen=True)
class FinishedBeam:
    """A best beam as vLLM's `CompletionOutput` holds it: the tokens after the prompt (EOS
    included only with `include_stop_str_in_output`), the ids its text is decoded from (never
    EOS), one logprobs position per step (one more than `token_ids` when EOS was left out)."""
    token_ids: list[int]
    text_token_ids: list[int]
    cum_logprob: float
    logprobs: list[StepLogprobs]
    finish_reason: str
    stop_reason: int | str | None


def first_beam(prompt_token_ids: list[int]) -> BeamSearchSequence:
    """The search's start: the prompt, nothing generated. (vLLM's `orig_prompt` rebuilds the engine
    input per beam; pdserve sends the beam's token ids, so it only records them.)"""
    return BeamSearchSequence(orig_prompt={"type": "token", "prompt_token_ids": list(prompt_token_ids)},
                              tokens=list(prompt_token_ids), cum_logprob=0, logprobs=[])


def advance(beams: list[BeamSearchSequence], positions: list[StepLogprobs], params: BeamSearchParams,
            eos_token_id: int | None) -> Advanced:
    """The next beams from each beam's step position (`positions[i]` is `beams[i]`'s), as vLLM
    chooses them: every (beam, token) of the positions is a candidate scored by its cumulative
    logprob; EOS (unless `ignore_eos`) completes its beam instead; the `beam_width` best
    candidates, best first, are the live beams."""
    candidates: list[Candidate] = []
    completed: list[BeamSearchSequence] = []
    for beam, position in zip(beams, positions):
        for token_id, logprob in position.items():
            cum_logprob = beam.cum_logprob + logprob.logprob
            if token_id == eos_token_id and not params.ignore_eos:
                completed.append(BeamSearchSequence(
                    orig_prompt=beam.orig_prompt,
                    tokens=beam.tokens + [eos_token_id] if params.include_stop_str_in_output else beam.tokens,
                    logprobs=beam.logprobs + [position], cum_logprob=cum_logprob, finish_reason="stop",
                    stop_reason=eos_token_id))
            else:
                candidates.append((cum_logprob, int(token_id), beam, position))
    return Advanced([BeamSearchSequence(orig_prompt=beam.orig_prompt, tokens=beam.tokens + [token_id],
                                        logprobs=beam.logprobs + [position], lora_request=beam.lora_request,
                                        cum_logprob=cum_logprob)
                     for cum_logprob, token_id, beam, position in _best(candidates, params.beam_width)],
                    completed)


def _best(candidates: list[Candidate], beam_width: int) -> list[Candidate]:
    """The `beam_width` candidates of highest cumulative logprob, best first, with vLLM's numpy
    calls (`argsort`, or `argpartition` then `argsort`), so equal scores order as in vLLM."""
    scores = np.fromiter((candidate[0] for candidate in candidates), dtype=np.float64, count=len(candidates))
    if len(candidates) <= beam_width:
        top = np.argsort(-scores)
    else:
        top = np.argpartition(-scores, beam_width - 1)[:beam_width]
        top = top[np.argsort(-scores[top])]
    return [candidates[int(index)] for index in top]


def best_beams(completed: list[BeamSearchSequence], live: list[BeamSearchSequence], params: BeamSearchParams,
               eos_token_id: int | None) -> list[BeamSearchSequence]:
    """The answer's beams: the `beam_width` best of the completed and the still live ones by vLLM's
    score (cumulative logprob over length ** `length_penalty`), best first."""
    key = create_sort_beams_key_function(eos_token_id, params.length_penalty)
    return sorted(completed + live, key=key, reverse=True)[:params.beam_width]


def finished_beam(beam: BeamSearchSequence, num_prompt_tokens: int, params: BeamSearchParams,
                  eos_token_id: int | None) -> FinishedBeam:
    """A best beam as vLLM returns it (finish "length" unless EOS completed it; the text without EOS)."""
    token_ids = beam.tokens[num_prompt_tokens:]
    ends_in_eos = beam.tokens[-1] == eos_token_id and not params.ignore_eos
    text_token_ids = beam.tokens[num_prompt_tokens:-1] if ends_in_eos else token_ids
    return FinishedBeam(token_ids, text_token_ids, beam.cum_logprob, beam.logprobs,
                        beam.finish_reason if beam.finish_reason is not None else "length", beam.stop_reason)


async def search(prompt_token_ids: list[int], params: BeamSearchParams, eos_token_id: int | None,
                 step: Step) -> list[FinishedBeam]:
    """vLLM's beam search over `step` (`max_tokens` steps at most, every live beam's step run at
    once): the `beam_width` best beams, best first. A step's error ends the search with it (the
    other steps of that round are cancelled)."""
    beams, completed = [first_beam(prompt_token_ids)], []
    for _ in range(params.max_tokens):
        positions = await _gather([step(beam.tokens, index) for index, beam in enumerate(beams)])
        advanced = advance(beams, positions, params, eos_token_id)
        beams = advanced.beams
        completed.extend(advanced.completed)
        if not beams:
            break
    return [finished_beam(beam, len(prompt_token_ids), params, eos_token_id)
            for beam in best_beams(completed, beams, params, eos_token_id)]


async def _gather(steps: list[Awaitable[StepLogprobs]]) -> list[StepLogprobs]:
    """Every step's result, in order; the first error cancels the rest and is raised."""
    tasks = [asyncio.ensure_future(step) for step in steps]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
