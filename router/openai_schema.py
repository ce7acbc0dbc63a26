"""OpenAI-compatible request bodies, with vLLM's fields and meanings (vLLM's
`entrypoints/openai/*/protocol.py` is the spec). A field vLLM does not know is ignored, as vLLM
ignores it; one vLLM knows that pdserve does not serve is refused, 400 naming it
(`router.openai_fields`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, Field, model_validator

from pdserve.errors import InvalidRequest, NotFound
from pdserve.sampling import Sampling
from router.openai_extra_fields import VllmExtraFields
from router.openai_fields import Body, run_vllm_validator, served_fields_only
from router.openai_messages import SERVED_EXTRAS, ChatMessage, conversation_of
from router.openai_prompt import PromptRules, check_cache_salt, check_no_request_template, template_kwargs
from router.openai_structured import check_structured_output_fields, structured_outputs_json
from router.openai_tools import check_tool_fields, tool_dicts
from router.openai_vllm_extras import check_no_prompt_embeds




INT64_MIN, INT64_MAX = -2**63, 2**63 - 1   # vLLM's bounds of `priority` and `truncate_prompt_tokens`


class StreamOptions(BaseModel):
    model_config = SERVED_EXTRAS
    include_usage: bool = False

    @model_validator(mode="before")
    @classmethod
    def _vllm_s_unknown_fields(cls, data):
        return served_fields_only(data, set(cls.model_fields), "stream_options")


class _Body(BaseModel):
    """What every body shares: vLLM's rule for fields pdserve does not read (`vllm_body` names
    vLLM's model of the body), text that is Unicode, vLLM's model check."""
    model_config = SERVED_EXTRAS   # what `_vllm_s_unknown_fields` lets through is read
    vllm_body: ClassVar[Body]

    model: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _vllm_s_unknown_fields(cls, data):
        return served_fields_only(data, set(cls.model_fields), cls.vllm_body)

    @model_validator(mode="before")
    @classmethod
    def _text_is_unicode(cls, data):
        """JSON may carry an unpaired surrogate ("\\ud800"), which no tokenizer, protobuf string or
        UTF-8 encoder takes: refused before any field is read, naming where (found by fuzzing)."""
        where = unpaired_surrogate_at(data)
        if where is not None:
            raise InvalidRequest(f"{where or 'the body'}: text with an unpaired surrogate is not valid Unicode",
                                 field=where or None)
        return data

    def check_model(self, served: str) -> None:
        """vLLM's rule: no model, or the served name; anything else is 404 with vLLM's message."""
        if self.model and self.model != served:
            raise NotFound(f"The model `{self.model}` does not exist. Valid aliases: {served}.", field="model")


class SamplingFields(VllmExtraFields, _Body):   # vLLM's extra fields: `router.openai_extra_fields`
    default_max_tokens: ClassVar[int | None] = None   # vLLM's when none is asked (None: the rest of the context)
    add_special_tokens: bool   # each body's own default (vLLM's): a completion's true, a chat's false
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
    n: int = Field(default=1, description="samples of each prompt, each an independent walk (with a seed, "
                                          "sample i has seed + i, as vLLM seeds them)")
    logit_bias: dict[str, float] | None = None
    return_tokens_as_token_ids: bool | None = None
    min_p: float | None = None
    allowed_token_ids: list[int] | None = None
    response_format: dict[str, Any] | None = None     # vLLM's: text, json_object, json_schema, structural_tag
    structured_outputs: dict[str, Any] | None = None  # vLLM's StructuredOutputsParams fields
    bad_words: list[str] = Field(default_factory=list)
    spaces_between_special_tokens: bool = True
    logprob_token_ids: list[int] | None = Field(default=None, description="vLLM's: each output position's "
                                                "logprobs are these ids' (beside the output token's)")
    truncate_prompt_tokens: Annotated[int, Field(ge=-1, le=INT64_MAX)] | None = None
    truncation_side: Literal["left", "right"] | None = None
    return_token_ids: bool | None = None   # vLLM's `prompt_token_ids` and `token_ids` in the answer
    cache_salt: str | None = Field(default=None, description="vLLM's: salts the prefix cache, so only requests "
                                                             "with the same salt share cached prompt blocks")
    priority: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX,
                          description="vLLM's; its default (first come, first served) scheduler takes any "
                                      "value and ignores it, as pdserve does")
    user: str | None = None
    request_id: str | None = None
    slo_class: str = Field(default="", description="pdserve: the request's SLO class (interactive goes before "
                                                   "batch in the router's queue)")
    use_beam_search: bool = Field(default=False, description="vLLM's: the `n` best beams of a beam search of width "
                                                             "`n` (`router.openai_beam`), each step a request")
    length_penalty: float = 1.0   # vLLM's: a beam's score is its cumulative logprob / length ** length_penalty

    @model_validator(mode="before")
    @classmethod
    def _beam_search_refusals(cls, data):
        """vLLM's `check_logprobs` refusal of what beam search does not take, with its message,
        before pdserve's own refusal of fields it does not serve."""
        if isinstance(data, dict) and data.get("logprob_token_ids") and data.get("use_beam_search"):
            raise InvalidRequest("`logprob_token_ids` is not supported with beam search.", field="logprob_token_ids")
        return data

    @model_validator(mode="before")
    @classmethod
    def _stream_options_need_stream(cls, data):
        """vLLM's check (`validate_stream_options`), with its message."""
        if isinstance(data, dict) and data.get("stream_options") and not data.get("stream"):
            raise InvalidRequest("Stream options can only be defined when `stream=True`.", field="stream_options")
        return data

    @model_validator(mode="before")
    @classmethod
    def _cache_salt_check(cls, data):
        """vLLM's check (`check_cache_salt_support`), before the field's type, with its message."""
        if isinstance(data, dict):
            check_cache_salt(data.get("cache_salt"))
        return data

    @model_validator(mode="before")
    @classmethod
    def _structured_output_checks(cls, data):
        check_structured_output_fields(data)
        return data

    def prompt_rules(self, max_model_len: int) -> PromptRules:
        """How this body's prompts are tokenized and checked (vLLM's `build_tok_params`)."""
        asked, param = self.asked_output_tokens()
        return PromptRules(max_model_len, asked or 0, param, self.truncate_prompt_tokens, self.truncation_side,
                           self.add_special_tokens)

    def asked_output_tokens(self) -> tuple[int | None, str]:
        """The output length the request asks for, and the field that asks it (vLLM's)."""
        return (self.max_tokens if self.max_tokens is not None else self.default_max_tokens), "max_tokens"

    def constraint_json(self) -> str | None:
        """The structured-output constraint the workers get (`router.openai_structured`), or None."""
        return structured_outputs_json(self.response_format, self.structured_outputs)

    @property
    def num_top_logprobs(self) -> int | None:
        """The top logprobs the answer lists per position (each API spells it its own way); None:
        the answer has no logprobs."""
        return None

    @property
    def num_logprobs(self) -> int | None:
        """vLLM's `SamplingParams.logprobs` (`to_sampling_params`): the top ones asked, or None when
        `logprob_token_ids` name the tokens instead."""
        return None if self.logprob_token_ids else self.num_top_logprobs

    @property
    def num_prompt_logprobs(self) -> int | None:
        return None

    def sampling(self, index: int = 0, room: int | None = None) -> Sampling:
        """The sampling of sample `index` (0-based) of a prompt's `n`. vLLM runs each sample as its
        own request (`v1/engine/parallel_sampling.py`), with seed + index when seeded. `room`, the
        prompt's room in the context (`context_room`), caps `max_tokens` as vLLM caps it; without
        one (a check before the prompt is known) a chat's missing `max_tokens` is pdserve's 16."""
        sampling = self._sampling(room)
        sampling.check(self.n)
        if index and sampling.seed is not None:
            sampling = replace(sampling, seed=sampling.seed + index)
            sampling.check()
        return sampling

    @property
    def echo_only(self) -> bool:
        """vLLM's echo without generation (a completion's `echo` with `max_tokens` 0): the prompt
        alone is answered, from a walk of one token that is counted in `usage` and not shown."""
        return False

    def _sampling(self, room: int | None) -> Sampling:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        max_tokens = self.max_completion_tokens if self.max_tokens is None else self.max_tokens
        if max_tokens is None:
            max_tokens = self.default_max_tokens
        if room is not None:   # vLLM's `get_max_tokens`: the asked (or default) count, at most the room
            max_tokens = room if max_tokens is None else min(max_tokens, room)
        if self.echo_only:   # vLLM's: one token is generated and not shown
            max_tokens = 1
        return Sampling.validated(max_tokens=max_tokens,
                                  temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, seed=self.seed,
                                  stop=stop or None, ignore_eos=self.ignore_eos, min_tokens=self.min_tokens,
                                  presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                                  repetition_penalty=self.repetition_penalty,
                                  stop_token_ids=tuple(self.stop_token_ids or ()) or None,
                                  include_stop_str_in_output=self.include_stop_str_in_output,
                                  skip_special_tokens=self.skip_special_tokens, logprobs=self.num_logprobs,
                                  prompt_logprobs=self.num_prompt_logprobs, logit_bias=logit_bias(self.logit_bias),
                                  structured_outputs_json=self.constraint_json(), min_p=self.min_p,
                                  allowed_token_ids=None if self.allowed_token_ids is None
                                  else tuple(self.allowed_token_ids), bad_words=tuple(self.bad_words) or None,
                                  spaces_between_special_tokens=self.spaces_between_special_tokens,
                                  logprob_token_ids=tuple(self.logprob_token_ids or ()) or None)


def context_room(num_prompt_tokens: int, max_model_len: int) -> int:
    """The tokens a prompt leaves for output in the context; a prompt longer than the context is
    refused with vLLM's message and param (a prompt that fills it leaves 0, which `max_tokens`
    then refuses, as in vLLM)."""
    if num_prompt_tokens > max_model_len:
        raise InvalidRequest(f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
                             f"contains {num_prompt_tokens} input tokens, which exceeds this limit even without any "
                             f"output tokens. Please reduce the length of the input prompt.", field="input_tokens")
    return max_model_len - num_prompt_tokens


def logit_bias(biases: dict[str, float] | None) -> tuple[tuple[int, float], ...] | None:
    """vLLM's reading of `logit_bias` (`SamplingParams.from_optional`): keys are token ids as
    strings, biases clamped to [-100, 100]; a key that is no integer is refused with vLLM's message."""
    if not biases:
        return None
    invalid, converted = [], {}
    for key, bias in biases.items():
        try:
            converted[int(key)] = min(100.0, max(-100.0, bias))
        except (ValueError, TypeError):
            invalid.append(key)
    if invalid:
        raise InvalidRequest(f"logit_bias contains key(s) that cannot be converted to integer token IDs: {invalid!r}",
                             field="logit_bias")
    return tuple(sorted(converted.items()))


MAX_COMPLETION_PROMPTS = 1024  # vLLM's VLLM_MAX_COMPLETION_PROMPTS default


class CompletionRequest(SamplingFields):
    vllm_body = "completion"
    default_max_tokens = 16   # vLLM's CompletionRequest default (a chat's is the rest of the context)
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    add_special_tokens: bool = True
    suffix: str | None = Field(default=None, description="vLLM's: text after the completion, for models whose "
                                                         "renderer does fill-in-the-middle; refused otherwise")
    prompt_embeds: Any = Field(default=None, description="vLLM's; refused as vLLM's server refuses it without "
                                                         "--enable-prompt-embeds")

    @model_validator(mode="before")
    @classmethod
    def _prompt_embeds_check(cls, data):
        """vLLM's refusal, before the body's types (vLLM reads a prompt of embeddings alone)."""
        check_no_prompt_embeds(data)
        return data

    @model_validator(mode="before")
    @classmethod
    def _vllm_checks(cls, data):
        """vLLM's `check_logprobs` (vLLM's own), `validate_prompt_and_prompt_embeds` and
        `validate_prompt_list_length`, with its messages."""
        if not isinstance(data, dict):
            return data
        if data.get("prompt") in (None, "") and data.get("prompt_embeds") in (None, []):
            raise InvalidRequest("Either prompt or prompt_embeds must be provided and non-empty.", field="prompt")
        run_vllm_validator("completion", "check_logprobs", data)
        prompt = data.get("prompt")
        if isinstance(prompt, list) and prompt and not all(isinstance(p, int) for p in prompt) \
                and len(prompt) > MAX_COMPLETION_PROMPTS:
            raise InvalidRequest(f"prompt list length {len(prompt)} exceeds the maximum allowed count of "
                                 f"{MAX_COMPLETION_PROMPTS}. To increase this limit, set the "
                                 f"VLLM_MAX_COMPLETION_PROMPTS environment variable.", field="prompt")
        return data

    @model_validator(mode="after")
    def _suffix_checks(self):
        """vLLM's checks of `suffix` (`OnlineRenderer`), in its order, with its messages. The router
        renders prompts as vLLM's `hf` renderer, which has no fill-in-the-middle form
        (`render_completion_suffix` is None), so a suffix with a text prompt is refused as vLLM
        refuses it for such a model."""
        if self.suffix is None:
            return self
        if self.echo:
            raise InvalidRequest("Echo is unsupported with suffix.", field="suffix")
        if self.truncate_prompt_tokens is not None:
            raise InvalidRequest("suffix is not supported with truncate_prompt_tokens", field="suffix")
        if isinstance(self.prompt, str) or all(isinstance(p, str) for p in self.prompt):
            raise InvalidRequest("suffix is only supported for models with FIM completion rendering", field="suffix")
        raise InvalidRequest("suffix requires text prompt input for FIM completion rendering", field="suffix")

    @property
    def echo_only(self) -> bool:
        return self.echo and self.max_tokens == 0

    def prompts(self) -> list[str | list[int]]:
        """The prompts, one per entry of a batch (a string or token ids alone is a batch of one)."""
        if isinstance(self.prompt, str) or all(isinstance(p, int) for p in self.prompt):
            return [self.prompt]
        return list(self.prompt)

    @property
    def num_top_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def num_prompt_logprobs(self) -> int | None:
        """vLLM's rule: `prompt_logprobs`, else with `echo` the `logprobs` (echoed prompt tokens get them)."""
        return self.logprobs if self.prompt_logprobs is None and self.echo else self.prompt_logprobs


def unpaired_surrogate_at(value, path: str = "") -> str | None:
    """The dotted path of the first string (or key) in JSON `value` that is not valid Unicode,
    "" for `value` itself, None when every one is."""
    if isinstance(value, str):
        return None if value.isascii() or _encodes(value) else path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        where = f"{path}.{key}" if path else str(key)
        if isinstance(key, str) and not _encodes(key):
            return where
        found = unpaired_surrogate_at(item, where)
        if found is not None:
            return found
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class TokenizeRequest(_Body):
    """vLLM's `/tokenize` body: a completion's `prompt` or a chat's `messages` (its
    TokenizeCompletionRequest | TokenizeChatRequest), special tokens added by default to a prompt
    only (a chat template adds its own)."""
    vllm_body = "tokenize"
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool | None = False
    tools: list[dict[str, Any]] | None = None   # a chat's, rendered by its template as for a completion
    chat_template: str | None = None             # refused as vLLM refuses it without --trust-request-chat-template
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _tools_shape(cls, data):
        """vLLM's shape of each tool (`router.openai_tools.check_tool_fields`; no choice here)."""
        if isinstance(data, dict) and data.get("tools") is not None:
            check_tool_fields({"tools": data["tools"], "tool_choice": "none"})
        return data

    def chat_ids(self, tokenizer) -> list[int]:
        """The ids of this body's chat, rendered as a chat completion's would be."""
        check_no_request_template(self.chat_template, self.chat_template_kwargs)
        kwargs = template_kwargs(self.chat_template_kwargs, self.add_generation_prompt, self.continue_final_message,
                                 tools=tool_dicts(self.tools))
        return tokenizer.tokenize_chat(conversation_of(self.messages), add_special_tokens=bool(self.add_special_tokens),
                                       kwargs=kwargs)

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise InvalidRequest("give exactly one of prompt or messages", field="prompt")
        if self.messages is not None and self.continue_final_message and self.add_generation_prompt:
            raise InvalidRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                                 field="continue_final_message")
        return self


class DetokenizeRequest(_Body):
    vllm_body = "detokenize"
    tokens: list[int]
