"""Prefill -> KV transfer -> decode produces vLLM's own tokens, and the KV really travelled."""

from __future__ import annotations

import pytest

from pdserve.client import Client

from cluster_helpers import blocks_for, kv_bytes_per_block, wait_until_idle, worker_load

pytestmark = pytest.mark.integration


def test_greedy_tokens_match_colocated_vllm_and_the_prompt_kv_was_loaded(cluster, tiny_model, prompts,
                                                                       reference_outputs):
    decode_id = cluster.worker_ids("decode")[0]
    before = worker_load(cluster, decode_id)
    bytes_per_block = kv_bytes_per_block(tiny_model)
    with Client(cluster.grpc_target) as client:
        for prompt, expected in zip(prompts, reference_outputs):
            chunks = list(client.generate(token_ids=prompt["token_ids"], max_tokens=prompt["max_tokens"],
                                          temperature=0, ignore_eos=True))
            tokens = [t for chunk in chunks for t in chunk.token_ids]
            timings = chunks[-1].timings
            num_prompt = len(prompt["token_ids"])
            assert tokens == expected, f"prompt of {num_prompt} tokens"
            assert timings.disaggregated and timings.output_tokens == len(expected)
            # the decode engine computed only the first token, which prefill sampled
            assert timings.decode_computed_prompt_tokens == 1, f"prompt of {num_prompt} tokens"
            assert timings.kv_transfer_blocks == blocks_for(num_prompt)
            assert timings.kv_transfer_bytes == blocks_for(num_prompt) * bytes_per_block
    after = worker_load(cluster, decode_id)
    # vLLM's own counters agree: one computed token per request, every other prompt token loaded
    assert after.prompt_tokens_computed - before.prompt_tokens_computed == len(prompts)
    assert after.prompt_tokens_external - before.prompt_tokens_external == sum(len(p["token_ids"]) for p in prompts)


def test_no_kv_block_or_transfer_is_left_after_the_run(cluster):
    loads = wait_until_idle(cluster)
    assert {w: (l.kv_blocks_used, l.pending_transfers) for w, l in loads.items()} == {w: (0, 0) for w in loads}
    assert all(l.kv_blocks_total > 0 for l in loads.values())
