"""A disaggregated cluster's HTTP answers carry vLLM's text (issue 16 item 1): the same request
sent to one colocated vLLM engine (reference_engine.py, the same engine settings) and to the
cluster's `/v1/completions` gives the same text, completion tokens, finish_reason and stop_reason,
streamed and not. Stop strings are taken from the reference's own greedy text, one of them across
the first token (which the prefill engine samples) and the second (the decode engine's first).
"""

from __future__ import annotations

import pytest

from openai_reference import served

pytestmark = pytest.mark.integration

GREEDY = {"temperature": 0.0, "ignore_eos": True, "max_tokens": 24}


def _without_tokens(answer: dict) -> dict:
    return {k: v for k, v in answer.items() if k != "token_ids"}


@pytest.fixture(scope="module")
def cases(prompts) -> list[list[int]]:
    """Prompts of 33 and 100 tokens no other test sends: the clusters are the session's, and a
    prompt cached here would change what a later test counts as transferred."""
    return [list(reversed(prompts[4]["token_ids"])), list(reversed(prompts[9]["token_ids"]))]


def test_greedy_text_is_vllm_s_streamed_and_not(tcp_cluster, reference, cases):
    for token_ids in cases:
        expected = _without_tokens(reference.ask(token_ids, **GREEDY))
        for stream in (False, True):
            assert served(tcp_cluster, token_ids, stream, **GREEDY) == expected, f"stream={stream}"


def test_stop_strings_cut_the_text_as_vllm_does_across_the_first_token_too(tcp_cluster, reference, cases):
    checked = 0
    for token_ids in cases:
        whole = reference.ask(token_ids, **GREEDY)["text"]
        first = reference.ask(token_ids, **GREEDY | {"max_tokens": 1})["text"]
        stops = {"across": whole[len(first) - 1:len(first) + 1] if first else "", "middle": whole[8:11]}
        for where, stop in stops.items():
            if len(stop.strip()) < 1:
                continue
            for include in (False, True):
                sampling = GREEDY | {"stop": [stop], "include_stop_str_in_output": include}
                expected = _without_tokens(reference.ask(token_ids, **sampling))
                assert expected["finish_reason"] == "stop"  # the case is what it claims
                for stream in (False, True):
                    assert served(tcp_cluster, token_ids, stream, **sampling) == expected, \
                        f"{where} stop {stop!r}, include={include}, stream={stream}"
                    checked += 1
    assert checked >= 8


def test_stop_token_ids_and_min_tokens_end_the_text_as_vllm_does(tcp_cluster, reference, cases):
    for token_ids in cases:
        whole = reference.ask(token_ids, **GREEDY)
        for sampling in (GREEDY | {"stop_token_ids": [whole["token_ids"][5]]},
                         GREEDY | {"stop": [whole["text"][:2]], "min_tokens": 3}):
            expected = _without_tokens(reference.ask(token_ids, **sampling))
            for stream in (False, True):
                assert served(tcp_cluster, token_ids, stream, **sampling) == expected, f"{sampling}, stream={stream}"


def test_repetition_penalty_gives_vllm_s_tokens(tcp_cluster, reference):
    """It weighs the prompt and the output alike, so it is exact though the decode engine sees the
    first token as part of its prompt."""
    token_ids = list(range(300, 340))  # the tiny model's greedy output comes back to a prompt token
    plain = reference.ask(token_ids, **GREEDY)
    penalized = reference.ask(token_ids, **GREEDY | {"repetition_penalty": 2.0})
    assert penalized["token_ids"] != plain["token_ids"]  # the penalty changes this output
    for stream in (False, True):
        assert served(tcp_cluster, token_ids, stream, **GREEDY | {"repetition_penalty": 2.0}) == \
            _without_tokens(penalized)


def test_presence_and_frequency_penalties_count_the_first_token_as_vllm_does(tcp_cluster, reference):
    """They weigh output tokens only; the decode engine sees the prefill's first token as prompt,
    so it is handed to its sampler as a prior output (pdserve.sampler_stream)."""
    greedy = GREEDY | {"max_tokens": 48}
    # a prompt whose greedy output repeats its first token early, so the penalties weigh the first
    # token: the case is what it claims. Which prompt does depends on the host's dtype (bf16 on
    # AMX and AVX512-BF16, float32 on AVX2), so the first of a few that does is taken.
    candidates = [list(range(start, start + 40)) for start in range(100, 2000, 200)]   # 2,048 ids
    candidates += [[token] * 40 for token in range(50, 2000, 150)] + [[7, 8, 9] * 13, [300, 301] * 20]
    for token_ids in candidates:
        plain = reference.ask(token_ids, **greedy)["token_ids"]
        if plain[0] in plain[1:40]:
            break
    else:
        pytest.fail(f"none of {len(candidates)} prompts' greedy output repeats its first token on this host")
    for penalties in ({"presence_penalty": 1.5}, {"frequency_penalty": 1.0, "presence_penalty": 0.5}):
        penalized = reference.ask(token_ids, **greedy | penalties)
        assert penalized["token_ids"] != plain, penalties
        for stream in (False, True):
            assert served(tcp_cluster, token_ids, stream, **greedy | penalties) == _without_tokens(penalized), \
                f"{penalties}, stream={stream}"


def test_a_seeded_sample_is_vllm_s_past_the_first_token(tcp_cluster, reference, cases):
    """The prefill engine samples token 0 with draw 0 of the seed's stream; the decode engine skips
    that draw (pdserve.sampler_stream), so every later token uses the draw one engine would."""
    for token_ids in cases:
        for seed in (7, 1234):
            sampling = {"temperature": 1.0, "top_p": 0.9, "seed": seed, "ignore_eos": True, "max_tokens": 24}
            expected = _without_tokens(reference.ask(token_ids, **sampling))
            other_seed = _without_tokens(reference.ask(token_ids, **sampling | {"seed": seed + 1}))
            assert other_seed["text"] != expected["text"]  # the seed decides this text
            for stream in (False, True):
                assert served(tcp_cluster, token_ids, stream, **sampling) == expected, f"seed={seed}, stream={stream}"
