"""A continuation samples as one engine would: the generator's skip and rewind, the prior outputs,
and what the decode worker asks for; plain values and real torch generators, no engine."""

from types import SimpleNamespace

import pytest
import torch

from decode_worker.handler import continuation_args
from kv_transfer.handle import KVHandle
from pdserve.sampler_stream import (PRIOR_OUTPUTS_ARG, SKIP_DRAWS_ARG, OutputsAfterPrior, RewindableCPUGenerator,
                                    advance, mark_generators, prepare_generator, prepare_outputs, skip_draws_needed,
                                    with_prior_outputs)
from pdserve.sampling import Sampling
from pdserve.worker_api import DecodeRequest


def _draw(generator) -> int:
    """One draw as vLLM 0.32's CPU sampler takes it per sampled token."""
    return int(torch.randint(0, 2**31, (1,), generator=generator, dtype=torch.long))


def _stream(seed: int, n: int) -> list[int]:
    generator = torch.Generator()
    generator.manual_seed(seed)
    return [_draw(generator) for _ in range(n)]


def _seeded(seed: int) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


def _request_state(seed: int | None, extra_args: dict | None):
    return SimpleNamespace(generator=_seeded(seed) if seed is not None else None,
                           sampling_params=SimpleNamespace(extra_args=extra_args), output_token_ids=[])


def test_vllms_rewind_after_a_discarded_draw_gives_the_same_draw_again():
    state = _request_state(7, None)
    prepare_generator(state)
    generator = state.generator
    assert isinstance(generator, RewindableCPUGenerator)
    expected = _stream(7, 3)
    draws = []
    for discard in (True, False, True, True, False, False):   # a chunked prefill's discarded samples
        mark_generators({0: generator}, fp64_gumbel=False, vocab_size=0)
        draw = _draw(generator)
        if discard:
            generator.set_offset(generator.get_offset() - 4)   # exactly vLLM's call
        else:
            draws.append(draw)
    assert draws == expected


def test_a_cpu_generator_refuses_any_other_offset_as_torchs_does():
    generator = RewindableCPUGenerator()
    with pytest.raises(RuntimeError):
        generator.set_offset(0)          # nothing marked yet
    generator.mark(fp64_gumbel=False, vocab_size=0)
    with pytest.raises(RuntimeError):
        generator.set_offset(generator.get_offset() - 8)   # two steps back


def test_a_continuation_after_g_tokens_draws_what_draw_g_of_one_engine_is():
    state = _request_state(11, {SKIP_DRAWS_ARG: 5})
    prepare_generator(state)
    mark_generators({3: state.generator}, fp64_gumbel=False, vocab_size=0)   # the skip is taken here
    assert [_draw(state.generator) for _ in range(3)] == _stream(11, 8)[5:]


def test_the_skip_is_taken_once_even_when_vllm_adds_the_request_again():
    state = _request_state(11, {SKIP_DRAWS_ARG: 2})
    prepare_generator(state)
    mark_generators({0: state.generator}, fp64_gumbel=False, vocab_size=0)
    first = _draw(state.generator)
    prepare_generator(state)            # a preempted request resumed: added to the batch again
    mark_generators({0: state.generator}, fp64_gumbel=False, vocab_size=0)
    assert [first, _draw(state.generator)] == _stream(11, 4)[2:]


def test_advancing_an_fp64_gumbel_sampler_takes_vocab_sized_exponential_draws():
    generator = _seeded(3)
    advance(generator, 2, fp64_gumbel=True, vocab_size=16)
    reference = _seeded(3)
    for _ in range(2):
        torch.empty(16, dtype=torch.float64).exponential_(generator=reference)
    assert _draw(generator) == _draw(reference)


def test_only_a_seeded_random_continuation_skips():
    assert skip_draws_needed(seed=5, temperature=0.8, num_generated=3) == 3
    assert skip_draws_needed(seed=None, temperature=0.8, num_generated=3) == 0   # unseeded: no order to keep
    assert skip_draws_needed(seed=5, temperature=0.0, num_generated=3) == 0      # greedy: no generator
    assert skip_draws_needed(seed=5, temperature=0.8, num_generated=0) == 0


def test_prior_outputs_go_in_front_of_the_live_outputs_for_the_penalties_only():
    state = _request_state(None, {PRIOR_OUTPUTS_ARG: [7, 8]})
    live = state.output_token_ids
    prepare_outputs(state)
    assert isinstance(state.output_token_ids, OutputsAfterPrior) and state.output_token_ids == []
    state.output_token_ids.append(9)                 # the model runner appends its own sample
    assert len(state.output_token_ids) == 1          # vLLM's token count is untouched
    assert with_prior_outputs([state.output_token_ids, [4]]) == [[7, 8, 9], [4]]
    assert with_prior_outputs([live, [4]]) is None   # nobody has prior outputs: nothing is copied


def test_the_decode_worker_asks_for_a_skip_and_prior_outputs_only_where_they_apply():
    handle = KVHandle("x1", "10.0.0.5:7000", "prefill-0", (4, 5), 4)
    seeded = Sampling(max_tokens=4, temperature=1.0, seed=9, presence_penalty=0.5)
    args = continuation_args(DecodeRequest("r", (1, 2, 3, 7, 8), seeded, handle, num_generated=2))
    assert args == {"kv_transfer_params": handle.to_params(), SKIP_DRAWS_ARG: 2, PRIOR_OUTPUTS_ARG: [7, 8]}
    assert continuation_args(DecodeRequest("r", (1, 2, 3), seeded)) == {}    # nothing was output yet
    greedy = Sampling(max_tokens=4, temperature=0.0)
    assert continuation_args(DecodeRequest("r", (1, 2, 3, 7), greedy, num_generated=1)) == {}
    # bad words look back over the output: a word whose first token the prefill sampled is blocked here
    banned = Sampling(max_tokens=4, temperature=0.0, bad_words=("the city",))
    assert continuation_args(DecodeRequest("r", (1, 2, 3, 7), banned, num_generated=1)) == {PRIOR_OUTPUTS_ARG: [7]}
