"""Workers killed with SIGKILL: leases lapse, the router routes around them, no request is lost,
and with no decode worker left requests fail fast instead of hanging.

The tests run in order on one cluster (1 prefill + 2 decode, 2 s registry TTL, 3 s KV lease): each
kills what the next one needs dead; a decode worker is added back, and the prefill worker is killed
under load last."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from threading import Event

import httpx
import pytest
import redis

from pdserve.client import Client, NoHealthyWorker
from pdserve.keys import worker_key
from pdserve.v1 import generation_pb2, worker_pb2, worker_pb2_grpc

from cluster_helpers import start_cluster, wait_for_workers, wait_until_idle, worker_load

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

TTL_S = 2.0
LEASE_S = 3.0
QUARANTINE_S = 5.0  # the router's default for a worker whose RPC failed
KILLED: dict[str, str] = {}  # what one test killed, for the next (the tests run in order)
KILLED_AT_S: dict[str, float] = {}
GONE_AT_S: dict[str, Future] = {}


@pytest.fixture(scope="module")
def cluster(tiny_model, tmp_path_factory):
    cluster = start_cluster(tiny_model, tmp_path_factory.mktemp("chaos"), "tcp", num_decode=2, ttl_s=TTL_S,
                            lease_s=LEASE_S)
    yield cluster
    cluster.stop()


def _registered(cluster, worker_id: str) -> bool:
    return bool(redis.Redis.from_url(cluster.redis.client_url).exists(worker_key("default", worker_id)))


def _watch_registry_until_gone(cluster, worker_id: str) -> Future:
    """Polls the registry from now on; the future holds the moment `worker_id`'s key was gone."""
    def watch() -> float:
        while _registered(cluster, worker_id):
            time.sleep(0.05)
        return time.monotonic()

    return ThreadPoolExecutor(1).submit(watch)


def test_kv_nobody_pulls_is_freed_when_its_lease_expires(cluster):
    prefill_id = cluster.worker_ids("prefill")[0]
    with cluster.worker_channel(prefill_id) as channel:
        sampling = generation_pb2.SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
        reply = worker_pb2_grpc.WorkerStub(channel).Prefill(worker_pb2.PrefillRequest(
            request_id="orphan", prompt_token_ids=list(range(10, 74)), sampling=sampling, transfer_id="orphan"))
    assert reply.kv_transfer_params_json  # held for a consumer that never comes (as if it died)
    time.sleep(1.2)
    assert worker_load(cluster, prefill_id).kv_blocks_used == 2
    loads = wait_until_idle(cluster, timeout_s=LEASE_S + 5)
    assert loads[prefill_id].kv_blocks_used == 0


def test_a_request_survives_its_decode_worker_being_killed_mid_stream_with_the_same_tokens(cluster):
    """Seeded, with a presence penalty: the resumed decode skips the draws already taken and counts
    the tokens already sent as outputs, so the client gets exactly the unbroken run's tokens."""
    sampling = dict(max_tokens=1500, temperature=1.0, top_p=0.95, seed=2024, presence_penalty=0.4, ignore_eos=True)
    prompt = "Keep going no matter what."
    with Client(cluster.grpc_target) as client:
        unbroken = [t for chunk in client.generate(prompt, **sampling) for t in chunk.token_ids]
        stream = client.generate(prompt, **sampling)
        chunks = [next(stream) for _ in range(5)]
        serving = [w for w in cluster.worker_ids("decode") if worker_load(cluster, w).num_running > 0]
        assert len(serving) == 1
        cluster.kill_worker(serving[0])
        KILLED["decode"], KILLED_AT_S["decode"] = serving[0], time.monotonic()
        GONE_AT_S["decode"] = _watch_registry_until_gone(cluster, serving[0])
        chunks += list(stream)
    timings = chunks[-1].timings
    assert len(unbroken) == 1500 and chunks[-1].finish_reason == "length"
    assert [t for chunk in chunks for t in chunk.token_ids] == unbroken
    assert timings.decode_worker != serving[0]


def test_the_killed_worker_leaves_the_registry_within_its_ttl_and_gets_no_more_work(cluster):
    killed, killed_at_s = KILLED["decode"], KILLED_AT_S["decode"]
    gone_at_s = GONE_AT_S["decode"].result(timeout=TTL_S + 5.0)  # watched since the kill
    assert not _registered(cluster, killed)
    assert gone_at_s - killed_at_s <= TTL_S + 1.0  # the lease lapsed: TTL, plus Redis's expiry cycle and the poll
    # The router also quarantined it when its stream broke; once that lapses only the registry
    # keeps it away.
    time.sleep(max(0.0, killed_at_s + QUARANTINE_S + 0.5 - time.monotonic()))
    survivor = cluster.worker_ids("decode")[0]
    with Client(cluster.grpc_target) as client:
        assert client.model_info().num_decode_workers == 1
        used = {list(client.generate("where do I go?", max_tokens=3, ignore_eos=True))[-1].timings.decode_worker
                for _ in range(5)}
    assert used == {survivor}


def test_with_no_decode_worker_alive_requests_fail_fast_and_cost_the_prefill_worker_nothing(cluster):
    prefill_id = cluster.worker_ids("prefill")[0]
    cluster.kill_worker(cluster.worker_ids("decode")[0])
    with Client(cluster.grpc_target) as client:
        started = time.monotonic()
        with pytest.raises(NoHealthyWorker):
            list(client.generate("anyone there?", max_tokens=4))
        assert time.monotonic() - started < 5.0  # right after the kill: retried, quarantined, refused
        time.sleep(TTL_S + 0.5)
        computed_before = worker_load(cluster, prefill_id).prompt_tokens_computed
        started = time.monotonic()
        with pytest.raises(NoHealthyWorker):
            list(client.generate("anyone there?", max_tokens=4))
        assert time.monotonic() - started < 1.0
    for stream in (False, True):
        response = httpx.post(f"{cluster.http_url}/v1/completions",
                              json={"prompt": "anyone?", "max_tokens": 4, "stream": stream}, timeout=10)
        assert response.status_code == 503 and response.json()["error"]["type"] == "ServiceUnavailableError"
    assert worker_load(cluster, prefill_id).prompt_tokens_computed == computed_before  # never prefilled


def test_a_decode_worker_that_joins_gets_work_and_serves_alone_when_prefill_dies(cluster):
    joined = cluster.add_worker("decode")
    wait_for_workers(cluster, 2)
    with Client(cluster.grpc_target) as client:
        timings = list(client.generate("back in business", max_tokens=4, temperature=0, ignore_eos=True))[-1].timings
        assert timings.decode_worker == joined and timings.disaggregated


def test_a_prefill_worker_killed_under_load_costs_no_request_and_no_wrong_token(cluster, prompts, reference_outputs):
    """Long filler prompts keep the prefill worker busy; the reference prompts queue behind them.
    The prefill worker is SIGKILLed when the first filler streams: requests mid-prefill, queued on
    it, or mid-pull of its KV are retried (prefilled on the decode worker) with the reference's tokens."""
    prefill_id = cluster.worker_ids("prefill")[0]
    first_token = Event()

    def run(token_ids: list[int], max_tokens: int) -> list:
        with Client(cluster.grpc_target) as client:
            chunks = []
            for chunk in client.generate(token_ids=token_ids, max_tokens=max_tokens, temperature=0, ignore_eos=True):
                first_token.set()
                chunks.append(chunk)
            return chunks

    fillers = [[11 + (i * 7 + k) % 1500 for k in range(1000)] for i in range(6)]
    with ThreadPoolExecutor(len(fillers) + len(prompts)) as pool:
        filled = [pool.submit(run, token_ids, 4) for token_ids in fillers]
        time.sleep(0.2)
        answers = [pool.submit(run, p["token_ids"], p["max_tokens"]) for p in prompts]
        assert first_token.wait(timeout=60)
        cluster.kill_worker(prefill_id)
        results = [future.result(timeout=120) for future in answers]
        assert all(sum(len(c.token_ids) for c in future.result(timeout=120)) == 4 for future in filled)
    assert [[t for c in chunks for t in c.token_ids] for chunks in results] == reference_outputs
    assert any(not chunks[-1].timings.disaggregated for chunks in results)  # the kill took work from prefill
    with Client(cluster.grpc_target) as client:
        chunks = list(client.generate("no prefill pool left", max_tokens=4, temperature=0, ignore_eos=True))
    assert sum(len(c.token_ids) for c in chunks) == 4
    assert chunks[-1].timings.disaggregated is False
