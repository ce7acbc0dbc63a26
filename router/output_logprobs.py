"""A request's logprobs, made from the engines' sampler rows exactly as vLLM makes them: the
router's one source of logprobs, for gRPC and HTTP alike (`router.output_text` holds one).

The positions are vLLM's own output processor's (`vllm.v1.engine.logprobs.LogprobsProcessor`),
fed the rows the workers sent (`pdserve.logprobs.SampledLogprobs`) for the tokens the client gets:
the entries, their order, and each entry's text (`decoded_token`, which vLLM corrects from the
tokens sampled before it when a token is part of a character) are one engine's, though the first
token's row came from the prefill engine and the rest from one or more decode engines.
"""

from __future__ import annotations

from typing import Sequence

from pdserve.logprobs import PositionLogprobs, SampledLogprobs, TopLogprob


class OutputLogprobs:
    """Feed the rows of the tokens the client gets, in order (`add`), and the prompt's once
    (`add_prompt`). `engine_request` is the vLLM `EngineCoreRequest` the output text was made for."""

    def __init__(self, hf_tokenizer, engine_request):
        from vllm.v1.engine.logprobs import LogprobsProcessor

        self._processor = LogprobsProcessor.from_new_request(hf_tokenizer, engine_request)

    @property
    def wanted(self) -> bool:
        return self._processor.num_logprobs is not None

    @property
    def prompt_wanted(self) -> bool:
        return self._processor.num_prompt_logprobs is not None

    def add(self, rows: Sequence[SampledLogprobs]) -> tuple[PositionLogprobs, ...]:
        """The positions of the next tokens (one per row); () when logprobs were not asked for.
        Each row is fed as its own engine step, as vLLM's engine feeds it: rows of one request may
        differ in length (vLLM's sampler gives every request of a batch the listed ids' layout
        when one of them has `logprob_token_ids`)."""
        if not self.wanted or not rows:
            return ()
        for row in rows:
            self._processor.update_from_output(_engine_output(new_logprobs=_lists([row])))
        return tuple(_position(entry) for entry in self._processor.logprobs[-len(rows):])

    def add_prompt(self, rows: Sequence[SampledLogprobs]) -> tuple[PositionLogprobs, ...] | None:
        """The prompt's positions, the first (nothing predicts it) empty; None when not asked for."""
        if not self.prompt_wanted:
            return None
        if rows:
            import torch

            lists = _lists(rows)
            self._processor.update_from_output(_engine_output(new_prompt_logprobs_tensors=(
                torch.from_numpy(lists.logprob_token_ids), torch.from_numpy(lists.logprobs),
                torch.from_numpy(lists.sampled_token_ranks))))
        return tuple(_position(entry) for entry in self._processor.pop_prompt_logprobs() or ())


def _lists(rows: Sequence[SampledLogprobs]):
    import numpy as np
    from vllm.v1.outputs import LogprobsLists

    return LogprobsLists(np.array([row.token_ids for row in rows], dtype=np.int64),
                         np.array([row.logprobs for row in rows], dtype=np.float32),
                         np.array([row.rank for row in rows], dtype=np.int64))


def _engine_output(**fields):
    from vllm.v1.engine import EngineCoreOutput

    return EngineCoreOutput(request_id="", new_token_ids=[], **fields)


def _position(entry) -> PositionLogprobs:
    if entry is None:
        return ()
    return tuple(TopLogprob(token_id, logprob.logprob, logprob.rank, logprob.decoded_token)
                 for token_id, logprob in entry.items())
