"""SIGTERM drains a worker: what it accepted is finished before its engine stops.

One cluster (1 prefill + 1 decode, 30 s KV lease); the tests run in order and each ends a worker.
The RPCs go to the workers directly, so each test controls exactly what is in flight at SIGTERM.
"""

from __future__ import annotations

import contextlib
import time

import pytest
import redis

from pdserve.keys import worker_key
from pdserve.v1 import generation_pb2, worker_pb2, worker_pb2_grpc

from cluster_helpers import start_cluster

pytestmark = pytest.mark.integration

LEASE_S = 30.0
PROMPT = 8  # index into the shared prompts: 96 tokens, 3 KV blocks


@pytest.fixture(scope="module")
def cluster(tiny_model, tmp_path_factory, reference_outputs):
    cluster = start_cluster(tiny_model, tmp_path_factory.mktemp("drain"), "tcp", lease_s=LEASE_S)
    yield cluster
    cluster.stop()


@contextlib.contextmanager
def stub(cluster, worker_id: str):
    with cluster.worker_channel(worker_id) as channel:
        yield worker_pb2_grpc.WorkerStub(channel)


def greedy(max_tokens: int) -> generation_pb2.SamplingParams:
    return generation_pb2.SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)


def registered(cluster, worker_id: str) -> bool:
    return bool(redis.Redis.from_url(cluster.redis.client_url).exists(worker_key("default", worker_id)))


def test_a_prefill_worker_given_sigterm_keeps_serving_its_leased_kv_until_decode_pulls_it(cluster, prompts,
                                                                                         reference_outputs):
    prefill_id, decode_id = cluster.worker_ids("prefill")[0], cluster.worker_ids("decode")[0]
    prompt, expected = prompts[PROMPT]["token_ids"], reference_outputs[PROMPT]
    with stub(cluster, prefill_id) as prefill:
        prefilled = prefill.Prefill(worker_pb2.PrefillRequest(
            request_id="drain-prefill", prompt_token_ids=prompt, sampling=greedy(len(expected)),
            transfer_id="drain-transfer"), timeout=60)
    assert prefilled.kv_transfer_params_json and not prefilled.finished

    process = cluster.workers[prefill_id]
    process.terminate()              # SIGTERM; nothing in flight: only the lease keeps it
    # vLLM gives its engine 5 s to stop, then kills it: a worker that waited for in-flight requests
    # alone has lost its KV server by now
    time.sleep(8.0)
    assert process.alive(), f"exited with {process.returncode} before its KV was pulled"
    assert not registered(cluster, prefill_id)  # no new work comes its way

    with stub(cluster, decode_id) as decode:
        replies = list(decode.Decode(worker_pb2.DecodeRequest(
            request_id="drain-decode", prompt_token_ids=prompt + [prefilled.first_token_id],
            sampling=greedy(len(expected) - 1), kv_transfer_params_json=prefilled.kv_transfer_params_json),
            timeout=60))
    tokens = [prefilled.first_token_id] + [t for reply in replies for t in reply.token_ids]
    assert tokens == expected
    assert (replies[-1].kv_load_error, replies[-1].kv_transfer_blocks) == ("", 3)  # pulled, not recomputed
    pulled_s = time.monotonic()
    assert process.wait(timeout_s=20) == 0
    assert time.monotonic() - pulled_s < LEASE_S / 2  # it left once the KV was pulled, not at lease expiry


def test_a_decode_worker_given_sigterm_mid_stream_finishes_the_stream(cluster, prompts, reference_outputs):
    decode_id = cluster.worker_ids("decode")[0]
    prompt, expected = prompts[PROMPT]["token_ids"], reference_outputs[PROMPT]
    max_tokens = 600
    process = cluster.workers[decode_id]
    with stub(cluster, decode_id) as decode:
        stream = decode.Decode(worker_pb2.DecodeRequest(
            request_id="drain-stream", prompt_token_ids=prompt, sampling=greedy(max_tokens)), timeout=120)
        replies = [next(stream)]
        process.terminate()
        time.sleep(0.5)
        assert not registered(cluster, decode_id)   # out of the registry while the stream goes on
        replies += list(stream)
    tokens = [t for reply in replies for t in reply.token_ids]
    assert (len(tokens), replies[-1].finish_reason) == (max_tokens, "length")
    assert tokens[:len(expected)] == expected
    assert process.wait(timeout_s=30) == 0
