"""Beam search through the HTTP API (`router.openai_beam`): each step of each beam is a one-token
request with 2 * n logprobs through the lifecycle, the n best beams are the choices, streamed
(chat) or not; vLLM's refusals. In-process app over scripted workers (a real Redis, the tiny
model's tokenizer), every step answered with the same logprobs row."""

from __future__ import annotations

import json

import httpx

from pdserve.logprobs import SampledLogprobs
from pdserve.worker_api import DecodeChunk, PrefillResult
from router.http_api import create_app
from scripted_workers import ScriptedWorker, scripted_cluster

PROMPT = [0, 1609, 375, 565, 282, 262, 480]          # "<|begin_of_text|>Once upon a time"
FIRST = 730                                          # " there"
ROW = SampledLogprobs((FIRST, FIRST, 11, 12, 13), (-0.5, -0.5, -0.75, -1.0, -1.25), 1)   # sampled, then top 4


async def _post(redis_server, tokenizer, path: str, body: dict):
    workers = {"prefill-a": ScriptedWorker(prefill=PrefillResult(first_token_id=FIRST, finished=True,
                                                                 finish_reason="length", first_logprobs=ROW)),
               "decode-a": ScriptedWorker(decode=[DecodeChunk((FIRST,), finished=True, finish_reason="length",
                                                              logprobs=(ROW,))])}
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer, workers)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(lifecycle, "tiny")),
                                     base_url="http://router") as client:
            reply = await client.post(path, json=body)
        return reply, workers
    finally:
        await pool.close()
        await registry.close()


BEAM = {"model": "tiny", "use_beam_search": True, "n": 2, "max_tokens": 1, "temperature": 0}


async def test_the_n_best_one_token_beams_are_the_choices(redis_server, tokenizer):
    reply, workers = await _post(redis_server, tokenizer, "/v1/completions",
                                 BEAM | {"prompt": PROMPT, "logprobs": 1, "return_token_ids": True})
    assert reply.status_code == 200, reply.text
    choices = reply.json()["choices"]
    assert [c["token_ids"] for c in choices] == [[FIRST], [11]]
    assert [c["text"] for c in choices] == [" there", tokenizer.decode([11])]
    assert choices[1]["logprobs"]["token_logprobs"] == [-0.75]
    assert reply.json()["usage"] == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    steps = workers["prefill-a"].prefills + workers["decode-a"].decodes
    assert len(steps) == 1   # one step: the prompt's
    assert (steps[0].sampling.max_tokens, steps[0].sampling.logprobs) == (1, 4)


async def test_a_second_step_asks_each_live_beam_and_keeps_the_best(redis_server, tokenizer):
    reply, workers = await _post(redis_server, tokenizer, "/v1/completions",
                                 BEAM | {"prompt": PROMPT, "n": 1, "max_tokens": 3, "return_token_ids": True})
    assert reply.json()["choices"][0]["token_ids"] == [FIRST, FIRST, FIRST]
    steps = workers["prefill-a"].prefills + [d for d in workers["decode-a"].decodes]
    assert sorted(len(step.prompt_token_ids) for step in steps) == [7, 8, 9]


async def test_a_chat_s_beam_search_streams_each_beam_whole(redis_server, tokenizer):
    reply, _ = await _post(redis_server, tokenizer, "/v1/chat/completions",
                           BEAM | {"messages": [{"role": "user", "content": "Hi"}], "stream": True})
    events = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: {")]
    assert [e["choices"][0]["delta"] for e in events] == [
        {"role": "assistant", "content": ""}, {"role": "assistant", "content": ""},
        {"content": " there"}, {"content": tokenizer.decode([11])}]
    assert [e["choices"][0]["finish_reason"] for e in events[2:]] == ["length", "length"]


async def test_a_streamed_completion_s_beam_search_is_refused_as_vllm_refuses_it(redis_server, tokenizer):
    reply, workers = await _post(redis_server, tokenizer, "/v1/completions", BEAM | {"prompt": PROMPT,
                                                                                   "stream": True})
    assert reply.status_code == 400
    assert reply.json()["error"]["message"] == "Streaming is not currently supported with beam search"
    assert not workers["prefill-a"].prefills


async def test_beam_search_ignores_what_vllm_s_beam_search_does_not_read(redis_server, tokenizer):
    """Greedy n > 1 is refused when sampling, not with beam search; stop strings are not read."""
    reply, _ = await _post(redis_server, tokenizer, "/v1/completions",
                           BEAM | {"prompt": PROMPT, "stop": [" there"], "seed": 1, "presence_penalty": 1.0})
    assert reply.status_code == 200, reply.text
    assert [c["text"] for c in reply.json()["choices"]] == [" there", tokenizer.decode([11])]


async def test_max_tokens_0_answers_the_prompt_s_one_beam_as_vllm_does(redis_server, tokenizer):
    """No step is run: the search's one beam is the prompt, so one empty choice though n is 2."""
    reply, workers = await _post(redis_server, tokenizer, "/v1/completions", BEAM | {"prompt": PROMPT,
                                                                                   "max_tokens": 0})
    assert [(c["index"], c["text"], c["finish_reason"]) for c in reply.json()["choices"]] == [(0, "", "length")]
    assert reply.json()["usage"]["completion_tokens"] == 0
    assert not workers["prefill-a"].prefills and not workers["decode-a"].decodes
