"""Text prompts of an exact token length, for servers that take text only (strict OpenAI servers,
chat completions): random token ids decoded to text with the model's tokenizer, as
`vllm bench serve --dataset-name random` makes them.

The ids are drawn from `text_safe_ids`: vLLM's choice (the vocabulary less special tokens) less
the tokens whose own text is not valid UTF-8 (a lone byte of a multi-byte character in a
byte-level vocabulary). Any sequence of them decodes to text that encodes back to the same
characters, so only merges across token boundaries change the count, which the loop below
corrects; with lone bytes in the mix, replacement characters made one in nine prompts of the
`tiny` model miss their length.

Decoding N ids and encoding the text again need not give N tokens (a tokenizer may merge across
the old boundaries), so `exact_length_text` repeats vLLM's `gen_prompt_decode_to_target_len`:
decode, re-encode (without special tokens), truncate when too long or append random ids when too
short, at most `max_retry` times. The returned ids are what the text encodes to, so a request's
recorded prompt length is the text's true token count even in the rare case the retries run out.
The server may add its own special tokens (a BOS token, the chat template) on top, as in vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np


class Tokenizer(Protocol):
    """What is used of a Hugging Face tokenizer."""

    vocab_size: int
    all_special_ids: list[int]

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def batch_decode(self, sequences: Sequence[Sequence[int]]) -> list[str]: ...


def text_safe_ids(tokenizer: Tokenizer, low: int = 0, high: int | None = None) -> np.ndarray:
    """The ids in [low, min(high, vocab_size)) that are not special (nor added tokens) and whose
    own text is valid: no U+FFFD replacement character. Raises ValueError when none is left."""
    stop = tokenizer.vocab_size if high is None else min(high, tokenizer.vocab_size)
    candidates = range(low, stop)
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    texts = tokenizer.batch_decode([[i] for i in candidates])
    safe = np.array([i for i, text in zip(candidates, texts) if i not in special and "\ufffd" not in text], dtype=np.int64)
    if safe.size == 0:
        raise ValueError(f"no token id in [{low}, {stop}) decodes to valid text: widen --token-id-range")
    return safe


def exact_length_text(tokenizer: Tokenizer, token_ids: Sequence[int], draw: Callable[[int], list[int]],
                      max_retry: int = 10) -> tuple[str, tuple[int, ...]]:
    """(text, the ids `text` encodes to) for a target length of len(token_ids); `draw(k)` gives the
    k ids appended when the text re-encodes short."""
    target = len(token_ids)
    ids = list(token_ids)
    for attempt in range(max_retry + 1):
        text = tokenizer.decode(ids)
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        if len(ids) == target or attempt == max_retry:
            break
        if len(ids) > target:
            ids = ids[:target]
        else:
            ids += draw(target - len(ids))
    return text, tuple(int(i) for i in ids)


def load_tokenizer(name_or_path: str) -> Any:
    """A Hugging Face tokenizer by hub id or local directory (the model's, usually)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as missing:
        raise ValueError(f"cannot load tokenizer {name_or_path!r} ({missing}): pass --tokenizer with a "
                         "Hugging Face id or a local model directory") from missing
