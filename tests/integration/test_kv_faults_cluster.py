"""Transfer faults injected into a real cluster's KV pulls still give vLLM's own greedy tokens:
the broken blocks are recomputed, nothing is left pinned (kv_transfer.faults, kv_transfer.checksum)."""

from __future__ import annotations

import pytest

from kv_transfer.faults import FAULTS_ENV
from pdserve.client import Client

from cluster_helpers import blocks_for, start_cluster, wait_until_idle

pytestmark = pytest.mark.integration


def test_flipped_bytes_and_a_dropped_connection_cost_a_recompute_not_a_wrong_token(
        tiny_model, prompts, reference_outputs, tmp_path, monkeypatch):
    """The decode worker flips a byte of its first pull (a checksum mismatch: those blocks are
    recomputed, the prefix before them kept); the prefill worker drops the connection mid-block in
    its second send (the pull fails: the whole prompt is recomputed). Every token as colocated vLLM's."""
    monkeypatch.setenv(FAULTS_ENV, "flip_bytes@1,drop_connection_mid_block@2,seed=5")   # both workers inherit it
    cluster = start_cluster(tiny_model, tmp_path, "tcp")
    try:
        by_length = {len(p["token_ids"]): (p, expected) for p, expected in zip(prompts, reference_outputs)}
        chosen = [by_length[n] for n in (200, 257, 100, 1000)]   # the first two pulls break
        moved = []
        with Client(cluster.grpc_target) as client:
            for prompt, expected in chosen:
                chunks = list(client.generate(token_ids=prompt["token_ids"], max_tokens=prompt["max_tokens"],
                                              temperature=0, ignore_eos=True))
                assert [t for chunk in chunks for t in chunk.token_ids] == expected, \
                    f"prompt of {len(prompt['token_ids'])} tokens"
                moved.append(chunks[-1].timings.kv_transfer_blocks)
        assert moved == [0, 0, blocks_for(100), blocks_for(1000)]   # the broken pulls report no block loaded
        decode_log = (tmp_path / f"{cluster.worker_ids('decode')[0]}.log").read_text()
        assert decode_log.count("arrived with a wrong checksum") == 1            # vLLM recomputed from it
        assert decode_log.count("failed, the prompt will be recomputed") == 1   # the dropped connection
        loads = wait_until_idle(cluster)
        assert {w: (l.kv_blocks_used, l.pending_transfers) for w, l in loads.items()} == {w: (0, 0) for w in loads}
    finally:
        cluster.stop()
