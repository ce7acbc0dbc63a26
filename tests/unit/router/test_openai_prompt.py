"""A request's prompt as vLLM's OpenAI server makes it (issue 16 item 1, `router.openai_prompt`):
truncation and special tokens with vLLM's rules and refusals, the chat template's arguments, the
answer's role; plain values and the tiny model's tokenizer as the router loads it; the answer's
fields through the app over scripted workers (test_openai_choices' harness)."""

from __future__ import annotations

import grpc
import pytest

from pdserve.client import AsyncClient
from pdserve.errors import InvalidRequest
from pdserve.sampling import Sampling
from pdserve.worker_api import PrefillResult
from router.grpc_api import GenerationService, add_generation_service
from router.openai_chat import ChatCompletionRequest
from router.openai_prompt import (
    UNTRUSTED_TEMPLATE, PromptRules, answer_role, check_no_request_template, template_kwargs, text_prompt_ids,
    token_prompt_ids,
)
from router.openai_schema import CompletionRequest
from scripted_workers import ScriptedWorker, scripted_cluster
from scripted_workers import sse_events
from test_openai_choices import PROMPT, _body, _post

BOS = 0
TEXT = "Once upon a time"
TEXT_IDS = [BOS, 1609, 375, 565, 282, 262, 480]   # with the BOS the tokenizer adds
CONTEXT = 64


def test_a_text_prompt_gets_its_bos_unless_special_tokens_are_off(tokenizer):
    assert text_prompt_ids(tokenizer.hf, TEXT, PromptRules(CONTEXT)) == TEXT_IDS
    assert text_prompt_ids(tokenizer.hf, TEXT, PromptRules(CONTEXT, add_special_tokens=False)) == TEXT_IDS[1:]


def test_truncation_keeps_the_last_tokens_by_default_and_the_first_from_the_right(tokenizer):
    # a text is truncated by the tokenizer (vLLM's call), which keeps the BOS it adds
    assert text_prompt_ids(tokenizer.hf, TEXT, PromptRules(CONTEXT, truncate_prompt_tokens=3)) == [BOS, 262, 480]
    right = PromptRules(CONTEXT, truncate_prompt_tokens=3, truncation_side="right")
    assert text_prompt_ids(tokenizer.hf, TEXT, right) == TEXT_IDS[:3]
    assert token_prompt_ids(tokenizer.hf, [5, 6, 7, 8], PromptRules(CONTEXT, truncate_prompt_tokens=2)) == [7, 8]
    assert token_prompt_ids(tokenizer.hf, [5, 6], PromptRules(CONTEXT, truncate_prompt_tokens=4)) == [5, 6]


def test_minus_one_keeps_the_context_less_one_when_output_is_asked(tokenizer):
    ids = list(range(10, 10 + CONTEXT + 5))
    asking = PromptRules(CONTEXT, 16, truncate_prompt_tokens=-1)
    assert token_prompt_ids(tokenizer.hf, ids, asking) == ids[-(CONTEXT - 1):]
    assert token_prompt_ids(tokenizer.hf, ids, PromptRules(CONTEXT, 0, truncate_prompt_tokens=-1)) == ids[-CONTEXT:]


@pytest.mark.parametrize("rules, field", [
    (PromptRules(CONTEXT, truncate_prompt_tokens=CONTEXT + 1), "truncate_prompt_tokens"),
    (PromptRules(CONTEXT, CONTEXT + 1), "max_tokens"),
    (PromptRules(CONTEXT, CONTEXT + 1, "max_completion_tokens"), "max_completion_tokens"),
    (PromptRules(CONTEXT, truncate_prompt_tokens=2, truncation_side="middle"), "truncation_side"),
])
def test_vllm_s_refusals_of_the_lengths_name_the_field(rules, field):
    with pytest.raises(InvalidRequest) as refused:
        rules.vllm()
    assert refused.value.field == field


def test_a_prompt_longer_than_the_context_is_refused_after_truncation():
    with pytest.raises(InvalidRequest) as refused:
        token_prompt_ids(None, [5] * (CONTEXT + 1), PromptRules(CONTEXT))
    assert refused.value.field == "input_tokens"
    assert token_prompt_ids(None, [5] * (CONTEXT + 1), PromptRules(CONTEXT, truncate_prompt_tokens=8)) == [5] * 8


def test_the_request_s_fields_override_its_template_kwargs_over_vllm_s_defaults():
    assert template_kwargs({"add_generation_prompt": False, "bos_token": "x", "skip": None}, True, False) == {
        "tools": None, "tokenize": False, "add_generation_prompt": True, "continue_final_message": False,
        "bos_token": "x", "return_dict": False}
    documents = [{"title": "t", "text": "x"}]
    assert template_kwargs(None, False, True, documents)["documents"] == documents


def test_the_request_s_tools_reach_the_template_unless_its_kwargs_name_their_own():
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert template_kwargs(None, True, False, tools=tools)["tools"] == tools
    assert template_kwargs({"tools": ["mine"]}, True, False, tools=tools)["tools"] == ["mine"]


def test_a_template_sent_with_the_request_is_refused_as_vllm_refuses_it_untrusted():
    check_no_request_template(None, {"bos_token": "x"})
    for template, kwargs in (("{{ messages }}", None), (None, {"chat_template": "{{ messages }}"})):
        with pytest.raises(InvalidRequest) as refused:
            check_no_request_template(template, kwargs)
        assert refused.value.message == UNTRUSTED_TEMPLATE and refused.value.field is None


def test_the_answer_s_role_is_the_continued_message_s_without_a_generation_prompt():
    assert answer_role(True, "user") == "assistant"
    assert answer_role(False, "user") == "user"
    chat = ChatCompletionRequest(messages=[{"role": "user", "content": "Hi"}], add_generation_prompt=False, echo=True)
    assert chat.role == "user" and chat.echo_text() == "Hi"


def test_continue_final_message_with_a_generation_prompt_is_refused_only_when_both_are_sent():
    with pytest.raises(InvalidRequest):
        ChatCompletionRequest(messages=[{"role": "user", "content": "Hi"}], continue_final_message=True,
                              add_generation_prompt=True)
    assert ChatCompletionRequest(messages=[{"role": "user", "content": "Hi"}], continue_final_message=True)


def test_the_template_renders_with_the_request_s_kwargs_and_continues_the_final_message(tokenizer):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Rivers are"}]
    continued = tokenizer.apply_template(messages, template_kwargs(None, False, True))
    assert continued.endswith("<|start_header_id|>assistant<|end_header_id|>\n\nRivers are")
    assert tokenizer.apply_template(messages[:1], template_kwargs({"bos_token": "B:"}, True, False)).startswith("B:")
    with pytest.raises(InvalidRequest) as refused:   # Hugging Face's refusal, vLLM's 400 without a param
        tokenizer.apply_template(messages, template_kwargs(None, True, True))
    assert "continue_final_message" in refused.value.message and refused.value.field is None


def test_each_body_s_rules_are_vllm_s():
    completion = CompletionRequest(prompt="x", truncate_prompt_tokens=3)
    assert completion.prompt_rules(CONTEXT) == PromptRules(CONTEXT, 16, "max_tokens", 3, None, True)
    chat = ChatCompletionRequest(messages=[{"role": "user", "content": "Hi"}], max_completion_tokens=5)
    assert chat.prompt_rules(CONTEXT) == PromptRules(CONTEXT, 5, "max_completion_tokens", None, None, False)


def test_bad_words_reach_both_engines_and_are_checked_against_the_tokenizer(tokenizer):
    sampling = Sampling.validated(bad_words=("river", "the city"), spaces_between_special_tokens=False)
    assert Sampling.from_proto(sampling.to_proto()) == sampling
    params = sampling.to_vllm()
    assert params.bad_words == ["river", "the city"] and params.spaces_between_special_tokens is False
    tokenizer.check_bad_words(sampling)
    with pytest.raises(InvalidRequest) as refused:
        Sampling.validated(bad_words=("",))
    assert refused.value.field == "bad_words"


@pytest.mark.parametrize("stream", [False, True])
async def test_return_token_ids_gives_the_truncated_prompt_s_ids_once_and_each_chunk_s_own(redis_server, tokenizer,
                                                                                          stream):
    body = _body(return_token_ids=True, truncate_prompt_tokens=4, stream=stream)
    reply, workers = await _post(redis_server, tokenizer, "/v1/completions", body)
    assert list(workers["prefill-a"].prefills[0].prompt_token_ids) == PROMPT[-4:]
    if not stream:
        choice = reply.json()["choices"][0]
        assert (choice["prompt_token_ids"], choice["token_ids"]) == (PROMPT[-4:], [730, 465, 262, 1570])
        return
    choices = [event["choices"][0] for event in sse_events(reply)]
    assert [choice.get("prompt_token_ids") for choice in choices] == [PROMPT[-4:]] + [None] * (len(choices) - 1)
    assert [t for choice in choices for t in choice["token_ids"]] == [730, 465, 262, 1570]


async def test_a_chat_without_generation_prompt_answers_in_the_last_message_s_role(redis_server, tokenizer):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0,
            "add_generation_prompt": False, "return_token_ids": True}
    reply, workers = await _post(redis_server, tokenizer, "/v1/chat/completions", body)
    answer = reply.json()
    assert answer["choices"][0]["message"]["role"] == "user"
    assert answer["prompt_token_ids"] == list(workers["prefill-a"].prefills[0].prompt_token_ids)
    assert answer["prompt_token_ids"] == tokenizer.tokenize_chat([{"role": "user", "content": "hi"}], False)


async def test_the_sdk_s_bad_words_and_truncation_reach_the_prefill_worker(redis_server, tokenizer):
    prefill = ScriptedWorker(prefill=PrefillResult(first_token_id=730, finished=True, finish_reason="length"))
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": ScriptedWorker()})
    server = grpc.aio.server()
    add_generation_service(GenerationService(lifecycle, "tiny"), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with AsyncClient(f"127.0.0.1:{port}") as client:
            async for _ in client.generate(token_ids=PROMPT, max_tokens=1, bad_words=["river"],
                                           truncate_prompt_tokens=3):
                pass
    finally:
        await server.stop(grace=None)
        await lifecycle.wait_for_releases()
        await pool.close()
        await registry.close()
    sent = prefill.prefills[0]
    assert (list(sent.prompt_token_ids), sent.sampling.bad_words) == (PROMPT[-3:], ("river",))
