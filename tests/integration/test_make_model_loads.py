"""vLLM (CPU) loads the `tiny` checkpoint from `pdserve make-model` and generates from it greedily.

The engine runs in a child process (this file run as a script, under the `__main__` guard vLLM's
spawned workers need), so the pytest process never holds an engine; vLLM's engine core runs in that
child's own process (VLLM_ENABLE_V1_MULTIPROCESSING=0), not in a second one that would import vLLM
again: what is tested is the checkpoint, not vLLM's process layout. One engine, about 20 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROMPTS = ["The river carried the boat", "In the beginning", "The river carried the boat"]
CHAT = [{"role": "user", "content": "Hello there"}]
MAX_TOKENS = 16
RESULT_PREFIX = "MAKE_MODEL_RESULT "
REPO = Path(__file__).resolve().parents[2]


def load_and_generate(model_dir: str) -> dict:
    """Start one vLLM engine on `model_dir`; greedy-generate for PROMPTS and CHAT."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, dtype="bfloat16", enforce_eager=True, block_size=32,
              kv_cache_memory_bytes=256 << 20, max_model_len=2048, seed=0)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outputs = llm.generate(PROMPTS, greedy)
    chat = llm.chat(CHAT, greedy)[0]
    return {
        "prompt_ids": [list(out.prompt_token_ids) for out in outputs],
        "output_ids": [list(out.outputs[0].token_ids) for out in outputs],
        "texts": [out.outputs[0].text for out in outputs],
        "chat_prompt_ids": list(chat.prompt_token_ids),
        "chat_output_ids": list(chat.outputs[0].token_ids),
    }


def transformers_greedy_ids(model_dir: Path, prompt: str, max_tokens: int) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16)
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_tokens, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


@pytest.mark.integration
def test_vllm_loads_tiny_model_and_generates_greedily(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from pdserve.make_model import build_model

    model_dir = build_model("tiny", tmp_path / "tiny")
    child = subprocess.run([sys.executable, __file__, str(model_dir)], cwd=REPO, capture_output=True, text=True,
                           timeout=600, env=os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    lines = [line for line in child.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    assert child.returncode == 0 and lines, child.stderr[-4000:]
    result = json.loads(lines[-1][len(RESULT_PREFIX):])

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    assert result["prompt_ids"] == [tokenizer(p)["input_ids"] for p in PROMPTS]  # BOS first, same ids
    for ids, text in zip(result["output_ids"], result["texts"], strict=True):
        assert len(ids) == MAX_TOKENS and all(5 <= i < 2048 for i in ids)  # never a special token
        assert len(set(ids)) >= MAX_TOKENS // 2, f"greedy output is degenerate: {ids}"
        assert text
    assert result["output_ids"][0] == result["output_ids"][2]  # greedy is deterministic
    assert result["output_ids"][0][:8] == transformers_greedy_ids(model_dir, PROMPTS[0], 8)

    chat_text = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert result["chat_prompt_ids"] == tokenizer(chat_text, add_special_tokens=False)["input_ids"]
    assert result["chat_prompt_ids"][:2] == [0, 2]  # one BOS, then <|start_header_id|>
    assert len(result["chat_output_ids"]) == MAX_TOKENS


if __name__ == "__main__":
    print(RESULT_PREFIX + json.dumps(load_and_generate(sys.argv[1])), flush=True)
