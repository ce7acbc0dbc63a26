"""The chat completion body (vLLM's `chat_completion/protocol.py` is the spec): its messages, its
logprobs and echo, and how its prompt is rendered (`router.openai_prompt`: the template's
arguments, the answer's role)."""

from __future__ import annotations

from typing import Any

from pydantic import model_validator

from pdserve.errors import InvalidRequest
from router.openai_fields import run_vllm_validator, vllm_field_type
from router.openai_messages import ChatMessage, conversation_of
from router.openai_prompt import answer_role, check_no_request_template, template_kwargs
from router.openai_schema import SamplingFields
from router.openai_tools import ToolChoice, check_tool_fields, tool_dicts
from router.openai_vllm_extras import check_mm_kwargs, reasoning_template_kwargs

ReasoningEffort = vllm_field_type("chat", "reasoning_effort")   # vLLM's values


class ChatCompletionRequest(SamplingFields):
    vllm_body = "chat"
    messages: list[ChatMessage]
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    prompt_logprobs: int | None = None   # vLLM's: the prompt's, in the (non-streamed) answer's `prompt_logprobs`
    echo: bool = False   # vLLM's: the last message's content first when it is the answering role's
    add_special_tokens: bool = False   # vLLM's: the template writes them
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None   # vLLM's; refused as vLLM refuses it without --trust-request-chat-template
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, str]] | None = None   # vLLM's: given to a template that reads `documents`
    tools: list[dict[str, Any]] | None = None      # vLLM's `ChatCompletionToolsParam`s (`router.openai_tools`)
    tool_choice: ToolChoice = "none"               # vLLM's default; "auto" when `tools` come without one
    parallel_tool_calls: bool | None = True        # false: only the first call is answered (vLLM's filter)
    reasoning_effort: ReasoningEffort = None   # vLLM's: given to the template
    include_reasoning: bool = True   # vLLM's: false drops the reasoning a --reasoning-parser splits off (router.openai_tools)
    return_prompt_text: bool | None = None   # vLLM's: the rendered prompt as `prompt_text`

    mm_processor_kwargs: dict[str, Any] | None = None   # vLLM's; refused by its check (`check_mm_kwargs`)
    media_io_kwargs: dict[str, dict[str, Any]] | None = None

    @model_validator(mode="before")
    @classmethod
    def _mm_kwargs_check(cls, data):
        check_mm_kwargs(data)
        return data

    @model_validator(mode="before")
    @classmethod
    def _tool_checks(cls, data):
        """vLLM's own checks of `tools` and `tool_choice` (`router.openai_tools.check_tool_fields`)."""
        return check_tool_fields(data)

    @model_validator(mode="before")
    @classmethod
    def _vllm_checks(cls, data):
        """vLLM's `check_logprobs` (vLLM's own), `check_generation_prompt` (both fields sent true)
        and its refusal of an empty conversation, with its messages."""
        if not isinstance(data, dict):
            return data
        if data.get("messages") == []:
            raise InvalidRequest("Cannot apply chat template to an empty conversation. Provide at least one message.",
                                 field="messages")
        run_vllm_validator("chat", "check_logprobs", data)
        if data.get("continue_final_message") and data.get("add_generation_prompt"):
            raise InvalidRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        return data

    def asked_output_tokens(self) -> tuple[int | None, str]:
        """vLLM's: `max_completion_tokens` when sent, else `max_tokens` (none: the rest of the context)."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    @property
    def num_top_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def num_prompt_logprobs(self) -> int | None:
        """vLLM's rule: `prompt_logprobs`, else with `echo` the prompt's logprobs (`top_logprobs`
        of them) come too."""
        if self.prompt_logprobs is not None:
            return self.prompt_logprobs
        return (self.top_logprobs or 0) if self.echo else None

    @property
    def role(self) -> str:
        """The answer's role (`router.openai_prompt.answer_role`)."""
        return answer_role(self.add_generation_prompt, self.messages[-1].role)

    def echo_text(self) -> str | None:
        """With `echo`: the last message's content when it is the answering role's, else "" (vLLM's);
        None without `echo`."""
        if not self.echo:
            return None
        last = self.conversation()[-1]
        return last["content"] if last["role"] == self.role else ""

    def conversation(self) -> list[dict]:
        """The messages as the chat template gets them (`router.openai_messages.conversation_of`)."""
        return conversation_of(self.messages)

    def template_kwargs(self) -> dict[str, Any]:
        """The chat template's arguments, as vLLM's server gives them; a template sent with the
        request is refused, as vLLM refuses it by default."""
        check_no_request_template(self.chat_template, self.chat_template_kwargs)
        return template_kwargs(self.chat_template_kwargs, self.add_generation_prompt, self.continue_final_message,
                               self.documents, reasoning_template_kwargs(self.reasoning_effort,
                                                                         self.chat_template_kwargs),
                               tools=tool_dicts(self.tools))
