"""The router tokenizes once and makes the output text (`router.output_text`); workers see token ids only."""

from __future__ import annotations

import json
from pathlib import Path

from pdserve.errors import InvalidRequest
from pdserve.sampling import Sampling
from router.openai_prompt import template_kwargs, vllm_checked
from router.output_text import OutputText


class RouterTokenizer:
    def __init__(self, model_dir: str):
        from transformers import AutoTokenizer
        from vllm.tokenizers.hf import get_cached_tokenizer

        # As vLLM's server loads it for a generating model: truncation from the left, cached properties.
        self._hf = get_cached_tokenizer(AutoTokenizer.from_pretrained(model_dir, truncation_side="left"))
        self._fast = self._hf.backend_tokenizer
        self.eos_token_id = self._hf.eos_token_id
        config = json.loads((Path(model_dir) / "config.json").read_text())
        self.vocab_size = int(config.get("vocab_size", len(self._hf)))

    def encode(self, text: str) -> list[int]:
        """Token ids of a prompt; an empty prompt is the client's error, not a lone BOS token."""
        if not text:
            raise InvalidRequest("the prompt is empty", field="prompt")
        return self._fast.encode(text).ids

    def decode(self, token_ids: list[int]) -> str:
        """The text of `token_ids` as vLLM's OpenAI server decodes a prompt (`echo`): the tokenizer's
        `decode`, special tokens included."""
        return self._hf.decode(token_ids)

    def decode_one(self, token_id: int) -> str:
        """One token's text, as vLLM names a token its logprobs carry no text for."""
        return self._hf.decode([token_id])

    @property
    def hf(self):
        """vLLM's cached Hugging Face tokenizer (what `router.openai_prompt` tokenizes with)."""
        return self._hf

    def render_chat(self, messages: list[dict]) -> list[int]:
        """The ids of a chat with vLLM's defaults (a generation prompt, no special tokens added)."""
        return self.tokenize_chat(messages)

    def apply_template(self, messages: list[dict], kwargs: dict | None = None) -> str | list[int]:
        """The chat template's rendering of `messages` as vLLM's server makes it
        (`safe_apply_chat_template`): `kwargs` (`router.openai_prompt.template_kwargs`) less those
        neither the template nor Hugging Face's `apply_chat_template` reads; the text, or token ids
        when `kwargs` asks `tokenize`. A template's refusal is the request's error, as vLLM's."""
        from vllm.renderers.hf import _template_error_reason, resolve_chat_template_kwargs

        template = self._hf.chat_template
        if not template:
            raise InvalidRequest("this model has no chat template: use /v1/completions", field="messages")
        kwargs = dict(template_kwargs(None, True, False) if kwargs is None else kwargs)
        tokenize = bool(kwargs.pop("tokenize", False))
        tools = kwargs.pop("tools", None)   # vLLM's `safe_apply_chat_template` takes them apart
        kwargs.pop("chat_template", None)
        resolved = vllm_checked(lambda: resolve_chat_template_kwargs(self._hf, template, kwargs))
        if tokenize:
            resolved.setdefault("return_dict", False)
        try:
            return self._hf.apply_chat_template(messages, tools=tools, chat_template=template, tokenize=tokenize,
                                                **resolved)
        except Exception as error:   # vLLM answers any template failure as the request's 400, with its reason
            raise InvalidRequest(_template_error_reason(error)) from error

    def tokenize_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                      continue_final_message: bool = False, add_special_tokens: bool = False,
                      kwargs: dict | None = None) -> list[int]:
        """`/tokenize`'s ids of a chat: the template's text, tokenized (special tokens only those
        the template writes, unless `add_special_tokens`: vLLM's rendering); `kwargs`, the
        template's arguments when the request gave more than the two flags
        (`router.openai_prompt.template_kwargs`)."""
        if kwargs is None:
            kwargs = template_kwargs(None, add_generation_prompt, continue_final_message)
        rendered = self.apply_template(messages, kwargs)
        return rendered if isinstance(rendered, list) else self.tokenize(rendered, add_special_tokens)

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """`/tokenize`'s ids: the tokenizer's, an empty text included (vLLM's)."""
        return self._fast.encode(text, add_special_tokens=add_special_tokens).ids

    def token_strings(self, token_ids: list[int]) -> list[str]:
        """The vocabulary's strings of `token_ids` (vLLM's `return_token_strs`)."""
        return self._hf.convert_ids_to_tokens(token_ids)

    def check_ids(self, token_ids: list[int]) -> None:
        if not token_ids or (min(token_ids) >= 0 and max(token_ids) < self.vocab_size):
            return
        bad = next(t for t in token_ids if not 0 <= t < self.vocab_size)
        raise InvalidRequest(f"token id {bad} is outside the vocabulary [0, {self.vocab_size})", field="token_ids")

    def check_bad_words(self, sampling: Sampling) -> None:
        """vLLM's check of `bad_words` against the model's tokenizer (`update_from_tokenizer`, which
        each engine runs again): a word that tokenizes to nothing, too many words, with vLLM's messages."""
        if sampling.bad_words:
            vllm_checked(lambda: sampling.to_vllm().update_from_tokenizer(self._hf))

    def output_text(self, prompt_token_ids: list[int], sampling: Sampling) -> OutputText:
        """The output text of one request, as vLLM makes it (`router.output_text`)."""
        return OutputText(self._hf, prompt_token_ids, sampling)
