"""Helpers shared by the KV transfer tests."""

import json

import pytest
import torch
from safetensors.torch import save_file


def _write_checkpoint(directory, seed=0, config_extra=None):
    """A small Llama-style checkpoint directory: config.json, two safetensors shards, a tokenizer."""
    directory.mkdir(parents=True)
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
              "num_key_value_heads": 2, "_name_or_path": str(directory), **(config_extra or {})}
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    generator = torch.Generator().manual_seed(seed)
    save_file({"model.embed_tokens.weight": torch.randn(256, 64, generator=generator),
               "model.norm.weight": torch.ones(64)}, str(directory / "model-00001-of-00002.safetensors"))
    save_file({"lm_head.weight": torch.randn(256, 64, generator=generator)},
              str(directory / "model-00002-of-00002.safetensors"))
    (directory / "tokenizer.json").write_text("{}")
    return directory


@pytest.fixture
def make_checkpoint():
    """`make_checkpoint(directory, seed=0, config_extra=None) -> directory`"""
    return _write_checkpoint
