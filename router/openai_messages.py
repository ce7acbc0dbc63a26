"""A chat's messages as vLLM's OpenAI server reads them (`renderers/chat_utils.py`): text only
(a text-only model), content parts joined as vLLM joins them for a template that takes strings."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

from pdserve.errors import InvalidRequest
from router.openai_fields import served_fields_only

# The served schema (/openapi.json) says what a client may send: any other field too, ignored as
# vLLM ignores it (the models forbid extras only after `served_fields_only` has dropped them).
SERVED_EXTRAS = ConfigDict(extra="forbid", json_schema_extra={"additionalProperties": True})
TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})  # vLLM's parts that carry `text`


class ContentPart(BaseModel):
    """One part of a message's content; only text parts are served (a text-only model)."""
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = SERVED_EXTRAS
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart]
    name: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _vllm_s_unknown_fields(cls, data):
        return served_fields_only(data, set(cls.model_fields), "message")

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
