"""The shared-memory transport in a real cluster: segments live exactly as long as their engines."""

from __future__ import annotations

import os
import time

import pytest

from pdserve.client import Client
from pdserve.engine_step_trace import read_joins, read_steps, trace_files

from cluster_helpers import kv_segments_of, wait_until_idle

pytestmark = pytest.mark.integration


def _served(cluster, first_token: int) -> list[int]:
    """Tokens, KV blocks moved and prompt tokens the decode engine computed for a 100-token prompt
    (`first_token` differs per call, so no prompt is in the decode engine's prefix cache)."""
    prompt = [first_token] + list(range(10, 109))
    with Client(cluster.grpc_target) as client:
        chunks = list(client.generate(token_ids=prompt, max_tokens=4, temperature=0, ignore_eos=True))
    timings = chunks[-1].timings
    return [sum(len(c.token_ids) for c in chunks), timings.kv_transfer_blocks, timings.decode_computed_prompt_tokens]


def test_a_killed_producers_segment_is_freed_at_once(shm_cluster):
    """SIGKILL leaves the engine no chance to unlink its cache: the supervisor that saw it die
    sweeps once its processes are gone (best effort: they may still be exiting), and the next
    producer's start sweeps for certain. (That none outlives the cluster: the shm_cluster
    fixture asserts it when the session's cluster stops.)"""
    cluster = shm_cluster
    first = kv_segments_of(cluster, cluster.worker_ids("prefill")[0])
    assert len(first) == 1  # the prefill engine's cache lives in shared memory
    assert _served(cluster, 200) == [4, 4, 1]  # 100 prompt tokens: 4 blocks read from the segment
    assert first <= kv_segments_of(cluster, cluster.worker_ids("decode")[0])  # mapped to read
    cluster.kill_worker(cluster.worker_ids("prefill")[0])  # SIGKILL: the engine unlinks nothing
    second = kv_segments_of(cluster, cluster.add_worker("prefill"))  # its start sweeps dead owners' segments
    assert len(second) == 1 and not second & first
    assert not any(os.path.exists(path) for path in first)
    for first_token in range(300, 400):  # the router drops the dead worker within its registry lease
        try:
            assert _served(cluster, first_token) == [4, 4, 1]
            break
        except AssertionError:
            if first_token == 399:
                raise
            time.sleep(0.3)
    decode_id = cluster.worker_ids("decode")[0]
    deadline = time.monotonic() + 10  # the consumer lets go of the dead producer's map
    while kv_segments_of(cluster, decode_id) & first and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not kv_segments_of(cluster, decode_id) & first
    wait_until_idle(cluster)


def test_a_pull_does_not_wait_for_the_producers_next_prefill(shm_cluster):
    """With prefills queued on the producer, a consumer's pull used to wait one whole prefill for
    its lease (granted with the engine's next step); the scheduler half now grants it at once
    (kv_transfer.grants). Margin: a pull moves ~3 MiB here, a prefill computes 1,500 tokens."""
    from concurrent.futures import ThreadPoolExecutor
    import statistics

    def one(i: int):
        with Client(shm_cluster.grpc_target) as client:
            prompt = [200 + i] + [10 + (i * 31 + k * 7) % 1800 for k in range(1499)]
            return list(client.generate(token_ids=prompt, max_tokens=4, ignore_eos=True))[-1].timings

    with ThreadPoolExecutor(8) as pool:
        timings = list(pool.map(one, range(16)))
    transfer_s = sorted(t.kv_transfer_s for t in timings)
    prefill_s = statistics.median(t.prefill_s for t in timings)   # compute, without its queue
    assert all(t.disaggregated and t.kv_transfer_blocks for t in timings)
    assert transfer_s[len(transfer_s) // 2] < 0.25 * prefill_s, (transfer_s, prefill_s)


def test_a_pulled_requests_way_into_the_decode_engine_is_traced(shm_cluster, shm_trace_dir):
    """The decode engine's join trace stamps a pulled request in the order it happens: its front
    end accepted it, the scheduler took it in, the pull was reported done, its first step ran; that
    step is in the step trace, as a join computing the prompt's last token."""
    decode_id = shm_cluster.worker_ids("decode")[0]

    def joins():
        return [j for path in trace_files(shm_trace_dir, decode_id, "joins") for j in read_joins(path)]

    before = {j.request_id for j in joins()}
    assert _served(shm_cluster, 600) == [4, 4, 1]
    wait_until_idle(shm_cluster)   # the trace is flushed whenever the engine runs out of work
    new = [j for j in joins() if j.request_id not in before]
    assert len(new) == 1, new
    join = new[0]
    assert join.pulled and join.prompt_tokens >= 100
    assert join.accepted_s <= join.arrived_s <= join.pulled_s <= join.start_s < join.end_s
    steps = [s for path in trace_files(shm_trace_dir, decode_id) for s in read_steps(path)]
    (its_step,) = [s for s in steps if abs(s.start_s - join.start_s) < 1e-5]
    assert its_step.joined == 1 and its_step.only_decodes
