"""Sampling parameters: one validated dataclass inside pdserve, converted at the edges.

`Sampling.validated(...)` is the single place where a request's parameters are checked; each
error names the field, so gRPC says INVALID_ARGUMENT and HTTP says 400 with that field. The
ranges are vLLM's own: `check()` builds the engine's `SamplingParams`, which runs vLLM's
validation, so the router refuses exactly what an engine would (a request the router lets
through must never fail in an engine as the engine's fault: DESIGN 2, issue 18 item 6).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from google.protobuf.descriptor import FieldDescriptor

from pdserve.errors import InvalidRequest
from pdserve.v1 import generation_pb2 as pb

DEFAULT_MAX_TOKENS = 16
MAX_LOGPROBS = 20   # vLLM's `max_logprobs` default, which pdserve's engines keep


@dataclass(frozen=True)
class Sampling:
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None          # vLLM's: None none, k >= 0 the top k (and the sampled token), -1 all
    prompt_logprobs: int | None = None   # the same for the prompt's tokens
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100]); a tuple: frozen
    structured_outputs_json: str = ""    # vLLM's StructuredOutputsParams fields as JSON; "": unconstrained
    min_p: float = 0.0
    allowed_token_ids: tuple[int, ...] | None = None   # None: any token; vLLM refuses an empty list
    bad_words: tuple[str, ...] = ()      # vLLM's: each engine tokenizes them (`SamplingParams.update_from_tokenizer`)
    spaces_between_special_tokens: bool = True
    # vLLM's: each output position's logprobs are these ids' (beside the output token's), not the
    # top `logprobs`; (): none (vLLM reads an empty list as none)
    logprob_token_ids: tuple[int, ...] = ()

    @property
    def num_logprobs(self) -> int | None:
        """vLLM's count of each output position's logprobs (`SamplingParams.num_logprobs`):
        `logprobs`, else the number of `logprob_token_ids`, else None (none asked)."""
        if self.logprobs is not None:
            return self.logprobs
        return len(self.logprob_token_ids) if self.logprob_token_ids else None

    @classmethod
    def validated(cls, **fields) -> "Sampling":
        sampling = cls(**{k: v for k, v in fields.items() if v is not None})
        sampling.check()
        return sampling

    def check(self, n: int = 1) -> None:
        """Raises InvalidRequest naming the field. pdserve's own rules first (vLLM lets max_tokens
        be None and a stop string be empty), then vLLM's validation of every range, and of `n`
        samples of the prompt with these values (vLLM refuses n > 1 when greedy)."""
        _require(isinstance(self.max_tokens, int) and not isinstance(self.max_tokens, bool) and self.max_tokens >= 1,
                 "max_tokens", f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        _require(all(isinstance(s, str) and s for s in self.stop), "stop", "stop strings must be non-empty")
        _require(all(isinstance(t, int) and not isinstance(t, bool) and -2**31 <= t < 2**31 for t in self.stop_token_ids),
                 "stop_token_ids", "stop_token_ids must be 32-bit integers")
        _require(all(isinstance(word, str) for word in self.bad_words), "bad_words", "bad_words must be strings")
        try:
            self.to_vllm(n=n)
        except Exception as error:  # vLLM's VLLMValidationError is no ValueError
            if not is_engine_input_error(error):
                raise
            raise InvalidRequest(str(error), field=engine_error_field(error)) from error
        self._check_fits_the_wire()

    def _check_fits_the_wire(self) -> None:
        """Every integer fits its field of `pb.SamplingParams`, the message the workers get, with
        the width read from the proto: a value vLLM takes that the wire cannot carry (a top_k or
        seed past 64 bits, found by fuzzing) is the request's error, not a failure to build the call."""
        for field in pb.SamplingParams.DESCRIPTOR.fields:
            low, high = _WIRE_INT_RANGES.get(field.type, (None, None))
            value = getattr(self, field.name, None)
            values = value if isinstance(value, tuple) else (value,)
            if low is not None and any(isinstance(v, int) and not low <= v <= high for v in values):
                raise InvalidRequest(f"{field.name} must be in [{low}, {high}], got {value!r}", field=field.name)

    def check_for_model(self, vocab_size: int) -> None:
        """What vLLM checks against the model when a request reaches an engine
        (`SamplingParams._validate_logprobs`, `_validate_logit_bias`), with vLLM's messages: here,
        so the router refuses it before any worker sees it."""
        try:   # vLLM's own check of `logprobs`, `logprob_token_ids` and `prompt_logprobs`
            self.to_vllm()._validate_logprobs(_ModelLimits(vocab_size))
        except Exception as error:  # vLLM's VLLMValidationError
            if not is_engine_input_error(error):
                raise
            raise InvalidRequest(error.args[0] if error.args else str(error),
                                 field=engine_error_field(error)) from error
        outside = [token_id for token_id, _ in self.logit_bias if not 0 <= token_id < vocab_size]
        _require(not outside, "logit_bias", f"token_id(s) {outside} in logit_bias contain out-of-vocab token ids. "
                                            f"Vocabulary size: {vocab_size}")
        if self.allowed_token_ids is not None:
            _require(len(self.allowed_token_ids) > 0, "allowed_token_ids", "allowed_token_ids is not None and empty!")
            _require(all(0 <= token_id < vocab_size for token_id in self.allowed_token_ids), "allowed_token_ids",
                     "allowed_token_ids contains out-of-vocab token id!")

    def with_max_tokens(self, max_tokens: int) -> "Sampling":
        return replace(self, max_tokens=max_tokens, min_tokens=min(self.min_tokens, max_tokens))

    # ---- edges ---------------------------------------------------------------------------------
    @classmethod
    def from_proto(cls, message: pb.SamplingParams) -> "Sampling":
        get = lambda name: getattr(message, name) if message.HasField(name) else None  # noqa: E731
        return cls.validated(
            max_tokens=get("max_tokens"), temperature=get("temperature"), top_p=get("top_p"),
            top_k=get("top_k"), seed=get("seed"), stop=tuple(message.stop) or None,
            ignore_eos=message.ignore_eos, min_tokens=get("min_tokens"),
            presence_penalty=get("presence_penalty"), frequency_penalty=get("frequency_penalty"),
            repetition_penalty=get("repetition_penalty"), stop_token_ids=tuple(message.stop_token_ids) or None,
            include_stop_str_in_output=message.include_stop_str_in_output,
            skip_special_tokens=get("skip_special_tokens"), logprobs=get("logprobs"),
            prompt_logprobs=get("prompt_logprobs"), logit_bias=tuple(sorted(message.logit_bias.items())) or None,
            structured_outputs_json=message.structured_outputs_json, min_p=get("min_p"),
            allowed_token_ids=tuple(message.allowed_token_ids) or None, bad_words=tuple(message.bad_words) or None,
            spaces_between_special_tokens=get("spaces_between_special_tokens"),
            logprob_token_ids=tuple(message.logprob_token_ids) or None,
        )

    def to_proto(self) -> pb.SamplingParams:
        message = pb.SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
                                    top_k=self.top_k, stop=list(self.stop), ignore_eos=self.ignore_eos,
                                    min_tokens=self.min_tokens, presence_penalty=self.presence_penalty,
                                    frequency_penalty=self.frequency_penalty,
                                    repetition_penalty=self.repetition_penalty,
                                    stop_token_ids=list(self.stop_token_ids),
                                    include_stop_str_in_output=self.include_stop_str_in_output,
                                    skip_special_tokens=self.skip_special_tokens, logit_bias=dict(self.logit_bias),
                                    structured_outputs_json=self.structured_outputs_json, min_p=self.min_p,
                                    allowed_token_ids=list(self.allowed_token_ids or ()),
                                    bad_words=list(self.bad_words),
                                    spaces_between_special_tokens=self.spaces_between_special_tokens,
                                    logprob_token_ids=list(self.logprob_token_ids))
        for name in ("seed", "logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                setattr(message, name, getattr(self, name))
        return message

    def structured_outputs(self):
        """vLLM's `StructuredOutputsParams` (which checks that exactly one constraint is set), or None."""
        if not self.structured_outputs_json:
            return None
        from vllm.sampling_params import StructuredOutputsParams

        try:
            fields = json.loads(self.structured_outputs_json)
            if not isinstance(fields, dict):
                raise TypeError("not a JSON object")
            return StructuredOutputsParams(**fields)
        except Exception as error:  # json's ValueError, a TypeError, vLLM's validation (no ValueError)
            if not isinstance(error, TypeError) and not is_engine_input_error(error):
                raise
            raise InvalidRequest(str(error), field="structured_outputs") from error

    def to_vllm(self, **extra):
        """vLLM's `SamplingParams` for these values (vLLM validates them as it builds it)."""
        from vllm import SamplingParams

        return SamplingParams(
            max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            seed=self.seed, stop=list(self.stop) or None, ignore_eos=self.ignore_eos, min_tokens=self.min_tokens,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty, stop_token_ids=list(self.stop_token_ids) or None,
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens, logprobs=self.logprobs, prompt_logprobs=self.prompt_logprobs,
            logit_bias=dict(self.logit_bias) or None, structured_outputs=self.structured_outputs(), min_p=self.min_p,
            allowed_token_ids=None if self.allowed_token_ids is None else list(self.allowed_token_ids),
            bad_words=list(self.bad_words) or None, spaces_between_special_tokens=self.spaces_between_special_tokens,
            logprob_token_ids=list(self.logprob_token_ids) or None, **extra,
        )


def is_engine_input_error(error: BaseException) -> bool:
    """True for the errors vLLM raises for a bad request (its 4xx class), which are the client's
    fault and never the engine's: `VLLMClientError` (validation, not found) and ValueError (vLLM's
    older checks: a prompt too long, token ids out of range)."""
    if isinstance(error, ValueError):
        return True
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:  # no engine here (the SDK's process): nothing of vLLM's can be raised
        return False
    return isinstance(error, VLLMClientError)


def engine_error_field(error: BaseException) -> str | None:
    """The request field an engine's validation error is about: vLLM's `parameter` where it sets
    one, else the field its message starts with ("top_k must be ..."), else None."""
    parameter = getattr(error, "parameter", None)
    if parameter:
        return str(parameter)
    first_word = str(error).split(" ", 1)[0]
    return first_word if first_word in _FIELDS else None


_FIELDS = frozenset(Sampling.__dataclass_fields__) | {"n"}  # n: the samples of a prompt (`check(n)`)
_WIRE_INT_RANGES = {FieldDescriptor.TYPE_INT32: (-2**31, 2**31 - 1), FieldDescriptor.TYPE_INT64: (-2**63, 2**63 - 1)}


@dataclass(frozen=True)
class _ModelLimits:
    """What vLLM's `SamplingParams._validate_logprobs` reads of its `ModelConfig`: pdserve's
    engines keep vLLM's default `max_logprobs`."""

    vocab_size: int
    max_logprobs: int = MAX_LOGPROBS

    def get_vocab_size(self) -> int:
        return self.vocab_size


def _require(condition: bool, field: str, message: str) -> None:
    if not condition:
        raise InvalidRequest(message, field=field)
