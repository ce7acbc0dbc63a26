"""vLLM's extra request fields as vLLM's server (default flags) serves them (issue 16):
`stream_interval` batches a stream's tokens, `repetition_detection` ends a walk on a repeated
n-gram (checked by the router over the whole output), `return_prompt_text` sends the rendered
prompt, `reasoning_effort` reaches the template, `thinking_token_budget` is refused as vLLM's
engine refuses it without a reasoning config, and the fields that change nothing on vLLM's server
(`session_id`, `watermarking`, `return_token_offsets`, `vllm_xargs`, `include_reasoning`) change
nothing here. Pure functions with plain values; the HTTP API over scripted workers."""

from __future__ import annotations

import pytest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VllmChatRequest
from vllm.sampling_params import RepetitionDetectionParams

from pdserve.errors import InvalidRequest
from pdserve.generation import GenerationChunk
from pdserve.worker_api import DecodeChunk
from router.openai_chat import ChatCompletionRequest
from router.openai_response import StreamInterval
from router.openai_schema import CompletionRequest
from router.openai_vllm_extras import (
    THINKING_BUDGET_UNCONFIGURED, check_vllm_xargs, reasoning_template_kwargs, repetition_end,
    thinking_budget_refusal, thinking_token_budget,
)
from scripted_workers import sse_events
from test_openai_choices import FIRST, _body, _post

CHAT = [{"role": "user", "content": "hi"}]


# ---- pure functions ------------------------------------------------------------------------------
@pytest.mark.parametrize("value, budget", [(None, None), (-1, None), (0, 0), (64, 64)])
def test_thinking_token_budget_is_read_as_vllm_reads_it(value, budget):
    assert thinking_token_budget(value) == budget


@pytest.mark.parametrize("value", [-2, 1.5, True, "10"])
def test_a_thinking_token_budget_that_is_no_budget_is_refused_naming_the_field(value):
    with pytest.raises(InvalidRequest) as refused:
        thinking_token_budget(value)
    assert refused.value.field == "thinking_token_budget"
    assert refused.value.message.startswith("`thinking_token_budget` must be a non-negative integer")


def test_any_budget_is_refused_as_vllm_s_engine_refuses_it_without_a_reasoning_config():
    assert thinking_budget_refusal(None) is None
    refusal = thinking_budget_refusal(0)
    assert (refusal.message, refusal.field) == (THINKING_BUDGET_UNCONFIGURED, "thinking_token_budget")


def test_vllm_xargs_integers_must_fit_vllm_s_wire():
    check_vllm_xargs(None)
    check_vllm_xargs({"a": [1, "b", 2.5], "big": 2**64 - 1, "small": -2**63})
    with pytest.raises(InvalidRequest) as refused:
        check_vllm_xargs({"a": [1, 2**64]})
    assert (refused.value.field, refused.value.message) == (
        "extra_args", "extra_args integers must be between -2**63 and 2**64 - 1.")


PAIRS = RepetitionDetectionParams(max_pattern_size=2, min_count=2)


def test_a_repetition_ends_the_output_at_the_token_that_completes_it():
    assert repetition_end([7, 8], [7, 8, 9], PAIRS) == 2         # 7 8 7 8: the pair twice, at the 2nd new token
    assert repetition_end([], [7, 7], PAIRS) == 2                # 7 7: one token twice
    assert repetition_end([7, 8], [9, 10], PAIRS) is None
    assert repetition_end([1, 2, 3], [], PAIRS) is None


def test_a_repetition_before_min_tokens_does_not_end_the_output():
    assert repetition_end([], [7, 7, 7], PAIRS, min_tokens=3) == 3
    assert repetition_end([], [7, 7], PAIRS, min_tokens=3) is None


def test_a_disabled_repetition_check_never_ends_the_output():
    assert repetition_end([], [7] * 10, RepetitionDetectionParams()) is None


@pytest.mark.parametrize("effort, kwargs, added", [
    (None, None, {}),
    ("low", None, {"reasoning_effort": "low", "enable_thinking": True}),
    ("none", {}, {"reasoning_effort": "none", "enable_thinking": False}),
    ("high", {"enable_thinking": None}, {"reasoning_effort": "high"}),
])
def test_reasoning_effort_adds_itself_and_enable_thinking_unless_the_request_names_it(effort, kwargs, added):
    assert reasoning_template_kwargs(effort, kwargs) == added


@pytest.mark.parametrize("fields", [
    {"reasoning_effort": "low"}, {"reasoning_effort": "none"},
    {"reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": False, "reasoning_effort": "low"}},
    {"reasoning_effort": "medium", "chat_template_kwargs": {"enable_thinking": None, "x": 1}},
    {"chat_template_kwargs": {"reasoning_effort": "low"}},
])
def test_the_template_gets_vllm_s_reasoning_arguments(fields):
    body = {"messages": CHAT} | fields
    vllm_s = VllmChatRequest.model_validate(body | {"model": "tiny"}).build_chat_params(None, "auto")
    # the server's defaults (`OnlineRenderer.preprocess_chat`: the request's tools, none here)
    served = vllm_s.with_defaults({"tools": None, "tokenize": False}).get_apply_chat_template_kwargs()
    assert ChatCompletionRequest.model_validate(body).template_kwargs() == served


def _chunk(*ids: int, finished: bool = False) -> GenerationChunk:
    return GenerationChunk("r", list(ids), "".join(f"<{i}>" for i in ids), finished, "length" if finished else "")


def test_a_stream_interval_sends_the_first_token_then_every_interval_then_the_rest_at_the_end():
    interval = StreamInterval(3)
    sent = [interval.add(chunk) for chunk in [_chunk(1), _chunk(2), _chunk(3), _chunk(4), _chunk(5), _chunk(6, 7),
                                              _chunk(8, finished=True)]]
    assert [(c.token_ids, c.text, c.finished) if c else None for c in sent] == [
        ([1], "<1>", False), None, None, ([2, 3, 4], "<2><3><4>", False), None, ([5, 6, 7], "<5><6><7>", False),
        ([8], "<8>", True)]


def test_an_interval_of_one_sends_every_chunk_as_it_comes():
    interval = StreamInterval(1)
    assert [interval.add(chunk) for chunk in [_chunk(1), _chunk(), _chunk(2)]] == [_chunk(1), _chunk(), _chunk(2)]


def test_vllm_s_refusals_of_the_fields_values():
    for body in ({"stream_interval": 0}, {"repetition_detection": {"max_pattern_size": "a"}},
                 {"vllm_xargs": {"a": {"nested": 1}}}, {"session_id": 5}, {"watermarking": "maybe"}):
        with pytest.raises(ValueError):   # pydantic's: the body's schema error (400 "Bad Request")
            CompletionRequest.model_validate({"prompt": "x"} | body)
    with pytest.raises(InvalidRequest, match="min_count must be >= 2"):
        CompletionRequest.model_validate({"prompt": "x", "repetition_detection": {"max_pattern_size": 2}})
    with pytest.raises(ValueError):
        ChatCompletionRequest.model_validate({"messages": CHAT, "reasoning_effort": "extreme"})


# ---- the HTTP API over scripted workers ----------------------------------------------------------
def _decode(*steps: tuple[int, ...]) -> list[DecodeChunk]:
    return [DecodeChunk(tuple(ids), finished=i == len(steps) - 1, finish_reason="length" if i == len(steps) - 1
                        else "") for i, ids in enumerate(steps)]


async def test_a_streamed_completion_is_batched_by_stream_interval(redis_server, tokenizer):
    decode = _decode((465,), (262,), (1570,), (284,), (262,))
    reply, _ = await _post(redis_server, tokenizer, "/v1/completions",
                           _body(stream=True, stream_interval=2, max_tokens=6, return_token_ids=True), decode=decode)
    events = [event["choices"][0] for event in sse_events(reply)]
    assert [choice["token_ids"] for choice in events] == [[FIRST], [465, 262], [1570, 284], [262]]
    assert [choice["finish_reason"] for choice in events] == [None, None, None, "length"]
    whole, _ = await _post(redis_server, tokenizer, "/v1/completions", _body(max_tokens=6), decode=decode)
    assert "".join(choice["text"] for choice in events) == whole.json()["choices"][0]["text"]


async def test_stream_interval_changes_nothing_in_a_whole_answer(redis_server, tokenizer):
    plain, _ = await _post(redis_server, tokenizer, "/v1/completions", _body())
    batched, _ = await _post(redis_server, tokenizer, "/v1/completions", _body(stream_interval=3))
    assert batched.json()["choices"] == plain.json()["choices"]


async def test_a_repetition_ends_the_walk_with_vllm_s_finish_and_stop_reason(redis_server, tokenizer):
    decode = _decode((465, FIRST, 465, FIRST), (262,))   # FIRST 465 FIRST 465: the pair twice at the 3rd decoded
    body = _body(max_tokens=8, repetition_detection={"max_pattern_size": 2, "min_count": 2})
    reply, workers = await _post(redis_server, tokenizer, "/v1/completions", body, decode=decode)
    choice = reply.json()["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("repetition", "repetition_detected")
    assert reply.json()["usage"]["completion_tokens"] == 4
    assert workers["decode-a"].num_streams_closed == 1   # the decode is ended by the router


async def test_the_rendered_prompt_is_sent_with_return_prompt_text(redis_server, tokenizer):
    body = {"model": "tiny", "messages": CHAT, "max_tokens": 4, "temperature": 0, "return_prompt_text": True}
    rendered = tokenizer.apply_template(CHAT)
    whole, _ = await _post(redis_server, tokenizer, "/v1/chat/completions", body)
    assert whole.json()["prompt_text"] == rendered
    streamed, _ = await _post(redis_server, tokenizer, "/v1/chat/completions", body | {"stream": True})
    events = sse_events(streamed)
    assert events[0]["prompt_text"] == rendered
    assert all("prompt_text" not in event for event in events[1:])


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_a_thinking_token_budget_is_refused_as_vllm_s_engine_refuses_it(redis_server, tokenizer, path):
    body = _body(thinking_token_budget=16)
    if path.endswith("chat/completions"):
        body = {k: v for k, v in body.items() if k != "prompt"} | {"messages": CHAT}
    whole, workers = await _post(redis_server, tokenizer, path, body)
    assert (whole.status_code, whole.json()["error"]["message"]) == (400, THINKING_BUDGET_UNCONFIGURED)
    streamed, _ = await _post(redis_server, tokenizer, path, body | {"stream": True})
    assert streamed.status_code == 200
    assert [event["error"]["message"] for event in sse_events(streamed)] == [THINKING_BUDGET_UNCONFIGURED]
    assert workers["prefill-a"].prefills == []


async def test_the_fields_that_change_nothing_on_vllm_s_server_change_nothing(redis_server, tokenizer):
    inert = {"session_id": "s-1", "watermarking": True, "return_token_offsets": True, "thinking_token_budget": -1,
             "vllm_xargs": {"session_id": "s-2", "k": [1, "v", 0.5]}}
    plain, plain_workers = await _post(redis_server, tokenizer, "/v1/completions", _body())
    given, workers = await _post(redis_server, tokenizer, "/v1/completions", _body(**inert))
    assert given.json()["choices"] == plain.json()["choices"]
    assert [r.sampling for w in workers for r in workers[w].prefills + workers[w].decodes] == \
        [r.sampling for w in workers for r in plain_workers[w].prefills + plain_workers[w].decodes]
    chat = {"model": "tiny", "messages": CHAT, "max_tokens": 4, "temperature": 0}
    plain, _ = await _post(redis_server, tokenizer, "/v1/chat/completions", chat)
    given, _ = await _post(redis_server, tokenizer, "/v1/chat/completions", chat | inert | {"include_reasoning": False})
    assert given.json()["choices"] == plain.json()["choices"]


def test_per_request_multimodal_arguments_and_prompt_embeds_are_refused_as_vllm_s_server_refuses_them():
    from router.openai_vllm_extras import check_mm_kwargs, check_no_prompt_embeds

    for body, field in (({"mm_processor_kwargs": {"x": 1}}, "mm_processor_kwargs"),
                        ({"media_io_kwargs": {"image": {"x": 1}}}, "media_io_kwargs")):
        with pytest.raises(InvalidRequest) as refused:
            check_mm_kwargs(body)
        assert refused.value.field == field and "--trust-request-mm-kwargs" in refused.value.message
    with pytest.raises(InvalidRequest) as refused:
        check_no_prompt_embeds({"prompt_embeds": "AAAA"})
    assert refused.value.field == "prompt_embeds" and "--enable-prompt-embeds" in refused.value.message
    check_mm_kwargs({"mm_processor_kwargs": {}, "media_io_kwargs": None})   # empty: nothing asked, as vLLM reads it
    check_no_prompt_embeds({"prompt": "x"})
