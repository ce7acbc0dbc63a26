"""Logprobs as they travel: one sampled (or prompt) position in the engine's terms, and the same
position as vLLM hands it to its OpenAI server.

- `SampledLogprobs`: a row of vLLM's sampler output (`vllm.v1.outputs.LogprobsLists`): the token the
  position holds, then the top-k tokens by rank (which may hold that token again), and the token's
  rank. Workers send these; the router feeds them to vLLM's own `LogprobsProcessor`
  (`router.output_logprobs`), so the entries, their order and their text are what one vLLM engine's
  output processor makes of them.
- `TopLogprob`: one entry of vLLM's `dict[int, Logprob]` for a position, with its decoded token; a
  position is a tuple of them in the dict's order (the position's own token first).

An engine returns the dict, not the row: `sampled_from_vllm` rebuilds the row. The dict dropped the
duplicate when the token is among the top k (vLLM inserts both, the second overwriting the first in
place, its rank the top-k position); the row puts it back at that position, so the processor
rebuilds the same dict.

With `logprob_token_ids` the row is the sampled token, then the listed ids in their order (vLLM's
`Sampler.gather_specific_token_logprobs`): `listed_from_vllm` rebuilds it from the list itself, so
a listed id that is the sampled token, or is listed twice, is put back where the sampler had it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence


@dataclass(frozen=True)
class SampledLogprobs:
    """Invariant: len(token_ids) == len(logprobs) >= 1; token_ids[0] is the position's token."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    rank: int


@dataclass(frozen=True)
class TopLogprob:
    token_id: int
    logprob: float
    rank: int
    token: str | None   # vLLM's `decoded_token`


PositionLogprobs = tuple[TopLogprob, ...]


def sampled_from_vllm(position: Mapping, num_logprobs: int) -> SampledLogprobs:
    """The sampler row behind one position of an engine's output (`dict[int, Logprob]`), asked
    with `num_logprobs` (vLLM's `logprobs`/`prompt_logprobs`: k >= 0, or -1 for the vocabulary)."""
    entries = list(position.items())
    (token_id, chosen), others = entries[0], entries[1:]
    top_k = len(entries) if num_logprobs == -1 else num_logprobs
    if top_k >= 1 and len(entries) == top_k:   # the token is among the top k: put it back there
        at = chosen.rank - 1
        others = others[:at] + [entries[0]] + others[at:]
    row = [(token_id, chosen.logprob)] + [(other_id, other.logprob) for other_id, other in others]
    return SampledLogprobs(tuple(t for t, _ in row), tuple(lp for _, lp in row), chosen.rank)


def listed_from_vllm(position: Mapping, logprob_token_ids: Sequence[int]) -> SampledLogprobs:
    """The sampler row behind one position asked with `logprob_token_ids` (non-empty): the
    position's token, then each listed id. The dict keeps one entry per id, its rank the sampled
    token's true rank, or for a listed id its (last) place in the list, 1-based: the rank the row's
    first entry must carry so the processor rebuilds the same dict."""
    token_id, chosen = next(iter(position.items()))
    row_ids = (token_id, *logprob_token_ids)
    return SampledLogprobs(row_ids, tuple(position[row_id].logprob for row_id in row_ids), chosen.rank)


def rows_from_vllm(positions: Sequence | None, num_logprobs: int | None,
                   logprob_token_ids: Sequence[int] = ()) -> tuple[SampledLogprobs, ...]:
    """The rows of an output's positions; () when none were asked for (`num_logprobs` None: vLLM's
    `SamplingParams.num_logprobs` or `prompt_logprobs`). A None position (vLLM's for a prompt's
    first token) has no row: prompt rows start at the second token. `logprob_token_ids` are the
    request's, for its output positions only (a prompt's are its top `prompt_logprobs`)."""
    if positions is None or num_logprobs is None:
        return ()
    if logprob_token_ids:
        return tuple(listed_from_vllm(position, logprob_token_ids) for position in positions)
    return tuple(sampled_from_vllm(position, num_logprobs) for position in positions if position is not None)


# ---- the public API's edge (generation.proto's PositionLogprobs), for the router and the SDK ----
def positions_to_proto(positions) -> list:
    from pdserve.v1 import generation_pb2 as pb

    return [pb.PositionLogprobs(entries=[pb.TopLogprob(token_id=entry.token_id, logprob=entry.logprob,
                                                       rank=entry.rank, token=entry.token or "")
                                         for entry in position]) for position in positions]


def positions_from_proto(messages) -> list[PositionLogprobs]:
    return [tuple(TopLogprob(entry.token_id, entry.logprob, entry.rank, entry.token) for entry in message.entries)
            for message in messages]
