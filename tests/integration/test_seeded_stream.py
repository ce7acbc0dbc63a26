"""One vLLM engine with pdserve's plugin (reference_engine.py), a step budget of 64 tokens:
- a seeded request whose prompt spans several chunks is served (vLLM 0.32 on CPU killed the engine
  core rewinding the request's generator by offset) and samples what an unchunked one does;
- a continuation that is told how many tokens were already sampled (pdserve.sampler_stream's
  skip) gives exactly the rest of the one-engine stream, across a different number of chunks.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from cluster_helpers import engine_settings
from openai_reference import reference_engine
from pdserve.sampler_stream import SKIP_DRAWS_ARG

pytestmark = pytest.mark.integration

SEEDED = {"temperature": 1.0, "top_k": 50, "seed": 4321, "ignore_eos": True}


class Engine:
    """The reference engine, asked for token ids only."""

    def __init__(self, reference):
        self.reference = reference

    def tokens(self, token_ids: list[int], **sampling) -> list[int]:
        return self.reference.answer(token_ids, **sampling)["token_ids"]


@pytest.fixture(scope="module")
def engine(tiny_model, tmp_path_factory):
    settings = replace(engine_settings(tiny_model), max_num_batched_tokens=64, max_num_seqs=4)
    with reference_engine(settings, tmp_path_factory.mktemp("chunked-engine")) as reference:
        yield Engine(reference)


def test_a_seeded_prompt_in_chunks_is_served_and_continues_exactly(engine):
    prompt = [100 + (i * 37) % 900 for i in range(190)]            # 64 + 64 + 62: two discarded samples
    whole = engine.tokens(prompt, **SEEDED, max_tokens=12)
    assert len(whole) == 12
    assert engine.tokens(prompt, **SEEDED, max_tokens=12) == whole  # the stream is the seed's, every time
    for sent in (1, 3):   # 191 and 193 tokens: a different number of discarded samples than 190
        rest = engine.tokens(prompt + whole[:sent], **SEEDED, max_tokens=12 - sent,
                             extra_args={SKIP_DRAWS_ARG: sent})
        assert rest == whole[sent:], f"continued after {sent}"
    unskipped = engine.tokens(prompt + whole[:3], **SEEDED, max_tokens=9)
    assert unskipped != whole[3:]   # without the skip the stream restarts: the case tests something


def test_a_short_seeded_prompt_continues_exactly_after_its_first_token(engine):
    prompt = [500 + i for i in range(40)]                           # one chunk: the prefill worker's case
    whole = engine.tokens(prompt, **SEEDED, max_tokens=10)
    assert engine.tokens(prompt + whole[:1], **SEEDED, max_tokens=9, extra_args={SKIP_DRAWS_ARG: 1}) == whole[1:]
