"""A continuation's grammar is advanced over the tokens already sent (pdserve.grammar_stream): a
real xgrammar grammar over the tiny model's vocabulary, as vLLM's xgrammar backend wraps it, so
after the prefix its next-token mask is the one one engine would use; a prefix the grammar
rejects fails the request; the decode worker asks for the advance only where it applies."""

from __future__ import annotations

import pytest

from decode_worker.handler import continuation_args
from pdserve.grammar_stream import GRAMMAR_PREFIX_ARG, GrammarRejected, advance, install
from pdserve.sampling import Sampling
from pdserve.worker_api import DecodeRequest

THERE, WAS, A = 730, 465, 262   # " there", " was", " a" in the tiny model's vocabulary


@pytest.fixture(scope="module")
def compile_regex(tiny_model):
    import xgrammar as xgr
    from transformers import AutoTokenizer
    from vllm.v1.structured_output.backend_xgrammar import XgrammarGrammar

    info = xgr.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(str(tiny_model)), vocab_size=2048)
    compiler = xgr.GrammarCompiler(info)

    def compile_(regex: str) -> XgrammarGrammar:
        ctx = compiler.compile_regex(regex)
        return XgrammarGrammar(matcher=xgr.GrammarMatcher(ctx), vocab_size=2048, ctx=ctx)
    return compile_


def _allows(grammar, token_id: int) -> bool:
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(1, grammar.vocab_size)
    grammar.matcher.fill_next_token_bitmask(bitmask)
    return bool((int(bitmask[0, token_id // 32]) >> (token_id % 32)) & 1)


def test_an_advanced_grammar_masks_as_after_those_tokens(compile_regex):
    fresh, advanced = compile_regex(" there was a"), compile_regex(" there was a")
    advance(advanced, "r", [THERE])
    assert _allows(fresh, THERE) and not _allows(fresh, WAS)      # a fresh grammar starts the structure again
    assert _allows(advanced, WAS) and not _allows(advanced, THERE)
    advance(advanced, "r", [WAS, A])
    assert not any(_allows(advanced, token) for token in (THERE, WAS, A))   # the structure is complete


def test_tokens_the_grammar_rejects_fail_the_request(compile_regex):
    with pytest.raises(GrammarRejected):
        advance(compile_regex(" there was a"), "r", [WAS])


def test_install_patches_vllm_s_grammar_creation_once():
    from vllm.v1.structured_output import StructuredOutputManager

    assert install() and install()
    assert getattr(StructuredOutputManager._create_grammar, "_pdserve", False)


def test_the_decode_worker_asks_for_the_advance_only_with_a_constraint_and_tokens_sent():
    constrained = Sampling(max_tokens=4, structured_outputs_json='{"regex": "[a-z ]+"}')
    assert continuation_args(DecodeRequest("r", (1, 2, 3, 7, 8), constrained, num_generated=2)) == \
        {GRAMMAR_PREFIX_ARG: [7, 8]}
    assert continuation_args(DecodeRequest("r", (1, 2, 3), constrained)) == {}     # Local: nothing sent yet
    assert continuation_args(DecodeRequest("r", (1, 2, 3, 7), Sampling(max_tokens=4), num_generated=1)) == {}
