"""The HTTP API's choices, logprobs and echo as vLLM's OpenAI server gives them (issue 16 item 1):
a batch of prompts and `n` samples of each are walks of their own, numbered as vLLM numbers
choices, seeded as vLLM seeds samples; logprobs come from the prefill worker (the first token) and
the decode workers (the rest, across a resume), in one order; vLLM's refusals, with its messages.

In-process app over scripted workers behind the `WorkerClient` boundary (a real Redis, the tiny
model's tokenizer), so each case is driven with exact tokens and rows."""

from __future__ import annotations


import grpc
import httpx
import pytest

from kv_transfer.handle import KVHandle
from pdserve.logprobs import SampledLogprobs
from pdserve.worker_api import DecodeChunk, PrefillResult
from router.http_api import create_app
from router.lifecycle import RouterConfig
from router.worker_client import WorkerError
from scripted_workers import ScriptedWorker, scripted_cluster, sse_events

HANDLE = KVHandle("x1", "10.0.0.5:7000", "prefill-a", (4,), 3)
PROMPT = [0, 1609, 375, 565, 282, 262, 480]          # "<|begin_of_text|>Once upon a time"
FIRST = 730                                          # " there"
DECODED = [(465, 262), (1570,)]                      # " was a", " quick"
BROKEN = WorkerError(grpc.StatusCode.UNAVAILABLE, "decode worker died")


def _row(token_id: int, logprob: float) -> SampledLogprobs:
    return SampledLogprobs((token_id, 11, token_id), (logprob, -0.5, logprob), 2)   # logprobs=2: top 2 hold it


def _chunk(ids, finished=False) -> DecodeChunk:
    return DecodeChunk(tuple(ids), finished=finished, finish_reason="length" if finished else "",
                       logprobs=tuple(_row(t, -1.0 - i / 4) for i, t in enumerate(ids)), num_cached_tokens=3)


async def _post(redis_server, tokenizer, path: str, body: dict, decode=None, decode_b=None,
                config: RouterConfig | None = None, prompt_rows: tuple = (), first_row: SampledLogprobs | None = None):
    prefill = ScriptedWorker(prefill=PrefillResult(first_token_id=FIRST, finished=False, kv_handle=HANDLE,
                                                   first_logprobs=first_row or _row(FIRST, -0.75), num_cached_tokens=2,
                                                   prompt_logprobs=prompt_rows))
    workers = {"prefill-a": prefill, "decode-a": ScriptedWorker(decode=decode or [_chunk(DECODED[0]),
                                                                                    _chunk(DECODED[1], True)])}
    if decode_b is not None:
        workers["decode-b"] = ScriptedWorker(decode=decode_b)
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer, workers, config)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(lifecycle, "tiny")),
                                     base_url="http://router") as client:
            reply = await client.post(path, json=body)
        await lifecycle.wait_for_releases()
        return reply, workers
    finally:
        await pool.close()
        await registry.close()



def _body(**fields) -> dict:
    return {"model": "tiny", "prompt": PROMPT, "max_tokens": 4, "temperature": 0} | fields


EXPECTED_COMPLETION_LOGPROBS = {
    "tokens": [" there", " was", " a", " quick"], "token_logprobs": [-0.75, -1.0, -1.25, -1.0],
    "top_logprobs": [{" there": -0.75, "'": -0.5}, {" was": -1.0, "'": -0.5}, {" a": -1.25, "'": -0.5},
                     {" quick": -1.0, "'": -0.5}],
    "text_offset": [0, 6, 10, 12]}


@pytest.mark.parametrize("stream", [False, True])
async def test_completion_logprobs_run_from_the_prefill_s_first_token_through_the_decode(redis_server, tokenizer,
                                                                                        stream):
    reply, _ = await _post(redis_server, tokenizer, "/v1/completions", _body(logprobs=1, stream=stream))
    if stream:
        parts = [event["choices"][0]["logprobs"] for event in sse_events(reply)]
        logprobs = {key: [value for part in parts for value in part[key]] for key in parts[0]}
    else:
        logprobs = reply.json()["choices"][0]["logprobs"]
    assert logprobs == EXPECTED_COMPLETION_LOGPROBS


async def test_a_resumed_decode_goes_on_with_the_logprobs(redis_server, tokenizer):
    reply, workers = await _post(redis_server, tokenizer, "/v1/completions", _body(logprobs=1),
                                 decode=[_chunk(DECODED[0]), BROKEN], decode_b=[_chunk(DECODED[1], True)])
    assert reply.json()["choices"][0]["logprobs"] == EXPECTED_COMPLETION_LOGPROBS
    resumed = (workers["decode-b"].decodes or workers["decode-a"].decodes[1:])[0]
    assert (resumed.num_generated, resumed.sampling.logprobs) == (3, 1)


async def test_chat_logprobs_and_the_role_first_as_vllm_streams_them(redis_server, tokenizer):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0,
            "logprobs": True, "top_logprobs": 1, "stream": True}
    reply, _ = await _post(redis_server, tokenizer, "/v1/chat/completions", body)
    events = sse_events(reply)
    assert events[0]["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                     "finish_reason": None}]
    content = [entry for event in events[1:] for entry in event["choices"][0]["logprobs"]["content"]]
    assert [(e["token"], e["logprob"], e["bytes"]) for e in content] == \
        [(" there", -0.75, list(b" there")), (" was", -1.0, list(b" was")), (" a", -1.25, list(b" a")),
         (" quick", -1.0, list(b" quick"))]
    assert [[top["token"] for top in e["top_logprobs"]] for e in content] == [[" there"], [" was"], [" a"], [" quick"]]


async def test_a_batch_of_prompts_times_n_is_numbered_and_seeded_as_vllm_does(redis_server, tokenizer):
    second = PROMPT[:4]
    reply, workers = await _post(redis_server, tokenizer, "/v1/completions",
                                 _body(prompt=[PROMPT, second], n=2, temperature=1.0, seed=40))
    answer = reply.json()
    assert [choice["index"] for choice in answer["choices"]] == [0, 1, 2, 3]
    assert all(choice["text"] == " there was a quick" for choice in answer["choices"])
    prefills = sorted(workers["prefill-a"].prefills, key=lambda request: request.request_id)
    assert [(p.request_id.rsplit("-", 1)[1], p.prompt_token_ids, p.sampling.seed) for p in prefills] == \
        [("0", tuple(PROMPT), 40), ("1", tuple(PROMPT), 41), ("2", tuple(second), 40), ("3", tuple(second), 41)]
    assert answer["usage"] == {"prompt_tokens": 11, "completion_tokens": 16, "total_tokens": 27}
    assert len(answer["pdserve_timings"]) == 4


async def test_n_streams_each_choice_under_its_index(redis_server, tokenizer):
    reply, _ = await _post(redis_server, tokenizer, "/v1/completions",
                           _body(n=3, temperature=0.8, stream=True, stream_options={"include_usage": True}))
    events = sse_events(reply)
    texts: dict[int, str] = {}
    for event in events[:-1]:
        (choice,) = event["choices"]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert texts == {0: " there was a quick", 1: " there was a quick", 2: " there was a quick"}
    assert events[-1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 12, "total_tokens": 19}


async def test_echo_puts_the_prompt_s_text_first_and_token_ids_are_decoded_as_vllm(redis_server, tokenizer):
    by_ids, _ = await _post(redis_server, tokenizer, "/v1/completions", _body(echo=True))
    by_text, _ = await _post(redis_server, tokenizer, "/v1/completions", _body(prompt="Once upon a time", echo=True))
    assert by_ids.json()["choices"][0]["text"] == "<|begin_of_text|>Once upon a time there was a quick"
    assert by_text.json()["choices"][0]["text"] == "Once upon a time there was a quick"


async def test_echo_with_logprobs_asks_for_the_prompt_s_and_gives_the_first_none(redis_server, tokenizer):
    prompt_rows = tuple(_row(t, -2.0 - i) for i, t in enumerate(PROMPT[1:]))
    reply, workers = await _post(redis_server, tokenizer, "/v1/completions", _body(echo=True, logprobs=0),
                                 prompt_rows=prompt_rows)
    assert workers["prefill-a"].prefills[0].sampling.prompt_logprobs == 0   # vLLM: echo asks logprobs of the prompt
    assert workers["decode-a"].decodes[0].sampling.prompt_logprobs is None  # sent with the first token already
    logprobs = reply.json()["choices"][0]["logprobs"]
    assert logprobs["tokens"] == [tokenizer.decode_one(t) for t in PROMPT] + [" there", " was", " a", " quick"]
    assert logprobs["token_logprobs"] == [None, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, -0.75, -1.0, -1.25, -1.0]
    assert logprobs["top_logprobs"][:2] == [None, {tokenizer.decode_one(PROMPT[1]): -2.0}]
    assert logprobs["text_offset"][7] == len("<|begin_of_text|>Once upon a time")
    prompt_logprobs = reply.json()["choices"][0]["prompt_logprobs"]   # vLLM's choice carries what echo asked
    assert prompt_logprobs[:2] == [None, {str(PROMPT[1]): {"logprob": -2.0, "rank": 2,
                                                           "decoded_token": tokenizer.decode_one(PROMPT[1])}}]


async def test_cached_tokens_are_reported_only_when_enabled_as_in_vllm(redis_server, tokenizer):
    plain, _ = await _post(redis_server, tokenizer, "/v1/completions", _body())
    detailed, _ = await _post(redis_server, tokenizer, "/v1/completions", _body(),
                              config=RouterConfig(max_model_len=256, enable_prompt_tokens_details=True))
    assert "prompt_tokens_details" not in plain.json()["usage"]
    assert detailed.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}  # the prefill engine's


async def test_logit_bias_reaches_both_phases_as_token_ids(redis_server, tokenizer):
    reply, workers = await _post(redis_server, tokenizer, "/v1/completions", _body(logit_bias={"465": 250, "12": -3}))
    assert reply.status_code == 200
    for sampling in (workers["prefill-a"].prefills[0].sampling, workers["decode-a"].decodes[0].sampling):
        assert sampling.to_vllm().logit_bias == {12: -3.0, 465: 100.0}   # clamped to [-100, 100], as vLLM does


@pytest.mark.parametrize("path, fields, param, message", [
    ("/v1/completions", {"n": 2}, "n", "n must be 1 when using greedy sampling, got 2."),
    ("/v1/completions", {"n": 0}, "n", "n must be at least 1, got 0."),
    ("/v1/completions", {"logprobs": 21}, "logprobs", "Requested sample logprobs of 21, which is greater than max "
                                                      "allowed: 20"),
    ("/v1/completions", {"logprobs": -2}, "logprobs", "`logprobs` must be a positive value or -1."),
    ("/v1/completions", {"logprobs": "x"}, "logprobs", "`logprobs` must be an integer."),
    ("/v1/completions", {"prompt_logprobs": 1, "stream": True}, "prompt_logprobs",
     "`prompt_logprobs` are not available when `stream=True`."),
    ("/v1/completions", {"stream_options": {"include_usage": True}}, "stream_options",
     "Stream options can only be defined when `stream=True`."),
    ("/v1/completions", {"logit_bias": {"a": 1.0}}, "logit_bias",
     "logit_bias contains key(s) that cannot be converted to integer token IDs: ['a']"),
    ("/v1/completions", {"logit_bias": {"5000": 1.0}}, "logit_bias",
     "token_id(s) [5000] in logit_bias contain out-of-vocab token ids. Vocabulary size: 2048"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs",
     "when using `top_logprobs`, `logprobs` must be set to true."),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -3}, "top_logprobs",
     "`top_logprobs` must be a positive value or -1."),
    ("/v1/completions", {"logprob_token_ids": [11]}, "logprob_token_ids",
     "when using `logprob_token_ids`, `logprobs` must be set."),
    ("/v1/chat/completions", {"logprob_token_ids": [11], "logprobs": False}, "logprob_token_ids",
     "when using `logprob_token_ids`, `logprobs` must be set to true."),
    ("/v1/completions", {"logprob_token_ids": [11], "logprobs": 0, "echo": True, "max_tokens": 0},
     "logprob_token_ids", "`logprob_token_ids` is not supported when `echo=True` and `max_tokens=0` because no "
                          "output tokens are generated."),
    ("/v1/completions", {"logprob_token_ids": [11, 5000], "logprobs": 0}, "logprob_token_ids",
     "token_id(s) [5000] in logprob_token_ids contain out-of-vocab token ids. Vocabulary size: 2048"),
    ("/v1/chat/completions", {"prompt_logprobs": 1, "stream": True}, "prompt_logprobs",
     "`prompt_logprobs` are not available when `stream=True`."),
    ("/v1/chat/completions", {"prompt_logprobs": -2}, "prompt_logprobs",
     "`prompt_logprobs` must be a positive value or -1."),
])
async def test_vllm_s_refusals_with_its_messages_before_any_worker_is_asked(redis_server, tokenizer, path, fields,
                                                                           param, message):
    body = _body(**fields)
    if path.endswith("chat/completions"):
        body = {k: v for k, v in body.items() if k != "prompt"} | {"messages": [{"role": "user", "content": "hi"}]}
    reply, workers = await _post(redis_server, tokenizer, path, body)
    assert reply.status_code == 400
    assert (reply.json()["error"]["param"], reply.json()["error"]["message"].split(" (parameter=")[0]) == \
        (param, message)
    assert workers["prefill-a"].prefills == []


# ---- /tokenize and /detokenize -------------------------------------------------------------------
async def test_tokenize_and_detokenize_answer_as_vllm_s(redis_server, tokenizer):
    text, _ = await _post(redis_server, tokenizer, "/tokenize", {"model": "tiny", "prompt": "Once upon a time",
                                                                "return_token_strs": True})
    bare, _ = await _post(redis_server, tokenizer, "/tokenize", {"prompt": "Once upon a time",
                                                                "add_special_tokens": False})
    chat, _ = await _post(redis_server, tokenizer, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    back, _ = await _post(redis_server, tokenizer, "/detokenize", {"model": "tiny", "tokens": PROMPT})
    assert text.json() == {"count": 7, "max_model_len": 256, "tokens": PROMPT,
                           "token_strs": tokenizer.token_strings(PROMPT)}
    assert bare.json()["tokens"] == PROMPT[1:]
    assert chat.json()["tokens"] == tokenizer.render_chat([{"role": "user", "content": "hi"}])
    assert back.json() == {"prompt": "<|begin_of_text|>Once upon a time"}


@pytest.mark.parametrize("path, body, status, param", [
    ("/tokenize", {"model": "other", "prompt": "x"}, 404, "model"),
    ("/tokenize", {"prompt": "x", "messages": [{"role": "user", "content": "hi"}]}, 400, "prompt"),
    ("/detokenize", {"tokens": [5, 99999]}, 400, "token_ids"),
])
async def test_tokenize_refusals(redis_server, tokenizer, path, body, status, param):
    reply, _ = await _post(redis_server, tokenizer, path, body)
    assert (reply.status_code, reply.json()["error"]["param"]) == (status, param)


async def test_min_p_and_allowed_token_ids_reach_both_phases_and_vllm_s_refusals(redis_server, tokenizer):
    reply, workers = await _post(redis_server, tokenizer, "/v1/completions",
                                 _body(min_p=0.25, temperature=0.7, allowed_token_ids=[730, 465, 262, 1570]))
    assert reply.status_code == 200
    for sampling in (workers["prefill-a"].prefills[0].sampling, workers["decode-a"].decodes[0].sampling):
        params = sampling.to_vllm()
        assert (params.min_p, params.allowed_token_ids) == (0.25, [730, 465, 262, 1570])
    for fields, message in (({"allowed_token_ids": []}, "allowed_token_ids is not None and empty!"),
                            ({"allowed_token_ids": [5, 4096]}, "allowed_token_ids contains out-of-vocab token id!"),
                            ({"min_p": 1.5}, "min_p must be in [0, 1], got 1.5.")):
        refused, _ = await _post(redis_server, tokenizer, "/v1/completions", _body(**fields))
        assert (refused.status_code, refused.json()["error"]["message"]) == (400, message)


async def test_more_choices_than_the_router_may_run_at_once_is_400_before_any_walk(redis_server, tokenizer):
    reply, workers = await _post(redis_server, tokenizer, "/v1/completions", _body(n=3, temperature=1.0),
                                 config=RouterConfig(max_model_len=256, max_inflight=2))
    assert (reply.status_code, reply.json()["error"]["param"]) == (400, "n")
    assert workers["prefill-a"].prefills == []


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_echo_puts_the_assistant_s_last_message_first_as_vllm(redis_server, tokenizer, stream):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once"}]
    body = {"model": "tiny", "messages": messages, "max_tokens": 4, "temperature": 0, "echo": True, "stream": stream}
    reply, workers = await _post(redis_server, tokenizer, "/v1/chat/completions", body)
    assert workers["prefill-a"].prefills[0].sampling.prompt_logprobs == 0   # vLLM: echo asks top_logprobs of them
    if stream:
        deltas = [event["choices"][0]["delta"] for event in sse_events(reply)]
        assert deltas[:2] == [{"role": "assistant", "content": ""}, {"content": "Once"}]
        assert "".join(delta.get("content", "") for delta in deltas) == "Once there was a quick"
    else:
        assert reply.json()["choices"][0]["message"]["content"] == "Once there was a quick"
        assert reply.json()["prompt_logprobs"] is not None
    user_last, _ = await _post(redis_server, tokenizer, "/v1/chat/completions",
                               body | {"messages": messages[:1], "stream": False})
    assert user_last.json()["choices"][0]["message"]["content"] == " there was a quick"   # not the assistant's


def _listed_row(token_id: int, logprob: float) -> SampledLogprobs:
    """A row asked with logprob_token_ids [11, 12]: the token, then the two listed ids."""
    return SampledLogprobs((token_id, 11, 12), (logprob, -0.5, -2.5), 3)


@pytest.mark.parametrize("stream", [False, True])
async def test_logprob_token_ids_reach_both_phases_and_every_listed_id_is_answered(redis_server, tokenizer, stream):
    decode = [DecodeChunk(DECODED[0], logprobs=tuple(_listed_row(t, -1.0) for t in DECODED[0])),
              DecodeChunk(DECODED[1], finished=True, finish_reason="length",
                          logprobs=tuple(_listed_row(t, -1.0) for t in DECODED[1]))]
    reply, workers = await _post(redis_server, tokenizer, "/v1/completions",
                                 _body(logprobs=0, logprob_token_ids=[11, 12], stream=stream),
                                 decode=decode, first_row=_listed_row(FIRST, -0.75))
    for sampling in (workers["prefill-a"].prefills[0].sampling, workers["decode-a"].decodes[0].sampling):
        assert (sampling.logprobs, sampling.logprob_token_ids) == (None, (11, 12))   # vLLM's to_sampling_params
    if stream:
        tops = [top for event in sse_events(reply) for top in event["choices"][0]["logprobs"]["top_logprobs"]]
    else:
        tops = reply.json()["choices"][0]["logprobs"]["top_logprobs"]
    twelve = tokenizer.decode_one(12)
    assert tops == [{" there": -0.75, "'": -0.5, twelve: -2.5}, {" was": -1.0, "'": -0.5, twelve: -2.5},
                    {" a": -1.0, "'": -0.5, twelve: -2.5}, {" quick": -1.0, "'": -0.5, twelve: -2.5}]


async def test_a_chat_s_prompt_logprobs_are_asked_of_the_prefill_and_answered_on_the_body(redis_server, tokenizer):
    prompt_rows = tuple(_row(t, -2.0) for t in range(1, 12))
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0,
            "prompt_logprobs": 1}
    reply, workers = await _post(redis_server, tokenizer, "/v1/chat/completions", body, prompt_rows=prompt_rows)
    assert workers["prefill-a"].prefills[0].sampling.prompt_logprobs == 1
    assert workers["decode-a"].decodes[0].sampling.prompt_logprobs is None
    prompt_logprobs = reply.json()["prompt_logprobs"]
    assert prompt_logprobs[0] is None and prompt_logprobs[1] == {
        "1": {"logprob": -2.0, "rank": 2, "decoded_token": tokenizer.decode_one(1)},
        "11": {"logprob": -0.5, "rank": 1, "decoded_token": "'"}}
    assert reply.json()["choices"][0]["logprobs"] is None
