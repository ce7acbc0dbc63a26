"""Sampling parameters: one validated dataclass inside pdserve, converted at the edges.

`Sampling.validated(...)` is the single place where a request's parameters are checked; each
error names the field, so gRPC says INVALID_ARGUMENT and HTTP says 400 with that field.
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

    @classmethod
    def validated(cls, **fields) -> "Sampling":
        sampling = cls(**{k: v for k, v in fields.items() if v is not None})
        sampling.check()
        return sampling

    def check(self) -> None:
        _require(isinstance(self.max_tokens, int) and self.max_tokens >= 1, "max_tokens",
                 f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        _require(self.temperature >= 0, "temperature", f"temperature must be >= 0, got {self.temperature}")
        _require(0 < self.top_p <= 1, "top_p", f"top_p must be in (0, 1], got {self.top_p}")
        _require(self.top_k >= -1, "top_k", f"top_k must be -1, 0 (disabled) or positive, got {self.top_k}")
        _require(0 <= self.min_tokens <= self.max_tokens, "min_tokens",
                 f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        _require(all(isinstance(s, str) and s for s in self.stop), "stop", "stop strings must be non-empty")

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
        )

    def to_proto(self) -> pb.SamplingParams:
        message = pb.SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
                                    top_k=self.top_k, stop=list(self.stop), ignore_eos=self.ignore_eos,
                                    min_tokens=self.min_tokens)
        if self.seed is not None:
            message.seed = self.seed
        return message

    def to_vllm(self, **extra):
        from vllm import SamplingParams

        return SamplingParams(
            max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            seed=self.seed, stop=list(self.stop) or None, ignore_eos=self.ignore_eos, min_tokens=self.min_tokens,
            **extra,
        )


def _require(condition: bool, field: str, message: str) -> None:
    if not condition:
        raise InvalidRequest(message, field=field)
