"""A chat's messages as vLLM's OpenAI server reads them (`renderers/chat_utils.py`): text only
(a text-only model), content parts joined as vLLM joins them for a template that takes strings; an
assistant's `tool_calls` and `reasoning` and a tool's `tool_call_id` reach the template as vLLM
gives them (a call's JSON `arguments` parsed to an object by vLLM's own `_postprocess_messages`)."""

from __future__ import annotations

from typing import Any, Literal

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
    content: str | list[ContentPart] | None = None   # vLLM's: none is no parts (an assistant's tool calls alone)
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None   # an assistant's calls (OpenAI's shape), given to the template
    tool_call_id: str | None = None                  # a tool's answer names the call it answers
    reasoning: str | None = None                     # an assistant's reasoning, for templates that interleave it
    reasoning_content: str | None = None             # vLLM's deprecated name of `reasoning`

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
        elif self.content is None:
            content = ""   # vLLM: no parts, joined
        else:
            for position, part in enumerate(self.content):
                if part.type not in TEXT_PART_TYPES:
                    field = f"messages.{index}.content.{position}.type"
                    raise InvalidRequest(f"{field}: content parts of type {part.type!r} are not supported: this "
                                         f"model takes text parts only (type 'text')", field=field)
            content = "\n".join(part.text for part in self.content if part.text is not None)
        message = {"role": self.role, "content": content}
        reasoning = self.reasoning if self.reasoning is not None else self.reasoning_content
        if self.role == "assistant":   # vLLM's `_parse_chat_message_content`
            if self.tool_calls is not None:
                message["tool_calls"] = [dict(call) | _function_copy(call) for call in self.tool_calls]
            if reasoning is not None:
                message["reasoning"] = message["reasoning_content"] = reasoning
        elif self.role == "tool" and self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message | ({"name": self.name} if self.name is not None else {})


def _function_copy(call: dict) -> dict:
    """A call's `function` copied, so that vLLM's `_postprocess_messages` (which parses its
    `arguments` in place) leaves the request as it came."""
    function = call.get("function")
    return {"function": dict(function)} if isinstance(function, dict) else {}


def conversation_of(messages: list[ChatMessage]) -> list[dict]:
    """The conversation the chat template gets: each message rendered, then vLLM's own
    `_postprocess_messages` (an assistant's tool call `arguments` as an object, {} when not JSON;
    empty `tool_calls` dropped; its refusals of calls that are not functions, with its messages)."""
    from router.openai_prompt import vllm_checked
    from vllm.renderers.chat_utils import _postprocess_messages

    conversation = [message.rendered(index) for index, message in enumerate(messages)]
    vllm_checked(lambda: _postprocess_messages(conversation))
    return conversation
