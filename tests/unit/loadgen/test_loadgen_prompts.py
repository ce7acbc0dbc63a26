"""Prompt synthesis: exact lengths, determinism, shared prefixes."""

import pytest

from loadgen.prompts import PromptSynthesizer
from loadgen.workload import RequestSpec


def test_prompts_have_exact_lengths_in_range_and_are_deterministic():
    synth = PromptSynthesizer(seed=3, token_id_low=100, token_id_high=200)
    prompt = synth.prompt(RequestSpec(0.0, 37, 9), index=5)
    assert len(prompt.token_ids) == 37 and prompt.max_tokens == 9
    assert all(100 <= t < 200 for t in prompt.token_ids)
    assert synth.prompt(RequestSpec(1.0, 37, 9), index=5) == prompt
    assert synth.prompt(RequestSpec(0.0, 37, 9), index=6) != prompt
    assert synth.prompt(RequestSpec(0.0, 37, 9), index=5, warmup=True) != prompt


def test_requests_of_a_group_share_exactly_the_prefix():
    synth = PromptSynthesizer()
    a = synth.prompt(RequestSpec(0.0, 40, 1, prefix_group=1, prefix_tokens=32), index=0).token_ids
    b = synth.prompt(RequestSpec(0.0, 40, 1, prefix_group=1, prefix_tokens=32), index=1).token_ids
    other = synth.prompt(RequestSpec(0.0, 40, 1, prefix_group=2, prefix_tokens=32), index=0).token_ids
    assert a[:32] == b[:32] and a[32:] != b[32:]
    assert a[:32] != other[:32]
    warm = synth.prompt(RequestSpec(0.0, 40, 1, prefix_group=1, prefix_tokens=32), index=0, warmup=True).token_ids
    assert warm[:32] != a[:32]


def test_empty_token_range_is_rejected():
    with pytest.raises(ValueError, match="vocab_size"):
        PromptSynthesizer(token_id_low=5, token_id_high=5)


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from loadgen.text_prompts import load_tokenizer

    return load_tokenizer(str(tiny_model))


def test_text_prompts_encode_to_exactly_the_requested_length(tokenizer):
    synth = PromptSynthesizer(seed=4, token_id_low=0, token_id_high=tokenizer.vocab_size, tokenizer=tokenizer)
    for index, length in enumerate((1, 7, 64, 333, 1500)):
        prompt = synth.prompt(RequestSpec(0.0, length, 2), index)
        assert len(prompt.token_ids) == length
        assert tuple(tokenizer.encode(prompt.text, add_special_tokens=False)) == prompt.token_ids
    again = PromptSynthesizer(seed=4, token_id_low=0, token_id_high=tokenizer.vocab_size, tokenizer=tokenizer)
    assert again.prompt(RequestSpec(0.0, 64, 2), 2) == synth.prompt(RequestSpec(0.0, 64, 2), 2)


def test_text_prompts_of_a_group_start_with_the_same_prefix_text(tokenizer):
    synth = PromptSynthesizer(seed=0, token_id_low=0, token_id_high=tokenizer.vocab_size, tokenizer=tokenizer)
    spec = RequestSpec(0.0, 60, 1, prefix_group=1, prefix_tokens=40)
    a, b = synth.prompt(spec, 0).text, synth.prompt(spec, 1).text
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert len(tokenizer.encode(a[:common], add_special_tokens=False)) >= 38  # the prefix, give or take a merge


def test_text_safe_ids_leave_out_special_tokens_and_partial_characters(tokenizer):
    from loadgen.text_prompts import text_safe_ids

    safe = set(text_safe_ids(tokenizer).tolist())
    assert not safe & {0, 1, 2, 3, 4}  # <|begin_of_text|> ... <|eot_id|>
    assert tokenizer.convert_ids_to_tokens(5) == "!" and 5 in safe
    lone_byte = tokenizer.convert_tokens_to_ids("Ã")  # 0xC3 alone: the first half of a 2-byte character
    assert "\ufffd" in tokenizer.decode([lone_byte]) and lone_byte not in safe
    with pytest.raises(ValueError, match="widen --token-id-range"):
        text_safe_ids(tokenizer, 0, 5)
