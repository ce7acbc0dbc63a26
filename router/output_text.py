"""A request's output text, made from its token ids exactly as vLLM makes it: the router's one
source of text and of stop strings, for gRPC and HTTP alike.

The text is vLLM's own incremental detokenizer (`vllm.v1.engine.detokenizer`), primed with the
prompt as an engine primes it, so the text of the same tokens is vLLM's byte for byte: the stop
check over the whole output (after min_tokens), the text cut before a stop string (or after it,
`include_stop_str_in_output`), the tokens after the one that completed a stop string dropped, a
stop token's text left out, and while streaming the last `len(longest stop) - 1` characters held
back so no part of a stop string is ever sent.

The router checks stop strings itself, over the whole output, because no engine sees all of it in
a disaggregated walk: the decode engine's output starts after the prefill's first token (and a
resumed decode's after every token already sent), so a stop string that spans that boundary is
found here only. The engines still check their part, which ends a request early on the worker.

vLLM's `repetition_detection` is checked here for the same reason, with vLLM's own check over the
whole output (`router.openai_vllm_extras.repetition_end`): the tokens after the one that completes
the repeated pattern are dropped and the request finishes with "repetition", as vLLM's scheduler
ends it; the engine's own end of the same token (a stop token, EOS, the length) goes first, as in
vLLM's `check_stop`, and a stop string in the text still wins, as in vLLM's output processor.

The logprobs of the tokens the client gets are made alongside (`router.output_logprobs`): a stop
string that drops tokens drops their logprobs, as vLLM trims both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from pdserve.logprobs import PositionLogprobs, SampledLogprobs
from pdserve.sampling import Sampling
from pdserve.worker_api import StopReason
from router.openai_vllm_extras import REPETITION_FINISH_REASON, REPETITION_STOP_REASON, repetition_end
from router.output_logprobs import OutputLogprobs


@dataclass(frozen=True)
class TextStep:
    """What the client gets for one batch of tokens. When `finished` is set here but the worker's
    stream is not over, the router found a stop string and ends the request itself."""

    token_ids: tuple[int, ...]  # the tokens the client gets (a stop string drops those after it)
    text: str                   # the new text (held back near a possible stop string until finished)
    finished: bool
    finish_reason: str
    stop_reason: StopReason     # when finish_reason is "stop": the stop string, stop token id or None (EOS)
    logprobs: tuple[PositionLogprobs, ...] = ()   # one per token_ids when sampling.logprobs is set
    prompt_logprobs: tuple[PositionLogprobs, ...] | None = None  # the prompt's, once, when asked for


class OutputText:
    """One request's output. Feed its tokens in order with `add`; after a step that is `finished`,
    feed nothing more."""

    def __init__(self, hf_tokenizer, prompt_token_ids: list[int], sampling: Sampling, repetition_detection=None):
        from vllm.v1.engine import EngineCoreRequest
        from vllm.v1.engine.detokenizer import IncrementalDetokenizer

        request = EngineCoreRequest(request_id="", prompt_token_ids=list(prompt_token_ids), mm_features=None,
                                    sampling_params=sampling.to_vllm(), pooling_params=None, arrival_time=0.0,
                                    lora_request=None, cache_salt=None, data_parallel_rank=None)
        self._detokenizer = IncrementalDetokenizer.from_new_request(hf_tokenizer, request)
        self._logprobs = OutputLogprobs(hf_tokenizer, request)
        self._prompt_rows: list[SampledLogprobs] | None = [] if self._logprobs.prompt_wanted else None
        self._repetition, self._min_tokens = repetition_detection, sampling.min_tokens
        self.finished = False

    @property
    def token_ids(self) -> list[int]:
        """Every output token the client has been given."""
        return list(self._detokenizer.output_token_ids)

    def add(self, token_ids, finished: bool = False, finish_reason: str = "", stop_reason: StopReason = None,
            logprobs: Sequence[SampledLogprobs] = (), prompt_logprobs: Sequence[SampledLogprobs] = ()) -> TextStep:
        """`token_ids` are the engine's next tokens; `finished`, `finish_reason` and `stop_reason`
        its word on them (vLLM's); `logprobs` their rows, `prompt_logprobs` rows of the prompt's
        (the step with the first tokens carries them all). A stop string found here finishes the
        request with "stop"."""
        if self.finished:
            raise RuntimeError("the output is finished: no tokens may follow")
        token_ids = list(token_ids)
        if self._repetition is not None:
            kept = repetition_end(self._detokenizer.output_token_ids, token_ids, self._repetition, self._min_tokens)
            if kept is not None and not (finished and kept == len(token_ids)):
                token_ids, finished = token_ids[:kept], True
                finish_reason, stop_reason = REPETITION_FINISH_REASON, REPETITION_STOP_REASON
        stopped_on_token = finished and finish_reason == "stop" and not isinstance(stop_reason, str)
        before = self._detokenizer.num_output_tokens()
        stop_string = self._detokenizer.update(token_ids, stopped_on_token)
        if stop_string is not None:
            finished, finish_reason, stop_reason = True, "stop", stop_string
        self.finished = finished
        kept = tuple(self._detokenizer.output_token_ids[before:])
        text = self._detokenizer.get_next_output_text(finished, delta=True)
        prompt = None
        if self._prompt_rows is not None:
            self._prompt_rows.extend(prompt_logprobs)
            if kept or finished:
                prompt, self._prompt_rows = self._logprobs.add_prompt(self._prompt_rows), None
        return TextStep(kept, text, finished, finish_reason if finished else "",
                        stop_reason if finished and finish_reason in ("stop", REPETITION_FINISH_REASON) else None,
                        self._logprobs.add(logprobs[:len(kept)]), prompt)
