"""A chat's tools and tool calls as vLLM's OpenAI server serves them (router/openai_tools.py):
vLLM's checks and refusals without a parser, and vLLM's own `hermes` parser over an answer that
calls tools, whole and streamed.

In-process app over scripted workers (a real Redis, the tiny model's tokenizer): the decode worker
streams the tokens of a written-out answer, so what the parser finds is known exactly."""

from __future__ import annotations

import json

import httpx
import pytest

from kv_transfer.handle import KVHandle
from pdserve.errors import InvalidRequest
from pdserve.worker_api import DecodeChunk, PrefillResult
from router.http_api import create_app
from router.openai_tools import ChatParsing, check_tool_fields
from scripted_workers import ScriptedWorker, scripted_cluster, sse_events

HANDLE = KVHandle("x1", "10.0.0.5:7000", "prefill-a", (4,), 3)
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SECOND_CALL = '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
HERMES = ChatParsing(tool_call_parser="hermes", enable_auto_tool_choice=True)


def _chat(**fields) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 64,
            "temperature": 0} | fields


class Cluster:
    """A prefill and a decode worker whose answer is `text`'s tokens (prefill samples the first,
    the decode worker streams the rest `per_chunk` at a time, the last chunk finishing it; a "stop"
    ends on the end-of-sequence token, as an engine's does)."""

    def __init__(self, tokenizer, text: str, finish_reason: str = "stop", per_chunk: int = 3):
        ids = tokenizer.tokenize(text, add_special_tokens=False)
        ids += [tokenizer.hf.eos_token_id] if finish_reason == "stop" else []
        groups = [ids[i:i + per_chunk] for i in range(1, len(ids), per_chunk)] or [[]]
        chunks = [DecodeChunk(tuple(group)) for group in groups[:-1]]
        chunks.append(DecodeChunk(tuple(groups[-1]), finished=True, finish_reason=finish_reason))
        self.prefill = ScriptedWorker(prefill=PrefillResult(first_token_id=ids[0], finished=False, kv_handle=HANDLE))
        self.decode = ScriptedWorker(decode=chunks)

    async def post(self, redis_server, tokenizer, body: dict, parsing: ChatParsing = ChatParsing()) -> httpx.Response:
        lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                           {"prefill-a": self.prefill, "decode-a": self.decode})
        try:
            app = create_app(lifecycle, "tiny", parsing=parsing)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as client:
                reply = await client.post("/v1/chat/completions", json=body)
            await lifecycle.wait_for_releases()
            return reply
        finally:
            await pool.close()
            await registry.close()



# ---- vLLM's checks of the fields (pure) ---------------------------------------------------------
def test_tools_without_a_choice_default_to_auto_as_in_vllm():
    assert check_tool_fields({"tools": [WEATHER]})["tool_choice"] == "auto"
    assert check_tool_fields({"tools": [WEATHER], "tool_choice": "none"})["tool_choice"] == "none"
    assert check_tool_fields({"messages": []}) == {"messages": []}


@pytest.mark.parametrize("body, field, words", [
    ({"tools": []}, "tools", "must not be an empty array"),
    ({"tool_choice": "required"}, "tool_choice", "`tools` must be set"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "Invalid value for `tool_choice`"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "does not match any of the specified `tools`"),
    ({"tools": [{"type": "function"}]}, "tools", "tools.0.function"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice", "tool_choice.function"),
])
def test_vllm_s_refusals_of_tools_and_tool_choice_name_the_field(body, field, words):
    with pytest.raises(InvalidRequest) as refused:
        check_tool_fields(body)
    assert refused.value.field == field and words in refused.value.message


@pytest.mark.parametrize("choice, message", [
    ("auto", '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'),
    ("required", 'tool_choice="required" requires --tool-call-parser to be set'),
    ({"type": "function", "function": {"name": "get_weather"}},
     'tool_choice=function "get_weather" requires --tool-call-parser to be set'),
])
def test_without_a_parser_a_choice_that_needs_one_is_refused_with_vllm_s_message(choice, message):
    with pytest.raises(InvalidRequest) as refused:
        ChatParsing().check_tool_choice(choice)
    assert refused.value.message == message
    ChatParsing().check_tool_choice("none")
    ChatParsing(tool_call_parser="hermes").check_tool_choice(choice)


def test_auto_tool_choice_needs_a_parser_as_vllm_s_flags_do():
    with pytest.raises(ValueError, match="requires --tool-call-parser"):
        ChatParsing(enable_auto_tool_choice=True)


def test_a_parser_name_vllm_does_not_know_is_refused_naming_the_flag_and_the_known_names():
    with pytest.raises(ValueError, match=r"--tool-call-parser hermez: not one of vLLM's parsers \(.*hermes"):
        ChatParsing(tool_call_parser="hermez").check_names()
    with pytest.raises(ValueError, match="--reasoning-parser nope"):
        ChatParsing(reasoning_parser="nope").check_names()
    ChatParsing(tool_call_parser="hermes", reasoning_parser="granite").check_names()


# ---- the HTTP API ------------------------------------------------------------------------------
async def test_without_a_parser_tools_are_served_with_choice_none_and_auto_is_400_before_any_work(
        redis_server, tokenizer):
    cluster = Cluster(tokenizer, CALL)
    plain = await cluster.post(redis_server, tokenizer, _chat(tools=[WEATHER], tool_choice="none"))
    assert plain.status_code == 200
    assert plain.json()["choices"][0]["message"]["content"] == CALL   # no parser: the text as it came
    assert "tool_calls" not in plain.json()["choices"][0]["message"]
    refused = Cluster(tokenizer, CALL)
    reply = await refused.post(redis_server, tokenizer, _chat(tools=[WEATHER]))
    assert reply.status_code == 400 and "--enable-auto-tool-choice" in reply.json()["error"]["message"]
    assert refused.prefill.prefills == [] and refused.decode.decodes == []


async def test_an_auto_choice_answer_that_calls_a_tool_is_parsed_by_vllm_s_parser(redis_server, tokenizer):
    cluster = Cluster(tokenizer, CALL)
    reply = await cluster.post(redis_server, tokenizer, _chat(tools=[WEATHER]), HERMES)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    sampling = cluster.prefill.prefills[0].sampling
    assert sampling.skip_special_tokens is False   # hermes's adjustment reaches the workers


async def test_a_streamed_tool_call_arrives_in_deltas_that_add_up_to_the_call(redis_server, tokenizer):
    cluster = Cluster(tokenizer, CALL)
    reply = await cluster.post(redis_server, tokenizer, _chat(tools=[WEATHER], stream=True), HERMES)
    events = sse_events(reply)
    deltas = [event["choices"][0]["delta"] for event in events]
    calls = [call for delta in deltas for call in delta.get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"].startswith("chatcmpl-tool-")
    arguments = "".join(call["function"].get("arguments") or "" for call in calls)
    assert json.loads(arguments) == {"city": "Paris"}
    assert not any(delta.get("content") for delta in deltas[1:])   # the call's markup is not content
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_parallel_tool_calls_false_answers_the_first_call_only(redis_server, tokenizer):
    both = await Cluster(tokenizer, CALL + SECOND_CALL).post(redis_server, tokenizer,
                                                             _chat(tools=[WEATHER, TIME]), HERMES)
    first = await Cluster(tokenizer, CALL + SECOND_CALL).post(
        redis_server, tokenizer, _chat(tools=[WEATHER, TIME], parallel_tool_calls=False), HERMES)
    names = lambda reply: [c["function"]["name"] for c in reply.json()["choices"][0]["message"]["tool_calls"]]  # noqa: E731
    assert names(both) == ["get_weather", "get_time"]
    assert names(first) == ["get_weather"]


async def test_an_answer_without_a_call_is_content_and_keeps_its_finish_reason(redis_server, tokenizer):
    reply = await Cluster(tokenizer, "It is sunny in Paris.", finish_reason="length").post(
        redis_server, tokenizer, _chat(tools=[WEATHER]), HERMES)
    choice = reply.json()["choices"][0]
    assert choice["message"]["content"] == "It is sunny in Paris." and choice["finish_reason"] == "length"
    assert "tool_calls" not in choice["message"]


async def test_a_required_choice_sends_the_workers_vllm_s_constraint_for_a_call(redis_server, tokenizer):
    """hermes constrains a required call to its own markup (vLLM's structural tag), then parses it."""
    cluster = Cluster(tokenizer, CALL)
    reply = await cluster.post(redis_server, tokenizer, _chat(tools=[WEATHER], tool_choice="required"), HERMES)
    choice = reply.json()["choices"][0]
    assert [c["function"] for c in choice["message"]["tool_calls"]] == [
        {"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    assert choice["finish_reason"] == "tool_calls"
    constraint = cluster.prefill.prefills[0].sampling.structured_outputs_json
    assert constraint is not None and "structural_tag" in json.loads(constraint) and "get_weather" in constraint


async def test_an_assistant_s_tool_calls_and_a_tool_s_answer_are_taken_in_the_conversation(redis_server, tokenizer):
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call-1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call-1", "content": "sunny"}]
    reply = await Cluster(tokenizer, "It is sunny.").post(redis_server, tokenizer,
                                                          _chat(messages=messages, tools=[WEATHER], tool_choice="none"))
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == "It is sunny."


# ---- a reasoning parser ------------------------------------------------------------------------
THOUGHT = "Here is my thought process: rivers flow. Here is my response: They do."
GRANITE = ChatParsing(reasoning_parser="granite")


async def test_a_reasoning_parser_splits_reasoning_from_content_and_counts_its_tokens(redis_server, tokenizer):
    reply = await Cluster(tokenizer, THOUGHT).post(redis_server, tokenizer, _chat(), GRANITE)
    body = reply.json()
    message = body["choices"][0]["message"]
    assert message["reasoning"].strip() == "rivers flow." and message["content"].strip() == "They do."
    # vLLM's usage names the reasoning tokens whenever a reasoning parser runs (granite's, text-based, counts none)
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}


async def test_include_reasoning_false_drops_the_reasoning_and_its_logprobs(redis_server, tokenizer):
    reply = await Cluster(tokenizer, THOUGHT).post(redis_server, tokenizer,
                                                   _chat(include_reasoning=False, logprobs=True), GRANITE)
    choice = reply.json()["choices"][0]
    assert choice["message"]["reasoning"] is None and choice["message"]["content"].strip() == "They do."
    assert choice["logprobs"] is None


async def test_streamed_reasoning_arrives_as_reasoning_deltas_then_content(redis_server, tokenizer):
    """Token by token, as vLLM's engine streams (granite's streaming parser reads one token a delta)."""
    reply = await Cluster(tokenizer, THOUGHT, per_chunk=1).post(
        redis_server, tokenizer, _chat(stream=True, stream_options={"include_usage": True}), GRANITE)
    events = sse_events(reply)
    deltas = [event["choices"][0]["delta"] for event in events if event["choices"]]
    reasoning = "".join(delta.get("reasoning") or "" for delta in deltas)
    content = "".join(delta.get("content") or "" for delta in deltas)
    # granite's streaming parser (vLLM's, text-based) may hold back where the split falls; what
    # pdserve owes is that its deltas reach the client as reasoning, then content
    assert reasoning.strip().startswith("rivers flow.") and content.strip().endswith("They do.")
    assert "thought process" not in reasoning + content
    assert events[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
