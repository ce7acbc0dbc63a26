"""The HTTP API answers as vLLM's OpenAI server does (issue 16 item 1): the model name, chat
content parts, stop strings and stop tokens with vLLM's text semantics, vLLM's sampling fields.

In-process app over scripted workers behind the `WorkerClient` boundary (a real Redis, the tiny
model's tokenizer), so each case is driven with exact tokens. The expected texts are written out
from the tokens' own text (byte-level BPE: the output's text is the tail of the whole text)."""

from __future__ import annotations


import httpx
import pytest

from kv_transfer.handle import KVHandle
from pdserve.worker_api import DecodeChunk, PrefillResult
from router.http_api import create_app
from scripted_workers import ScriptedWorker, scripted_cluster, sse_events

HANDLE = KVHandle("x1", "10.0.0.5:7000", "prefill-a", (4,), 3)
# "<|begin_of_text|>Once upon a time" | " there was a quick brown fox. It jumps"
PROMPT = [0, 1609, 375, 565, 282, 262, 480]
FIRST = 730  # " there"
DECODED = [(465, 262, 1570), (887, 496, 1499), (92, 18, 649), (523, 349, 790)]  # " was a quick", " brown", " fox. It", " jumps"
OUTPUT_TEXT = " there was a quick brown fox. It jumps"


class Cluster:
    """A prefill and a decode worker whose decode streams `decoded` (the last chunk finishes it)."""

    def __init__(self, decoded=DECODED, finish_reason="length", stop_reason=None, first_finished=False):
        chunks = [DecodeChunk(tuple(ids)) for ids in decoded[:-1]]
        chunks.append(DecodeChunk(tuple(decoded[-1]), finished=True, finish_reason=finish_reason,
                                  stop_reason=stop_reason))
        self.prefill = ScriptedWorker(prefill=PrefillResult(first_token_id=FIRST, finished=first_finished,
                                                            kv_handle=None if first_finished else HANDLE))
        self.decode = ScriptedWorker(decode=chunks)

    async def post(self, redis_server, tokenizer, path: str, body: dict) -> httpx.Response:
        lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                           {"prefill-a": self.prefill, "decode-a": self.decode})
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(lifecycle, "tiny")),
                                         base_url="http://router") as client:
                reply = await client.post(path, json=body) if body is not None else await client.get(path)
            await lifecycle.wait_for_releases()
            return reply
        finally:
            await pool.close()
            await registry.close()


def _body(**fields) -> dict:
    return {"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "temperature": 0} | fields



# ---- model ------------------------------------------------------------------------------------
async def test_an_unknown_model_is_404_with_vllm_s_error_body_and_nothing_runs(redis_server, tokenizer):
    cluster = Cluster()
    reply = await cluster.post(redis_server, tokenizer, "/v1/completions", _body(model="nonexistent"))
    assert reply.status_code == 404
    assert reply.json() == {"error": {"message": "The model `nonexistent` does not exist. Valid aliases: tiny.",
                                      "type": "NotFoundError", "param": "model", "code": 404}}
    assert cluster.prefill.prefills == [] and cluster.decode.decodes == []


async def test_the_served_name_or_no_model_is_served_and_v1_models_lists_the_served_name(redis_server, tokenizer):
    named = await Cluster().post(redis_server, tokenizer, "/v1/completions", _body())
    unnamed = await Cluster().post(redis_server, tokenizer, "/v1/completions",
                                   {k: v for k, v in _body().items() if k != "model"})
    models = await Cluster().post(redis_server, tokenizer, "/v1/models", None)
    assert (named.status_code, unnamed.status_code) == (200, 200)
    assert [card["id"] for card in models.json()["data"]] == ["tiny"]


# ---- chat content parts ---------------------------------------------------------------------
async def test_chat_text_parts_are_joined_by_newlines_as_vllm_joins_them(redis_server, tokenizer):
    cluster = Cluster()
    parts = [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]
    reply = await cluster.post(redis_server, tokenizer, "/v1/chat/completions",
                               {"model": "tiny", "messages": [{"role": "user", "content": parts}], "max_tokens": 12})
    assert reply.status_code == 200
    assert list(cluster.prefill.prefills[0].prompt_token_ids) == tokenizer.render_chat(
        [{"role": "user", "content": "Hi\nthere"}])
    assert reply.json()["choices"][0]["message"]["content"] == OUTPUT_TEXT


async def test_a_chat_part_that_is_not_text_is_400_naming_it(redis_server, tokenizer):
    cluster = Cluster()
    parts = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
    reply = await cluster.post(redis_server, tokenizer, "/v1/chat/completions",
                               {"model": "tiny", "messages": [{"role": "user", "content": parts}]})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "messages.0.content.1.type" and "'image_url'" in error["message"]
    assert cluster.prefill.prefills == []


# ---- stop strings and stop tokens ---------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
async def test_a_stop_string_cuts_the_text_before_it_and_ends_the_decode(redis_server, tokenizer, stream):
    cluster = Cluster()
    reply = await cluster.post(redis_server, tokenizer, "/v1/completions", _body(stop=["fox"], stream=stream))
    if stream:
        events = sse_events(reply)
        texts = [event["choices"][0]["text"] for event in events]
        assert not any("f" in text for text in texts)  # no part of the stop string was ever sent
        text, last = "".join(texts), events[-1]["choices"][0]
    else:
        text, last = reply.json()["choices"][0]["text"], reply.json()["choices"][0]
        assert reply.json()["usage"]["completion_tokens"] == 8  # " there" ... " fo" "x": "x" completed it
    assert text == " there was a quick brown "
    assert (last["finish_reason"], last["stop_reason"]) == ("stop", "fox")
    assert cluster.decode.num_streams_closed == 1  # closed at the chunk with "x": " jumps" was never read


@pytest.mark.parametrize("include, expected", [(False, " ther"), (True, " there w")])
async def test_a_stop_string_across_the_first_token_and_the_decode_is_found(redis_server, tokenizer,
                                                                           include, expected):
    """No engine sees "e w": the prefill's output ends at " there", the decode's starts at " was"."""
    cluster = Cluster()
    reply = await cluster.post(redis_server, tokenizer, "/v1/completions",
                               _body(stop=["e w"], include_stop_str_in_output=include))
    choice = reply.json()["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == (expected, "stop", "e w")
    assert reply.json()["usage"]["completion_tokens"] == 2  # " there", " was"


async def test_stop_strings_are_not_checked_within_min_tokens(redis_server, tokenizer):
    """vLLM checks stop strings only after min_tokens, and only in the text after them: the " a" of
    the third token is not a stop, though the decode worker was asked for one token fewer."""
    stopped = await Cluster().post(redis_server, tokenizer, "/v1/completions", _body(stop=[" a"]))
    kept = await Cluster().post(redis_server, tokenizer, "/v1/completions", _body(stop=[" a"], min_tokens=3))
    assert stopped.json()["choices"][0]["text"] == " there was"
    assert (kept.json()["choices"][0]["text"], kept.json()["choices"][0]["finish_reason"]) == (OUTPUT_TEXT, "length")


@pytest.mark.parametrize("stream", [False, True])
async def test_a_stop_token_is_left_out_of_the_text_and_named_as_the_stop_reason(redis_server, tokenizer, stream):
    cluster = Cluster(decoded=[(465, 262, 1570), (887, 496, 1499), (92, 18)], finish_reason="stop", stop_reason=18)
    reply = await cluster.post(redis_server, tokenizer, "/v1/completions", _body(stop_token_ids=[18], stream=stream))
    if stream:
        events = sse_events(reply)
        text, last = "".join(e["choices"][0]["text"] for e in events), events[-1]["choices"][0]
    else:
        text, last = reply.json()["choices"][0]["text"], reply.json()["choices"][0]
    assert text == " there was a quick brown fox"  # the "." that stopped it is not in the text
    assert (last["finish_reason"], last["stop_reason"]) == ("stop", 18)
    assert cluster.decode.decodes[0].sampling.stop_token_ids == (18,)


async def test_a_stop_string_in_the_first_token_alone_releases_the_prefill_kv(redis_server, tokenizer):
    cluster = Cluster()
    reply = await cluster.post(redis_server, tokenizer, "/v1/completions", _body(stop=["her"]))
    choice = reply.json()["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == (" t", "stop", "her")
    assert cluster.decode.decodes == []
    assert cluster.prefill.releases == [(cluster.prefill.prefills[0].transfer_id, reply.json()["id"])]


# ---- sampling fields --------------------------------------------------------------------------
async def test_penalties_reach_both_phases_and_vllm(redis_server, tokenizer):
    cluster = Cluster()
    fields = {"presence_penalty": 0.5, "frequency_penalty": -0.25, "repetition_penalty": 1.3}
    reply = await cluster.post(redis_server, tokenizer, "/v1/completions", _body(**fields))
    assert reply.status_code == 200
    for sampling in (cluster.prefill.prefills[0].sampling, cluster.decode.decodes[0].sampling):
        params = sampling.to_vllm()
        assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.5, -0.25, 1.3)


@pytest.mark.parametrize("field, value", [("presence_penalty", 2.5), ("frequency_penalty", -3),
                                          ("repetition_penalty", 0)])
async def test_a_penalty_out_of_vllm_s_range_is_400_naming_it(redis_server, tokenizer, field, value):
    cluster = Cluster()
    reply = await cluster.post(redis_server, tokenizer, "/v1/completions", _body(**{field: value}))
    assert (reply.status_code, reply.json()["error"]["param"]) == (400, field)
    assert cluster.prefill.prefills == []


async def test_a_cache_salt_reaches_both_phases(redis_server, tokenizer):
    cluster = Cluster()
    reply = await cluster.post(redis_server, tokenizer, "/v1/completions", _body(cache_salt="tenant-a"))
    assert reply.status_code == 200
    assert cluster.prefill.prefills[0].cache_salt == cluster.decode.decodes[0].cache_salt == "tenant-a"


@pytest.mark.parametrize("salt", ["", "a/b", "x" * 129, 7])
async def test_a_cache_salt_vllm_refuses_is_400_with_its_message(redis_server, tokenizer, salt):
    cluster = Cluster()
    reply = await cluster.post(redis_server, tokenizer, "/v1/completions", _body(cache_salt=salt))
    assert (reply.status_code, reply.json()["error"]["param"]) == (400, "cache_salt")
    assert reply.json()["error"]["message"].startswith("Parameter 'cache_salt' must")   # vLLM's words
    assert cluster.prefill.prefills == []


@pytest.mark.parametrize("fields, message", [
    ({"suffix": "x", "prompt": "Once upon a time"}, "suffix is only supported for models with FIM completion rendering"),
    ({"suffix": "x"}, "suffix requires text prompt input for FIM completion rendering"),   # token ids
    ({"suffix": "x", "echo": True}, "Echo is unsupported with suffix."),
    ({"suffix": "x", "truncate_prompt_tokens": 2}, "suffix is not supported with truncate_prompt_tokens"),
])
async def test_a_suffix_is_refused_as_vllm_refuses_it_without_fim_rendering(redis_server, tokenizer, fields, message):
    cluster = Cluster()
    reply = await cluster.post(redis_server, tokenizer, "/v1/completions", _body(**fields))
    assert (reply.status_code, reply.json()["error"]["param"], reply.json()["error"]["message"]) == (
        400, "suffix", message)
    assert cluster.prefill.prefills == []


async def test_echo_without_generation_answers_the_prompt_alone_from_a_walk_of_one_token(redis_server, tokenizer):
    """vLLM's echo with max_tokens 0: the engines generate one token, counted and not shown."""
    cluster = Cluster(first_finished=True)
    reply = await cluster.post(redis_server, tokenizer, "/v1/completions",
                               _body(prompt="Once upon a time", echo=True, max_tokens=0))
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"] == "Once upon a time"   # not the generated " there"
    assert reply.json()["usage"]["completion_tokens"] == 1
    ids = await Cluster(first_finished=True).post(redis_server, tokenizer, "/v1/completions",
                                                  _body(echo=True, max_tokens=0, return_token_ids=True))
    assert ids.json()["choices"][0]["token_ids"] == [FIRST]   # vLLM's: the choice's own (hidden) token
    assert cluster.prefill.prefills[0].sampling.max_tokens == 1 and cluster.decode.decodes == []
    refused = await Cluster().post(redis_server, tokenizer, "/v1/completions", _body(max_tokens=0))
    assert refused.status_code == 400   # without echo, as vLLM: max_tokens 0 generates nothing to answer
