"""pdserve answers as vLLM's own OpenAI server does (issue 16 item 2): every request of
openai_compat_cases.py is sent to `python -m vllm.entrypoints.openai.api_server` (one per module,
the clusters' engine settings, served as "tiny") and to the session's disaggregated cluster, streamed
and not, and the answers are compared field by field (tests/openai_compat.py: what is ignored, the
float tolerance, and INTENDED, the one list of differences pdserve means). Any other difference
fails, listed by case and JSON path.
"""

from __future__ import annotations

import json

import httpx
import pytest

from openai_compat import Answer, compare, unexplained
from openai_compat_cases import GREEDY, LONG_CHAT_TOKENS, MODEL, PROMPT, Case, Known, cases

pytestmark = pytest.mark.integration
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def vllm_server(vllm_openai_server):
    assert vllm_openai_server.served_model_name == MODEL, "the cases name the model the shared server serves"
    return vllm_openai_server


@pytest.fixture(scope="module")
def known(vllm_server) -> Known:
    """What the cases are built from, asked of vLLM's server."""
    url = vllm_server.url
    greedy = httpx.post(f"{url}/v1/completions", timeout=TIMEOUT_S, json=GREEDY | {
        "prompt": PROMPT, "logprobs": 0, "return_tokens_as_token_ids": True}).json()["choices"][0]
    prompt_ids = httpx.post(f"{url}/tokenize", json={"model": MODEL, "prompt": PROMPT}, timeout=TIMEOUT_S).json()

    def chat_tokens(words: int) -> int:
        body = {"model": MODEL, "messages": [{"role": "user", "content": " river" * words}]}
        return httpx.post(f"{url}/tokenize", json=body, timeout=TIMEOUT_S).json()["count"]

    per_100 = chat_tokens(200) - chat_tokens(100)
    words = 100 + (LONG_CHAT_TOKENS - chat_tokens(100)) * 100 // per_100
    assert chat_tokens(words) == LONG_CHAT_TOKENS, "the long chat's length is not what the case needs"
    return Known(text=greedy["text"], token_ids=[int(t.split(":")[1]) for t in greedy["logprobs"]["tokens"]],
                 prompt_ids=prompt_ids["tokens"], long_message=" river" * words)


def ask(base_url: str, case: Case, body: dict | None) -> Answer:
    reply = httpx.request(case.method, f"{base_url}{case.path}", json=body, timeout=TIMEOUT_S)
    if body and body.get("stream") and reply.status_code == 200:
        events = [json.loads(line[len("data: "):]) for line in reply.text.splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        assert reply.text.rstrip().endswith("data: [DONE]"), f"{case.name}: the stream did not end with [DONE]"
        return Answer(reply.status_code, events, streamed=True)
    return Answer(reply.status_code, reply.json())


@pytest.fixture(scope="module")
def answers(vllm_server, tcp_cluster, known) -> dict[str, tuple[Case, Answer, Answer]]:
    """variant name -> (its case, vLLM's answer, pdserve's answer). Every case goes to vLLM's server
    first, then every case to pdserve, each in the same order: after each message vLLM's processes
    poll for a second (vLLM's own spin, which its server keeps), on the cores the cluster shares, and
    a cluster request sent in that second took ~1 s instead of ~0.1 (228 of them, alternated: 106 s)."""
    variants = [(name, case, body) for case in cases(known) for name, body in case.variants()]
    expected = {name: ask(vllm_server.url, case, body) for name, case, body in variants}
    return {name: (case, expected[name], ask(tcp_cluster.http_url, case, body)) for name, case, body in variants}


def test_every_case_is_answered_as_vllm_s_server_answers_it(answers):
    report = [f"{name}: {difference}" for name, (case, expected, actual) in answers.items()
              for difference in unexplained(case.name, compare(expected, actual))]
    assert not report, "pdserve differs from vLLM's OpenAI server:\n" + "\n".join(report)


def test_the_cases_exercise_what_they_are_named_for(answers, known):
    """On vLLM's side: a comparison of two answers that skipped the behaviour would prove nothing."""
    def choices(name):
        return answers[name][1].body["choices"]

    assert choices("completion_stop_string")[0]["finish_reason"] == "stop"
    assert answers["completion_stop_string"][1].body["usage"]["completion_tokens"] > 2
    assert choices("completion_stop_token_ids")[0]["stop_reason"] == known.token_ids[4]
    assert answers["completion_min_tokens"][1].body["usage"]["completion_tokens"] > 3   # not stopped at token 3
    assert choices("completion_seeded")[0]["text"] != known.text
    assert len({c["text"] for c in choices("completion_n2_seeded")}) == 2
    assert choices("completion_penalties")[0]["text"] != choices("completion_repeating")[0]["text"]
    assert len(choices("completion_prompt_list")) == 2
    assert answers["completion_max_tokens_past_context"][1].body["usage"]["completion_tokens"] == 5
    assert answers["chat_default_max_tokens"][1].body["usage"]["completion_tokens"] == 6
    assert answers["completion_usage_in_stream[stream]"][1].body[-1]["usage"]["completion_tokens"] == 12
    assert answers["unknown_field"][1].status == 200
    assert answers["completion_truncate_prompt_tokens"][1].body["usage"]["prompt_tokens"] == 4
    assert answers["completion_truncate_to_context"][1].body["usage"]["completion_tokens"] == 1   # 2047 kept
    assert choices("completion_bad_words")[0]["text"] != known.text
    assert answers["completion_no_special_tokens"][1].body["usage"]["prompt_tokens"] == len(known.prompt_ids) - 1
    assert all(c["token_ids"] and c["prompt_token_ids"] for c in choices("completion_return_token_ids"))
    assert answers["chat_return_token_ids"][1].body["prompt_token_ids"]
    assert choices("chat_no_generation_prompt")[0]["message"]["role"] == "user"
    assert choices("chat_continue_final_message")[0]["message"]["content"].startswith("Rivers are")
    assert (answers["chat_template_kwargs"][1].body["usage"]["prompt_tokens"]
            != answers["chat_greedy"][1].body["usage"]["prompt_tokens"])
    assert [answers[name][1].status for name in ("truncate_past_context", "truncate_below_minus_one",
                                                 "continue_with_generation_prompt", "continue_final_message_alone",
                                                 "chat_template_untrusted", "bad_words_empty_word")] == [400] * 6
    beams = choices("completion_beam_search")
    assert len(beams) == 2 and beams[0]["text"] != beams[1]["text"]
    assert len(choices("completion_beam_search_logprobs")) == 3
    assert len(choices("completion_beam_search_prompts_echo")) == 4
    assert len(choices("chat_beam_search")) == 2
    assert len(choices("completion_beam_search_widest")) == 10
    assert len(choices("completion_beam_search_max_tokens_zero")) == 1
    assert [answers[name][1].status for name in ("completion_beam_search[stream]", "beam_search_logprob_token_ids",
                                                 "beam_search_echo_logprobs", "beam_search_too_wide")] == [400] * 4
    assert choices("chat_tools_required")[0]["message"]["tool_calls"]   # vLLM's hermes parser found the forced call
    assert [c["function"]["name"] for c in choices("chat_tools_named")[0]["message"]["tool_calls"]] == ["get_time"]
    assert len(choices("chat_tools_one_call")[0]["message"]["tool_calls"]) == 1
    assert choices("chat_tools_one_call")[0]["finish_reason"] == "tool_calls"
    assert any(e["choices"] and e["choices"][0]["delta"].get("tool_calls")
               for e in answers["chat_tools_required[stream]"][1].body)
    assert [answers[name][1].status for name in ("tools_empty", "tool_choice_without_tools",
                                                 "tool_choice_unknown_function", "tool_choice_unknown_word")] == [400] * 4

    def choice_events(name, index=0):
        return [event for event in answers[name][1].body if event["choices"]
                and event["choices"][0]["index"] == index]

    assert len(choice_events("completion_stream_interval[stream]")) == 4   # 12 tokens: 1, 4, 4, 3
    sizes = [len(event["choices"][0]["logprobs"]["content"])
             for event in choice_events("chat_stream_interval_n2[stream]") if event["choices"][0].get("logprobs")]
    assert sizes[0] == 1 and set(sizes[1:-1]) == {3} and sizes[-1] <= 3   # the first token, then 3 at a time
    for name in ("completion_repetition_detection", "chat_repetition_detection"):
        assert (choices(name)[0]["finish_reason"], choices(name)[0]["stop_reason"]) == ("repetition",
                                                                                        "repetition_detected")
    assert answers["completion_repetition_detection"][1].body["usage"]["completion_tokens"] == 3
    assert answers["chat_repetition_detection"][1].body["usage"]["completion_tokens"] >= 6   # min_tokens
    assert choices("completion_repetition_not_met")[0]["finish_reason"] == "length"
    assert answers["chat_return_prompt_text"][1].body["prompt_text"].endswith("assistant<|end_header_id|>\n\n")
    assert [answers[name][1].status for name in ("thinking_token_budget", "thinking_token_budget[stream]",
                                                 "completion_inert_fields", "chat_inert_fields")] == [400, 200, 200,
                                                                                                      200]
    tops = choices("completion_logprob_token_ids")[0]["logprobs"]["top_logprobs"]
    assert len(tops[0]) == 3 and len(tops[1]) == 4   # the sampled token and every listed id (300 once)
    assert len(answers["chat_prompt_logprobs"][1].body["prompt_logprobs"]) == \
        answers["chat_prompt_logprobs"][1].body["usage"]["prompt_tokens"]
    assert [answers[name][1].status for name in (
        "logprob_token_ids_without_logprobs", "chat_logprob_token_ids_without_logprobs",
        "logprob_token_ids_echo_without_tokens", "logprob_token_ids_with_beam_search", "logprob_token_ids_out_of_vocab",
        "logprob_token_ids_too_many", "chat_prompt_logprobs_streamed", "chat_prompt_logprobs_negative",
        "chat_prompt_logprobs_too_many")] == [400] * 9
    assert [answers[name][1].status for name in ("unknown_model", "temperature_negative", "n_zero",
                                                   "prompt_too_long", "wrong_type")] == [404, 400, 400, 400, 400]
