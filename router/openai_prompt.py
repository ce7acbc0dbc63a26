"""A request's prompt as vLLM's OpenAI server makes it, in the router, before any worker sees it.

Tokenizing: vLLM's `TokenizeParams` (`renderers/params.py`) holds its rules, and pdserve builds
the same object from the request (`PromptRules`) and runs its steps with the router's tokenizer
(`router.tokenizer`), so the rules and the refusals, with vLLM's messages and `param`, are vLLM's:
- `add_special_tokens` (a completion's default true, a chat's false: its template writes them);
- `truncate_prompt_tokens` keeps that many tokens (-1: the context, less one when output is
  asked), from `truncation_side` ("left" keeps the last ones; unset: the tokenizer's, "left" for a
  generating model as vLLM loads it); more than the context is refused, naming the field;
- a prompt longer than the context is refused after truncation (`input_tokens`, or `input_text`
  for a text far too long to tokenize), and an asked `max_tokens` (a chat's
  `max_completion_tokens`) longer than the context is refused, naming it.

Chat templating: the template's keyword arguments are vLLM's merge (`template_kwargs`), filtered
as vLLM filters them (`resolve_chat_template_kwargs`); a template sent with the request is refused
as vLLM refuses it without `--trust-request-chat-template` (`check_no_request_template`); the
answer's role is the last message's when no generation prompt is added (`answer_role`).

A prompt's `cache_salt` is checked by vLLM's own `validate_cache_salt` (`check_cache_salt`), on
both public APIs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from pdserve.errors import InvalidRequest
from pdserve.sampling import is_engine_input_error

T = TypeVar("T")
UNTRUSTED_TEMPLATE = ("Chat template is passed with request, but --trust-request-chat-template is not set. "
                      "Refused request with untrusted chat template.")   # vLLM's message
ASSISTANT = "assistant"   # vLLM's default response role


@dataclass(frozen=True)
class PromptRules:
    """How a request's prompts are tokenized and checked: vLLM's `build_tok_params` of the body."""

    max_model_len: int
    max_output_tokens: int = 0            # the asked output length (0: none asked, a chat's default)
    max_output_tokens_param: str = "max_tokens"
    truncate_prompt_tokens: int | None = None
    truncation_side: str | None = None
    add_special_tokens: bool = True

    def vllm(self):
        """vLLM's `TokenizeParams` for these rules; its refusals (a truncation or an output longer
        than the context, a bad side) raise InvalidRequest naming the field."""
        from vllm.renderers.params import TokenizeParams

        return vllm_checked(lambda: TokenizeParams(
            max_total_tokens=self.max_model_len, max_output_tokens=self.max_output_tokens,
            truncate_prompt_tokens=self.truncate_prompt_tokens, truncation_side=self.truncation_side,
            add_special_tokens=self.add_special_tokens, max_total_tokens_param="max_model_len",
            max_output_tokens_param=self.max_output_tokens_param))


def text_prompt_ids(tokenizer, text: str, rules: PromptRules) -> list[int]:
    """`text`'s token ids as vLLM's renderer makes them (`_tokenize_singleton_prompt`):
    the length check on the text (or its trim, with a truncation side), the tokenizer's call with
    vLLM's arguments, then truncation and the length check on the ids. `tokenizer` is vLLM's
    cached Hugging Face tokenizer (`router.tokenizer.RouterTokenizer.hf`)."""
    params = rules.vllm()

    def tokenize() -> list[int]:
        prompt = params.apply_pre_tokenization(tokenizer, {"prompt": text})
        ids = tokenizer(prompt["prompt"], **params.get_encode_kwargs())["input_ids"]
        return params.apply_post_tokenization(tokenizer, {"prompt_token_ids": list(ids)})["prompt_token_ids"]

    return vllm_checked(tokenize)


def token_prompt_ids(tokenizer, token_ids: list[int], rules: PromptRules) -> list[int]:
    """A token-id prompt as vLLM takes it: truncated, then its length checked."""
    params = rules.vllm()
    return vllm_checked(lambda: list(params.apply_post_tokenization(
        tokenizer, {"prompt_token_ids": list(token_ids)})["prompt_token_ids"]))


def vllm_checked(step: Callable[[], T]) -> T:
    """`step()`, with vLLM's refusals of the request (its validation errors, ValueError) as
    InvalidRequest with vLLM's message and its `parameter` as the field."""
    try:
        return step()
    except Exception as error:   # vLLM's VLLMValidationError is no ValueError
        if not is_engine_input_error(error):
            raise
        message = error.args[0] if error.args else str(error)
        raise InvalidRequest(str(message), field=getattr(error, "parameter", None)) from error


def template_kwargs(chat_template_kwargs: dict[str, Any] | None, add_generation_prompt: bool,
                    continue_final_message: bool, documents: list | None = None,
                    tools: list[dict] | None = None) -> dict[str, Any]:
    """The keyword arguments vLLM's server gives the chat template (before it drops those the
    template does not read): the request's `chat_template_kwargs`, overridden by the request's own
    fields, over vLLM's defaults (`tokenize` false, the request's `tools`); a None or "auto" value
    never overrides (`ChatCompletionRequest.build_chat_params`, `ChatParams.with_defaults`,
    `get_apply_chat_template_kwargs`, `OnlineRenderer.preprocess_chat`)."""
    from vllm.renderers.params import merge_kwargs

    asked = merge_kwargs(chat_template_kwargs, dict(add_generation_prompt=add_generation_prompt,
                                                    continue_final_message=continue_final_message,
                                                    documents=documents))
    with_defaults = merge_kwargs({"tools": tools, "tokenize": False}, asked)
    return merge_kwargs(with_defaults, {"chat_template": None, "return_dict": False})


def check_no_request_template(chat_template: str | None, chat_template_kwargs: dict[str, Any] | None) -> None:
    """vLLM's refusal (`validate_chat_template`) of a template sent with the request, as a field or
    in `chat_template_kwargs`: pdserve, like vLLM by default, renders with the model's own."""
    if chat_template is not None or (chat_template_kwargs and chat_template_kwargs.get("chat_template") is not None):
        raise InvalidRequest(UNTRUSTED_TEMPLATE)


def answer_role(add_generation_prompt: bool, last_message_role: str) -> str:
    """The role of the answer's message (vLLM's `get_chat_request_role`): the assistant's after a
    generation prompt, else the role of the message being continued."""
    return ASSISTANT if add_generation_prompt else last_message_role


def check_cache_salt(cache_salt: object) -> None:
    """vLLM's check of a prompt's prefix-cache salt (None: no salt), its refusal as InvalidRequest
    with vLLM's message and `param`."""
    if cache_salt is None:   # every HTTP body without one: nothing to check
        return
    from vllm.entrypoints.generate.base.protocol import validate_cache_salt

    try:
        validate_cache_salt(cache_salt)
    except Exception as error:  # vLLM's VLLMValidationError
        if not is_engine_input_error(error):
            raise
        raise InvalidRequest(str(error), field="cache_salt") from error
