"""The router tokenizes once and makes the output text (`router.output_text`); workers see token ids only."""

from __future__ import annotations

import json
from pathlib import Path

from pdserve.errors import InvalidRequest
from pdserve.sampling import Sampling
from router.output_text import OutputText


class RouterTokenizer:
    def __init__(self, model_dir: str):
        from transformers import AutoTokenizer

        self._hf = AutoTokenizer.from_pretrained(model_dir)
        self._fast = self._hf.backend_tokenizer
        self.eos_token_id = self._hf.eos_token_id
        config = json.loads((Path(model_dir) / "config.json").read_text())
        self.vocab_size = int(config.get("vocab_size", len(self._hf)))

    def encode(self, text: str) -> list[int]:
        """Token ids of a prompt; an empty prompt is the client's error, not a lone BOS token."""
        if not text:
            raise InvalidRequest("the prompt is empty", field="prompt")
        return self._fast.encode(text).ids

    def render_chat(self, messages: list[dict]) -> list[int]:
        if not self._hf.chat_template:
            raise InvalidRequest("this model has no chat template: use /v1/completions", field="messages")
        try:
            return list(self._hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                     return_dict=False))
        except (KeyError, TypeError, ValueError) as error:
            raise InvalidRequest(f"messages could not be rendered: {error}", field="messages") from error

    def check_ids(self, token_ids: list[int]) -> None:
        if not token_ids or (min(token_ids) >= 0 and max(token_ids) < self.vocab_size):
            return
        bad = next(t for t in token_ids if not 0 <= t < self.vocab_size)
        raise InvalidRequest(f"token id {bad} is outside the vocabulary [0, {self.vocab_size})", field="token_ids")

    def output_text(self, prompt_token_ids: list[int], sampling: Sampling) -> OutputText:
        """The output text of one request, as vLLM makes it (`router.output_text`)."""
        return OutputText(self._hf, prompt_token_ids, sampling)
