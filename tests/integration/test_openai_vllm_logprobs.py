"""A disaggregated cluster's HTTP answers carry vLLM's logprobs, samples and echo (issue 16 item 1):
the same request sent to one colocated vLLM engine (the session's `reference`) and to the cluster
gives the same tokens, each with the same logprobs (within 1e-3: bf16 engines) and the same top
tokens in the same order, though the first token's come from the prefill engine and the rest from
the decode engine. A batch of prompts with `n` samples each, `echo` with the prompt's logprobs, and
`logit_bias` (which must reach both engines) are compared the same way.

Prompts here are sent by no other test (the clusters are the session's, and a prompt cached here
would change what a later test counts as transferred).
"""

from __future__ import annotations

import pytest

from openai_reference import events, post
from router.tokenizer import RouterTokenizer

pytestmark = pytest.mark.integration

TOLERANCE = 1e-3
GREEDY = {"temperature": 0.0, "ignore_eos": True, "max_tokens": 10}
SEEDED = {"temperature": 1.0, "top_p": 0.9, "seed": 77, "ignore_eos": True, "max_tokens": 10}
PROMPTS = [[(i * 53) % 1900 + 60 for i in range(37)], [(i * 71) % 1800 + 90 for i in range(70)]]


def _completion_logprobs(positions: list, num_top: int) -> dict:
    """vLLM's completion logprobs object made from the reference's positions."""
    tokens = [position[0][3] for position in positions]
    offsets = [sum(len(token) for token in tokens[:i]) for i in range(len(tokens))]
    return {"tokens": tokens, "token_logprobs": [position[0][1] for position in positions],
            "top_logprobs": [{entry[3]: entry[1] for entry in position[:num_top + 1]} for position in positions],
            "text_offset": offsets}


def _joined(parts: list[dict]) -> dict:
    return {key: [value for part in parts for value in part[key]] for key in parts[0]}


def _assert_close_completion(served: dict, expected: dict) -> None:
    assert served["tokens"] == expected["tokens"]
    assert served["text_offset"] == expected["text_offset"]
    assert served["token_logprobs"] == pytest.approx(expected["token_logprobs"], abs=TOLERANCE)
    for got, want in zip(served["top_logprobs"], expected["top_logprobs"], strict=True):
        assert list(got) == list(want)  # the same tokens, in vLLM's order
        assert list(got.values()) == pytest.approx(list(want.values()), abs=TOLERANCE)


def _served_completion(cluster, body: dict, stream: bool) -> tuple[str, dict]:
    reply = post(cluster, "/v1/completions", body | {"stream": stream})
    if not stream:
        assert reply.json()["pdserve_timings"]["disaggregated"]  # the first token was the prefill engine's
        choice = reply.json()["choices"][0]
        return choice["text"], choice["logprobs"]
    choices = [event["choices"][0] for event in events(reply)]
    return "".join(c["text"] for c in choices), _joined([c["logprobs"] for c in choices])


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_completion_logprobs_are_vllm_s_across_the_handoff(tcp_cluster, reference, sampling):
    for prompt in PROMPTS:
        expected = reference.answer(prompt, **sampling, logprobs=3)
        for stream in (False, True):
            text, logprobs = _served_completion(tcp_cluster, {"prompt": prompt, **sampling, "logprobs": 3}, stream)
            assert text == expected["text"]
            _assert_close_completion(logprobs, _completion_logprobs(expected["logprobs"], 3))


def test_chat_logprobs_are_vllm_s_streamed_and_not(tcp_cluster, reference, tiny_model):
    messages = [{"role": "user", "content": "Tell me about logprobs across two engines, briefly."}]
    prompt = RouterTokenizer(str(tiny_model)).render_chat(messages)
    expected = reference.answer(prompt, **GREEDY, logprobs=2)["logprobs"]
    body = {"messages": messages, **GREEDY, "logprobs": True, "top_logprobs": 2}
    for stream in (False, True):
        reply = post(tcp_cluster, "/v1/chat/completions", body | {"stream": stream})
        if stream:
            content = [entry for event in events(reply) for choice in event["choices"] if choice["logprobs"]
                       for entry in choice["logprobs"]["content"]]
        else:
            content = reply.json()["choices"][0]["logprobs"]["content"]
        assert [entry["token"] for entry in content] == [position[0][3] for position in expected]
        assert [entry["bytes"] for entry in content] == [list(p[0][3].encode()) for p in expected]
        assert [entry["logprob"] for entry in content] == pytest.approx([p[0][1] for p in expected], abs=TOLERANCE)
        for entry, position in zip(content, expected, strict=True):
            assert [top["token"] for top in entry["top_logprobs"]] == [e[3] for e in position[:2]]
            assert [top["logprob"] for top in entry["top_logprobs"]] == \
                pytest.approx([e[1] for e in position[:2]], abs=TOLERANCE)


def test_a_batch_of_prompts_with_n_seeded_samples_is_vllm_s_choice_by_choice(tcp_cluster, reference):
    """Choice i is prompt i // n's sample i % n, which vLLM seeds with seed + i % n."""
    sampling = SEEDED | {"max_tokens": 6}
    expected = [reference.ask(prompt, **sampling | {"seed": sampling["seed"] + sample})["text"]
                for prompt in PROMPTS for sample in range(2)]
    assert expected[0] != expected[1]  # the samples differ: the case tests the seeds
    body = {"prompt": PROMPTS, "n": 2, **sampling}
    whole = post(tcp_cluster, "/v1/completions", body).json()
    assert [(c["index"], c["text"]) for c in whole["choices"]] == list(enumerate(expected))
    assert whole["usage"] == {"prompt_tokens": sum(map(len, PROMPTS)), "completion_tokens": 24, "total_tokens":
                              sum(map(len, PROMPTS)) + 24}
    streamed = events(post(tcp_cluster, "/v1/completions", body | {"stream": True}))
    texts = {}
    for event in streamed:
        for choice in event["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert [texts[index] for index in range(4)] == expected


def test_echo_with_logprobs_gives_the_prompt_s_text_and_logprobs_as_vllm(tcp_cluster, reference, tiny_model):
    prompt = PROMPTS[0][:20]
    expected = reference.answer(prompt, **GREEDY, logprobs=1, prompt_logprobs=1)
    prompt_text = RouterTokenizer(str(tiny_model)).decode(prompt)
    choice = post(tcp_cluster, "/v1/completions", {"prompt": prompt, **GREEDY, "logprobs": 1, "echo": True}
                  ).json()["choices"][0]
    assert choice["text"] == prompt_text + expected["text"]
    logprobs = choice["logprobs"]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None  # nothing predicts it
    rest = {key: values[1:] for key, values in logprobs.items()}
    want = _completion_logprobs(expected["prompt_logprobs"][1:] + expected["logprobs"], 1)
    want["text_offset"] = [offset + len(logprobs["tokens"][0]) for offset in want["text_offset"]]
    _assert_close_completion(rest, want)


def test_logit_bias_reaches_both_engines_as_vllm_applies_it(tcp_cluster, reference):
    prompt = PROMPTS[1][:30]
    plain = reference.ask(prompt, **GREEDY)["token_ids"]
    bias = {str(plain[0]): -100.0, str(plain[3]): 8.0}   # the first token is the prefill engine's
    biased = reference.ask(prompt, **GREEDY, logit_bias={plain[0]: -100.0, plain[3]: 8.0})
    assert biased["token_ids"][0] != plain[0]
    for stream in (False, True):
        text, _ = _served_completion(tcp_cluster, {"prompt": prompt, **GREEDY, "logit_bias": bias, "logprobs": 0},
                                     stream)
        assert text == biased["text"]


def test_min_p_and_allowed_token_ids_are_vllm_s_across_the_handoff(tcp_cluster, reference):
    prompt = PROMPTS[0][5:33]
    allowed = sorted(set(reference.ask(prompt, **GREEDY | {"max_tokens": 24})["token_ids"]))[:6] + [300, 301, 302]
    for fields in ({"min_p": 0.2}, {"allowed_token_ids": allowed}):
        expected = reference.ask(prompt, **SEEDED, **fields)
        if "allowed_token_ids" in fields:
            assert set(expected["token_ids"]) <= set(allowed)
        for stream in (False, True):
            text, _ = _served_completion(tcp_cluster, {"prompt": prompt, **SEEDED, **fields, "logprobs": 0}, stream)
            assert text == expected["text"], f"{fields}, stream={stream}"


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_logprob_token_ids_are_vllm_s_from_both_engines(tcp_cluster, reference, sampling):
    """The listed ids reach the prefill engine (the first token's position) and the decode engine (the
    rest); each position lists the output token and every listed id, once, in vLLM's order."""
    prompt = PROMPTS[1][36:64]
    output = reference.ask(prompt, **sampling)["token_ids"]
    listed = [301, output[0], output[4], 301]   # the first output token among them; an id listed twice
    expected = reference.answer(prompt, **sampling, logprob_token_ids=listed)
    assert expected["token_ids"] == output
    for stream in (False, True):
        body = {"prompt": prompt, **sampling, "logprobs": 0, "logprob_token_ids": listed}
        text, logprobs = _served_completion(tcp_cluster, body, stream)
        assert text == expected["text"]
        _assert_close_completion(logprobs, _completion_logprobs(expected["logprobs"], len(listed)))
