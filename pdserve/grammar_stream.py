"""Structured output continued on another engine, as one engine constrains it.

vLLM's structured outputs (`response_format`, `structured_outputs`) keep one grammar matcher per
request in the engine core (`vllm.v1.structured_output.StructuredOutputManager`): compiled when the
request arrives, advanced by each token sampled, and masking the logits of every next token. In a
disaggregated walk the prefill engine samples token 0 under the grammar; the decode engine gets
prompt + token 0 as its prompt, and a fresh matcher would constrain its first token as the
structure's first. A continuation carries the tokens already sent in
`extra_args[GRAMMAR_PREFIX_ARG]`; the matcher is advanced over them as soon as it is compiled,
before any token is sampled, so the decode engine masks exactly as one engine would have (the
matcher's state after those tokens is the one engine's: the same grammar, the same tokens).

A patch on vLLM 0.32's `StructuredOutputManager._create_grammar` (both its synchronous and its
asynchronous compile call it), installed by pdserve's vLLM plugin in every vLLM process (the
engine core is where it acts). Tokens the grammar rejects (a client's tokens that never came
from this grammar) fail the request, as a grammar that fails to compile does. Where vLLM's
internals differ (another release), `install` logs and does nothing, and pdserve does not claim
structured output across the handoff.
"""

from __future__ import annotations

import functools
import logging

logger = logging.getLogger(__name__)

GRAMMAR_PREFIX_ARG = "pdserve_grammar_prefix"   # extra_args: output tokens the grammar already produced


class GrammarRejected(ValueError):
    """The tokens a continuation carries are not a prefix of its grammar's language."""


def advance(grammar, request_id: str, token_ids) -> None:
    """Advances a compiled grammar (vLLM's `StructuredOutputGrammar`) over `token_ids`."""
    if token_ids and not grammar.accept_tokens(request_id, [int(token) for token in token_ids]):
        raise GrammarRejected(f"request {request_id}: the {len(token_ids)} tokens already sent do not follow "
                              "its structured output's grammar")


def install() -> bool:
    """Patches vLLM's grammar creation (module doc). True when installed; False, with a warning,
    where vLLM's internals are not the ones this was written against. Idempotent."""
    try:
        from vllm.v1.structured_output import StructuredOutputManager
    except ImportError as error:
        logger.warning("pdserve: structured output continuation not installed (%s)", error)
        return False
    create = getattr(StructuredOutputManager, "_create_grammar", None)
    if create is None:
        logger.warning("pdserve: structured output continuation not installed (no _create_grammar)")
        return False
    if getattr(create, "_pdserve", False):
        return True

    @functools.wraps(create)
    def create_advanced(self, request):
        grammar = create(self, request)
        params = request.sampling_params
        prefix = ((params.extra_args or {}) if params is not None else {}).get(GRAMMAR_PREFIX_ARG)
        if prefix:
            advance(grammar, request.request_id, prefix)
        return grammar

    create_advanced._pdserve = True
    StructuredOutputManager._create_grammar = create_advanced
    return True
