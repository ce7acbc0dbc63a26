"""OpenAI-compatible request bodies, with vLLM's fields and meanings (vLLM's
`entrypoints/openai/*/protocol.py` is the spec). Unknown fields are refused (HTTP 400 naming the field)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from pdserve.errors import InvalidRequest, NotFound
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
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, description="only 1 is supported")
    user: str | None = None
    request_id: str | None = None
    slo_class: str = Field(default="", description="pdserve: the request's SLO class (interactive goes before "
                                                   "batch in the router's queue)")

    def check_model(self, served: str) -> None:
        """vLLM's rule: no model, or the served name; anything else is 404 with vLLM's message."""
        if self.model and self.model != served:
            raise NotFound(f"The model `{self.model}` does not exist. Valid aliases: {served}.", field="model")

    def sampling(self) -> Sampling:
        if self.n != 1:
            raise InvalidRequest("only n=1 is supported", field="n")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return Sampling.validated(max_tokens=self.max_completion_tokens if self.max_tokens is None else self.max_tokens,
                                  temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, seed=self.seed,
                                  stop=stop or None, ignore_eos=self.ignore_eos, min_tokens=self.min_tokens,
                                  presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                                  repetition_penalty=self.repetition_penalty,
                                  stop_token_ids=tuple(self.stop_token_ids or ()) or None,
                                  include_stop_str_in_output=self.include_stop_str_in_output,
                                  skip_special_tokens=self.skip_special_tokens)


class CompletionRequest(_SamplingFields):
    prompt: str | list[int]
    echo: Literal[False] = False
    logprobs: None = None


TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})  # vLLM's parts that carry `text`


class ContentPart(BaseModel):
    """One part of a message's content; only text parts are served (a text-only model)."""
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart]
    name: str | None = None

    def rendered(self, index: int) -> dict:
        """The message as the chat template gets it: content parts joined by newlines, as vLLM joins
        them for a template that takes string content (`renderers/chat_utils.py`); a text part
        without text is skipped, as vLLM skips it. A part that is not text is refused, naming it."""
        if isinstance(self.content, str):
            content = self.content
        else:
            for position, part in enumerate(self.content):
                if part.type not in TEXT_PART_TYPES:
                    field = f"messages.{index}.content.{position}.type"
                    raise InvalidRequest(f"{field}: content parts of type {part.type!r} are not supported: this "
                                         f"model takes text parts only (type 'text')", field=field)
            content = "\n".join(part.text for part in self.content if part.text is not None)
        return {"role": self.role, "content": content} | ({"name": self.name} if self.name is not None else {})


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)

    def conversation(self) -> list[dict]:
        return [message.rendered(index) for index, message in enumerate(self.messages)]
