"""OpenAI-compatible request bodies. Unknown fields are refused (HTTP 400 naming the field)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from pdserve.errors import InvalidRequest
from pdserve.sampling import Sampling


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    min_tokens: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, description="only 1 is supported")
    user: str | None = None
    request_id: str | None = None
    slo_class: str = Field(default="", description="pdserve: the request's SLO class (interactive goes before "
                                                   "batch in the router's queue)")

    def sampling(self) -> Sampling:
        if self.n != 1:
            raise InvalidRequest("only n=1 is supported", field="n")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return Sampling.validated(max_tokens=self.max_completion_tokens if self.max_tokens is None else self.max_tokens,
                                  temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, seed=self.seed,
                                  stop=stop or None, ignore_eos=self.ignore_eos, min_tokens=self.min_tokens)


class CompletionRequest(_SamplingFields):
    prompt: str | list[int]
    echo: Literal[False] = False
    logprobs: None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str
    name: str | None = None


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
