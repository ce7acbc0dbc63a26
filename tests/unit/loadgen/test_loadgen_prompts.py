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
