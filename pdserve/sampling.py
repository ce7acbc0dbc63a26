"""Sampling parameters: one validated dataclass inside pdserve, converted at the edges.

`Sampling.validated(...)` is the single place where a request's parameters are checked; each
error names the field, so gRPC says INVALID_ARGUMENT and HTTP says 400 with that field. The
ranges are vLLM's own: `check()` builds the engine's `SamplingParams`, which runs vLLM's
validation, so the router refuses exactly what an engine would (a request the router lets
through must never fail in an engine as the engine's fault: DESIGN 2, issue 18 item 6).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pdserve.errors import InvalidRequest
from pdserve.v1 import generation_pb2 as pb

DEFAULT_MAX_TOKENS = 16


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

    @classmethod
    def validated(cls, **fields) -> "Sampling":
        sampling = cls(**{k: v for k, v in fields.items() if v is not None})
        sampling.check()
        return sampling

    def check(self) -> None:
        """Raises InvalidRequest naming the field. pdserve's own rules first (vLLM lets max_tokens
        be None and a stop string be empty), then vLLM's validation of every range."""
        _require(isinstance(self.max_tokens, int) and not isinstance(self.max_tokens, bool) and self.max_tokens >= 1,
                 "max_tokens", f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        _require(all(isinstance(s, str) and s for s in self.stop), "stop", "stop strings must be non-empty")
        _require(all(isinstance(t, int) and not isinstance(t, bool) and -2**31 <= t < 2**31 for t in self.stop_token_ids),
                 "stop_token_ids", "stop_token_ids must be 32-bit integers")
        try:
            self.to_vllm()
        except Exception as error:  # vLLM's VLLMValidationError is no ValueError
            if not is_engine_input_error(error):
                raise
            raise InvalidRequest(str(error), field=engine_error_field(error)) from error

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
            skip_special_tokens=get("skip_special_tokens"),
        )

    def to_proto(self) -> pb.SamplingParams:
        message = pb.SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
                                    top_k=self.top_k, stop=list(self.stop), ignore_eos=self.ignore_eos,
                                    min_tokens=self.min_tokens, presence_penalty=self.presence_penalty,
                                    frequency_penalty=self.frequency_penalty,
                                    repetition_penalty=self.repetition_penalty,
                                    stop_token_ids=list(self.stop_token_ids),
                                    include_stop_str_in_output=self.include_stop_str_in_output,
                                    skip_special_tokens=self.skip_special_tokens)
        if self.seed is not None:
            message.seed = self.seed
        return message

    def to_vllm(self, **extra):
        """vLLM's `SamplingParams` for these values (vLLM validates them as it builds it)."""
        from vllm import SamplingParams

        return SamplingParams(
            max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            seed=self.seed, stop=list(self.stop) or None, ignore_eos=self.ignore_eos, min_tokens=self.min_tokens,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty, stop_token_ids=list(self.stop_token_ids) or None,
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens, **extra,
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


_FIELDS = frozenset(Sampling.__dataclass_fields__)


def _require(condition: bool, field: str, message: str) -> None:
    if not condition:
        raise InvalidRequest(message, field=field)
