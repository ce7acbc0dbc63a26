"""Logprobs are vLLM's from the engine's row to the response body (issue 16 item 1): an engine's
dict is rebuilt into the sampler row it came from (`pdserve.logprobs`), the router's positions are
vLLM's output processor's (`router.output_text`), and the OpenAI objects are what vLLM's own
serving functions make of the same positions (`router.openai_logprobs`; vLLM's functions are the
oracle, called on plain values). Token ids are the tiny model's (byte-level BPE): " café 🙂 ok"
splits "é" and "🙂" over tokens whose text alone is "�", which vLLM corrects from the tokens before."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest

from pdserve.logprobs import SampledLogprobs, listed_from_vllm, rows_from_vllm, sampled_from_vllm
from pdserve.sampling import Sampling
from router.openai_logprobs import chat_logprobs, completion_logprobs, next_text_offset

CAFE = [274, 1216, 132, 107, 225, 177, 258, 252, 229, 267, 79]   # " c" "af" "é" "é" " " 🙂 🙂 🙂 🙂 " o" "k"
PROMPT = [0, 1609, 375, 565, 282, 262, 480]                      # "<|begin_of_text|>Once upon a time"


def _row(token_id: int, num_top: int, seed: int) -> SampledLogprobs:
    """A sampler row: the token, then `num_top` others by rank (the token among them when seed is even)."""
    top = [(token_id + 7 * (i + 1) + seed) % 2048 for i in range(num_top)]
    if seed % 2 == 0 and num_top:
        top[min(1, num_top - 1)] = token_id
    logprobs = [-0.25 * (i + 1) for i in range(num_top)]
    rank = top.index(token_id) + 1 if token_id in top else num_top + 3
    own = logprobs[rank - 1] if token_id in top else -4.5
    return SampledLogprobs((token_id, *top), (own, *logprobs), rank)


def _vllm_position(row: SampledLogprobs, num_top: int) -> dict:
    from vllm.logprobs import append_logprobs_for_next_position

    positions: list = []
    append_logprobs_for_next_position(positions, list(row.token_ids), list(row.logprobs), [None] * len(row.token_ids),
                                      row.rank, num_top)
    return positions[0]


@pytest.mark.parametrize("num_top, seed", [(3, 1), (3, 2), (1, 2), (0, 1), (5, 4)])
def test_an_engine_s_dict_is_rebuilt_into_its_row_and_back(num_top, seed):
    row = _row(465, num_top, seed)
    position = _vllm_position(row, num_top)
    rebuilt = sampled_from_vllm(position, num_top)
    assert rebuilt.token_ids[0] == 465 and len(rebuilt.token_ids) == num_top + 1
    again = _vllm_position(rebuilt, num_top)
    assert [(t, p.logprob, p.rank) for t, p in again.items()] == [(t, p.logprob, p.rank) for t, p in position.items()]


def test_the_whole_vocabulary_dict_is_rebuilt_too():
    row = SampledLogprobs((2, 1, 2, 0), (-1.0, -0.5, -1.0, -2.0), 2)   # a vocabulary of 3, logprobs=-1
    position = _vllm_position(row, -1)
    assert list(position) == [2, 1, 0]
    assert sampled_from_vllm(position, -1) == row


def _positions(tokenizer, token_ids, num_top, **sampling):
    output = tokenizer.output_text(PROMPT, Sampling(logprobs=num_top, max_tokens=32, **sampling))
    step = output.add(token_ids, logprobs=[_row(t, num_top, i) for i, t in enumerate(token_ids)])
    return step


def test_positions_carry_vllm_s_text_corrected_across_split_characters(tokenizer):
    step = _positions(tokenizer, CAFE, 2)
    tokens = [position[0].token for position in step.logprobs]
    assert [position[0].token_id for position in step.logprobs] == CAFE
    assert "".join(tokens) == " café 🙂 ok"   # each "�" piece corrected from the tokens before it, as vLLM does
    assert [len(position) for position in step.logprobs] == [3 if i % 2 else 2 for i in range(len(CAFE))]


def test_a_stop_string_drops_the_logprobs_of_the_tokens_it_drops(tokenizer):
    output = tokenizer.output_text(PROMPT, Sampling(logprobs=1, stop=("af",), max_tokens=32))
    step = output.add(CAFE[:4], logprobs=[_row(t, 1, 1) for t in CAFE[:4]])
    assert step.token_ids == (274, 1216) and [p[0].token_id for p in step.logprobs] == [274, 1216]


def _oracle():
    """vLLM's own serving functions, on a stand-in for the server object they are methods of."""
    from vllm.entrypoints.generate.base.serving import GenerateBaseServing
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion

    server = SimpleNamespace(return_tokens_as_token_ids=False, _get_decoded_token=GenerateBaseServing._get_decoded_token)
    server._get_top_logprobs = functools.partial(OpenAIServingChat._get_top_logprobs, server)
    return (functools.partial(OpenAIServingCompletion._create_completion_logprobs, server),
            functools.partial(OpenAIServingChat._create_chat_logprobs, server))


def _as_vllm(positions) -> list:
    from vllm.logprobs import Logprob

    return [{e.token_id: Logprob(e.logprob, e.rank, e.token) for e in position} or None for position in positions]


@pytest.mark.parametrize("num_top", [0, 2, 5])
@pytest.mark.parametrize("as_ids", [False, True])
def test_completion_logprobs_are_vllm_s(tokenizer, num_top, as_ids):
    vllm_completion, _ = _oracle()
    step = _positions(tokenizer, CAFE, num_top)
    positions = [()] + list(step.logprobs)   # a position without logprobs: an echoed prompt's first token
    token_ids = [PROMPT[-1]] + CAFE
    ours = completion_logprobs(token_ids, positions, num_top, tokenizer.decode_one, 5, as_ids)
    theirs = vllm_completion(token_ids=token_ids, top_logprobs=_as_vllm(positions), num_output_top_logprobs=num_top,
                             tokenizer=tokenizer._hf, initial_text_offset=5, return_as_token_id=as_ids)
    assert ours == theirs.model_dump()
    assert next_text_offset(ours, 5) == ours["text_offset"][-1] + len(ours["tokens"][-1])


@pytest.mark.parametrize("num_top", [0, 1, 3, -1])
def test_chat_logprobs_are_vllm_s(tokenizer, num_top):
    _, vllm_chat = _oracle()
    step = _positions(tokenizer, CAFE, max(num_top, 3))
    positions = list(step.logprobs[:-1]) + [()]  # the last without logprobs: vLLM's fallback entry
    ours = chat_logprobs(CAFE, positions, num_top, tokenizer.decode_one)
    theirs = vllm_chat(token_ids=CAFE, top_logprobs=_as_vllm(positions), tokenizer=tokenizer._hf,
                       num_output_top_logprobs=num_top)
    assert ours == theirs.model_dump()


def test_minus_infinity_is_sent_as_openai_s_floor(tokenizer):
    output = tokenizer.output_text(PROMPT, Sampling(logprobs=1, max_tokens=32))
    step = output.add([730], logprobs=[SampledLogprobs((730, 5), (float("-inf"), -0.5), 9)])
    body = completion_logprobs([730], step.logprobs, 1, tokenizer.decode_one)
    assert body["token_logprobs"] == [-9999.0] and list(body["top_logprobs"][0].values()) == [-9999.0, -0.5]


def test_grpc_chunks_carry_the_positions_to_the_sdk_unchanged():
    from pdserve.client import _chunk
    from pdserve.generation import GenerationChunk
    from pdserve.logprobs import TopLogprob
    from router.grpc_api import chunk_to_proto

    positions = [(TopLogprob(730, -0.5, 1, " there"), TopLogprob(11, -1.5, 2, "'"))]
    chunk = GenerationChunk("r", [730], " there", logprobs=positions, prompt_logprobs=[(), positions[0]])
    again = _chunk(chunk_to_proto(chunk))
    assert (again.logprobs, again.prompt_logprobs) == (positions, [(), positions[0]])
    assert _chunk(chunk_to_proto(GenerationChunk("r", [730], " there"))).prompt_logprobs is None


# ---- logprob_token_ids: the sampled token, then the listed ids (vLLM's `gather_specific_token_logprobs`) ----
def _listed_row(token_id: int, listed: tuple[int, ...], rank: int) -> SampledLogprobs:
    """The sampler's row for `listed`: each listed id's logprob, the sampled token's its own."""
    logprob = {token_id: -0.5} | {other: -1.0 - other / 1000 for other in listed if other != token_id}
    return SampledLogprobs((token_id, *listed), tuple(logprob[t] for t in (token_id, *listed)), rank)


@pytest.mark.parametrize("listed, rank", [((11, 12), 4), ((11, 465, 12), 1), ((12, 12, 11), 3), ((465, 11, 465), 2)])
def test_a_dict_asked_with_listed_ids_is_rebuilt_into_its_row_and_back(listed, rank):
    """The listed ids may hold the sampled token (whose rank the dict then gives as its place in the
    list) or repeat an id (the dict holds it once): the list, not the dict, says where each was."""
    row = _listed_row(465, listed, rank)
    position = _vllm_position(row, len(listed))
    rebuilt = listed_from_vllm(position, listed)
    assert rebuilt.token_ids == (465, *listed)
    again = _vllm_position(rebuilt, len(listed))
    assert [(t, p.logprob, p.rank) for t, p in again.items()] == [(t, p.logprob, p.rank) for t, p in position.items()]


def test_rows_of_listed_ids_are_exact():
    position = _vllm_position(_listed_row(465, (11, 465), 7), 2)   # the dict: 465 ranked 2nd (its place in the list)
    assert rows_from_vllm([position], 2, (11, 465)) == (SampledLogprobs((465, 11, 465), (-0.5, -1.011, -0.5), 2),)
    assert rows_from_vllm(None, 2, (11, 465)) == () and rows_from_vllm([position], None, (11,)) == ()


@pytest.mark.parametrize("listed", [(11, 12), (12, 465, 11)])
def test_listed_ids_are_all_in_each_position_s_top_logprobs_as_vllm_lists_them(tokenizer, listed):
    vllm_completion, vllm_chat = _oracle()
    output = tokenizer.output_text(PROMPT, Sampling(logprob_token_ids=listed, max_tokens=32))
    step = output.add(CAFE[:4], logprobs=[_listed_row(t, listed, 3) for t in CAFE[:4]])
    assert [len(position) for position in step.logprobs] == [len(set(listed) | {t}) for t in CAFE[:4]]
    positions = [()] + list(step.logprobs)   # an echoed prompt's first token: no logprobs
    token_ids = [PROMPT[-1]] + CAFE[:4]
    ours = completion_logprobs(token_ids, positions, 0, tokenizer.decode_one, listed=True)
    theirs = vllm_completion(token_ids=token_ids, top_logprobs=_as_vllm(positions), num_output_top_logprobs=0,
                             tokenizer=tokenizer._hf, logprob_token_ids=list(listed))
    assert ours == theirs.model_dump()
    ours = chat_logprobs(CAFE[:4], list(step.logprobs), 0, tokenizer.decode_one, listed=True)
    theirs = vllm_chat(token_ids=CAFE[:4], top_logprobs=_as_vllm(step.logprobs), tokenizer=tokenizer._hf,
                       num_output_top_logprobs=0, logprob_token_ids=list(listed))
    assert ours == theirs.model_dump()


def test_rows_of_one_request_may_differ_in_length_as_vllm_s_batches_make_them(tokenizer):
    """A top-k request batched with one that has logprob_token_ids gets the listed layout for that
    step (vLLM's sampler prefers it for the whole batch): each row is its own step, never one array."""
    output = tokenizer.output_text(PROMPT, Sampling(logprobs=3, max_tokens=32))
    rows = [_row(CAFE[0], 3, 1), SampledLogprobs((CAFE[1], 0), (-0.5, float("-inf")), 2), _row(CAFE[2], 3, 1)]
    step = output.add(CAFE[:3], logprobs=rows)
    assert [len(position) for position in step.logprobs] == [4, 2, 4]
    assert [(e.token_id, e.rank) for e in step.logprobs[1]] == [(CAFE[1], 2), (0, 1)]
