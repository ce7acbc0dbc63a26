"""Which fields of an OpenAI body pdserve ignores and which it refuses, by vLLM's rule.

vLLM's OpenAI server ignores a field it does not know (`OpenAIBaseModel.__log_extra_fields__`
logs it at debug level and serves the request), so pdserve ignores it too: a client written for
vLLM that sends, say, OpenAI's `best_of` or a field of another server is served the same.

A field vLLM knows that pdserve does not serve (yet) is refused, 400 naming it, never dropped:
vLLM would act on it (`truncate_prompt_tokens`, `bad_words`, `tools`, ...), so pdserve's answer
would differ from vLLM's without a word. vLLM's fields are read from vLLM's own request models
(the version pinned with the workers), so the rule follows vLLM's API as it changes.
"""

from __future__ import annotations

import functools
from importlib import import_module
from typing import Literal, get_args

from pdserve.errors import InvalidRequest

Body = Literal["completion", "chat", "message", "tokenize", "detokenize", "stream_options"]

# vLLM's request models for each body (module, names of pydantic models, TypedDicts or unions of
# them): the union of their fields.
VLLM_MODELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "completion": ("vllm.entrypoints.openai.completion.protocol", ("CompletionRequest",)),
    "chat": ("vllm.entrypoints.openai.chat_completion.protocol", ("ChatCompletionRequest",)),
    "message": ("vllm.renderers.chat_utils", ("ChatCompletionMessageParam",)),   # one of a chat's `messages`
    "tokenize": ("vllm.entrypoints.serve.tokenize.protocol", ("TokenizeCompletionRequest", "TokenizeChatRequest")),
    "detokenize": ("vllm.entrypoints.serve.tokenize.protocol", ("DetokenizeRequest",)),
    "stream_options": ("vllm.entrypoints.generate.base.protocol", ("StreamOptions",)),
}


@functools.cache
def vllm_fields(body: Body) -> frozenset[str]:
    """The field names (and aliases) vLLM's server reads in `body`."""
    module_name, type_names = VLLM_MODELS[body]
    module = import_module(module_name)
    return frozenset().union(*(_field_names(getattr(module, name)) for name in type_names))


def vllm_field_type(body: Body, name: str):
    """The type vLLM's model of `body` gives its field `name` (with its constraints), so pydantic
    checks a value pdserve serves as vLLM checks it."""
    module_name, type_names = VLLM_MODELS[body]
    return getattr(import_module(module_name), type_names[0]).model_fields[name].annotation


def _field_names(model) -> frozenset[str]:
    """The keys a pydantic model (names and aliases), a TypedDict or a union of them reads."""
    if hasattr(model, "model_fields"):
        fields = model.model_fields.items()
        return frozenset(name for key, field in fields for name in (key, field.alias) if name)
    if hasattr(model, "__required_keys__"):
        return frozenset(model.__required_keys__ | model.__optional_keys__)
    return frozenset().union(*(_field_names(member) for member in get_args(model)))


def vllm_model(body: Body):
    """vLLM's request model of `body` (the first, where vLLM has several)."""
    module_name, type_names = VLLM_MODELS[body]
    return getattr(import_module(module_name), type_names[0])


def run_vllm_validator(body: Body, name: str, data):
    """vLLM's own model validator `name` of `body` (a `mode="before"` one) run on the raw JSON
    `data`, so the refusals, their messages and `param` are vLLM's (InvalidRequest); returns what
    it returns."""
    from router.openai_prompt import vllm_checked

    return vllm_checked(lambda: getattr(vllm_model(body), name)(data))


def served_fields_only(data, served: frozenset[str] | set[str], body: Body):
    """`data` (a JSON object) without the fields neither pdserve (`served`) nor vLLM knows;
    raises InvalidRequest naming the first field vLLM knows and pdserve does not serve."""
    if not isinstance(data, dict):
        return data
    unknown = [key for key in data if key not in served]
    if not unknown:
        return data
    known_to_vllm = vllm_fields(body)
    for key in unknown:
        if key in known_to_vllm:
            raise InvalidRequest(f"{key}: a field of vLLM's API that pdserve does not serve (yet)", field=key)
    return {key: value for key, value in data.items() if key in served}
