"""What a built checkpoint holds: the Llama config, the seeded bf16 weights, and a tokenizer HF loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pdserve.corpus import read_corpus
from pdserve.corpus.bpe import SPECIAL_TOKENS, CorpusTooSmallError, train_tokenizer
from pdserve.make_model import SPECS, ModelSpec, build_model, draw_weight, file_sha256

# Pinned: a change means every existing tiny checkpoint differs; bump BUILD_FORMAT and update this.
TINY_SAFETENSORS_SHA256 = "6d8c6b84bafeb516c22651514c7c2d42b71c6372bd0c1cf66bfea225ddadb66f"
ROUND_TRIP_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces,\ttabs\nand new lines\r\n",
    "naïve café, Straße, 日本語のテキスト, emoji 🚀🔥, العربية",
    "def f(x: int) -> int:\n    return x ** 2  # 12345678901234567890\n",
    "angle <brackets> and |pipes| and {braces} [1, 2, 3]",
    "",
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model("tiny", tmp_path_factory.mktemp("tiny") / "model")


def test_config_is_the_tiny_llama_the_brief_asks_for(tiny_dir: Path) -> None:
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert {k: config[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                   "num_key_value_heads", "intermediate_size", "vocab_size",
                                   "max_position_embeddings", "head_dim")} == {
        "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 512, "vocab_size": 2048, "max_position_embeddings": 2048, "head_dim": 64}
    assert (config["dtype"], config["tie_word_embeddings"], config["rope_theta"], config["rms_norm_eps"]) == (
        "bfloat16", False, 10000.0, 1e-5)
    assert (config["bos_token_id"], config["eos_token_id"]) == (0, 1)
    generation = json.loads((tiny_dir / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 0, "eos_token_id": [1, 4]}


def test_weights_are_the_bf16_rounding_of_the_seeded_normal_draws(tiny_dir: Path) -> None:
    spec, tensors = SPECS["tiny"], load_file(tiny_dir / "model.safetensors")
    shapes = spec.weight_shapes()
    assert [(name, tuple(tensors[name].shape)) for name, _ in shapes] == shapes
    assert len(tensors) == 39 and {t.dtype for t in tensors.values()} == {torch.bfloat16}
    for index in (1, 2, 4, 9):  # a norm, q_proj, v_proj, down_proj of layer 0
        name, shape = shapes[index]
        expected = torch.from_numpy(draw_weight(spec, 0, index, name, shape)).to(torch.bfloat16)
        assert torch.equal(tensors[name], expected), name
    assert file_sha256(tiny_dir / "model.safetensors") == TINY_SAFETENSORS_SHA256


def test_weight_scales_follow_the_spec(tiny_dir: Path) -> None:
    tensors = {name: t.float() for name, t in load_file(tiny_dir / "model.safetensors").items()}
    assert torch.equal(tensors["model.norm.weight"], torch.ones(256))
    assert tensors["model.embed_tokens.weight"].std().item() == pytest.approx(1.0, abs=0.01)
    assert tensors["model.layers.0.mlp.up_proj.weight"].std().item() == pytest.approx(0.02, abs=0.001)
    assert tensors["model.layers.0.mlp.down_proj.weight"].std().item() == pytest.approx(0.02 / 8**0.5, abs=0.0005)


def test_special_tokens_can_never_be_the_greedy_choice(tiny_dir: Path) -> None:
    lm_head = load_file(tiny_dir / "model.safetensors")["lm_head.weight"]
    assert torch.count_nonzero(lm_head[:5]).item() == 0
    assert torch.count_nonzero(lm_head[5:]).item() == 2043 * 256


def test_transformers_loads_the_tokenizer_and_it_round_trips_text(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dir))
    assert len(tokenizer) == 2048
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert (tokenizer.bos_token, tokenizer.eos_token) == SPECIAL_TOKENS[:2]
    for text in ROUND_TRIP_TEXTS:
        ids = tokenizer(text)["input_ids"]
        assert ids[0] == 0 and max(ids) < 2048
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer("a<|eot_id|>b", add_special_tokens=False)["input_ids"][1] == 4  # as chat templates need


def test_common_words_are_single_tokens(tiny_dir: Path) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    encoding = tokenizer.encode("The river and the sea")
    assert encoding.tokens == ["<|begin_of_text|>", "The", "Ġriver", "Ġand", "Ġthe", "Ġsea"]


def test_chat_template_renders_llama3_style_headers(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dir))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_corpus_trains_the_bench_vocabulary_exactly() -> None:
    tokenizer = train_tokenizer(read_corpus(), SPECS["bench"].vocab_size)
    assert tokenizer.get_vocab_size() == 8192
    with pytest.raises(CorpusTooSmallError, match="add text to pdserve/corpus"):
        train_tokenizer(["a tiny corpus"], 8192)


def test_bench_spec_fits_8k_prompts() -> None:
    bench = SPECS["bench"]
    assert (bench.num_layers, bench.hidden_size, bench.num_attention_heads, bench.num_kv_heads) == (12, 768, 12, 4)
    assert bench.max_position_embeddings >= 8192 + 1024
    assert bench.num_params == 88_099_584


@pytest.mark.parametrize(("changes", "message"), [
    ({"hidden_size": 250}, "must split into 4 heads of an even size"),
    ({"num_kv_heads": 3}, "must be a multiple of num_kv_heads 3"),
    ({"vocab_size": 200}, "leaves no room for BPE merges"),
    ({"num_layers": 0}, "ModelSpec.num_layers must be positive, got 0"),
])
def test_invalid_specs_say_how_to_fix_them(changes: dict, message: str) -> None:
    fields = {"name": "x", "num_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "num_kv_heads": 2,
              "intermediate_size": 512, "vocab_size": 1024, "max_position_embeddings": 512}
    with pytest.raises(ValueError, match=message):
        ModelSpec(**{**fields, **changes})
