"""The byte-level BPE tokenizer `pdserve make-model` trains on the shipped corpus, and its HF files.

Contracts:
- `train_tokenizer` is deterministic: the same texts and vocab size give the same `tokenizer.json`;
- the vocabulary has exactly `vocab_size` entries, special tokens first (ids 0..4, in
  `SPECIAL_TOKENS` order), then the 256 byte symbols, then merges; any text, in any script,
  encodes (byte fallback is built in) and decodes back to itself;
- encoding adds `<|begin_of_text|>` in front (as Llama 3 does); the chat template adds it too, so
  chat prompts are tokenized with add_special_tokens=False (vLLM's default for chat).
"""

from __future__ import annotations

from collections.abc import Sequence

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"
EOT_TOKEN = "<|eot_id|>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, "<|start_header_id|>", "<|end_header_id|>", EOT_TOKEN)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


class CorpusTooSmallError(ValueError):
    """BPE ran out of pairs to merge before reaching the requested vocabulary size."""


def train_tokenizer(texts: Sequence[str], vocab_size: int):
    """A byte-level BPE `tokenizers.Tokenizer` with exactly `vocab_size` tokens, trained on `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(texts), trainer=trainer)
    if tokenizer.get_vocab_size() != vocab_size:
        raise CorpusTooSmallError(
            f"the corpus yields only {tokenizer.get_vocab_size()} BPE tokens, fewer than vocab_size "
            f"{vocab_size}: add text to pdserve/corpus/*.txt or choose a smaller vocab_size"
        )
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    tokenizer.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single=f"{BOS_TOKEN}:0 $A:0",
            pair=f"{BOS_TOKEN}:0 $A:0 {BOS_TOKEN}:1 $B:1",
            special_tokens=[(BOS_TOKEN, bos_id)],
        ),
    ])
    return tokenizer


def tokenizer_config(tokenizer, max_length: int) -> dict:
    """The `tokenizer_config.json` a Hugging Face loader reads beside `tokenizer.json`."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
        "model_input_names": ["input_ids", "attention_mask"],
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(tokenizer.token_to_id(token)): {
                "content": token, "lstrip": False, "normalized": False, "rstrip": False,
                "single_word": False, "special": True,
            }
            for token in SPECIAL_TOKENS
        },
    }


def special_tokens_map() -> dict:
    """The `special_tokens_map.json` contents."""
    return {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN}
