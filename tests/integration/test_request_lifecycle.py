"""Cancel, abort and bad input on a real cluster: nothing leaks, errors are the client's and say why."""

from __future__ import annotations

import os
import time

import grpc
import httpx
import psutil
import pytest

from loadgen.proc_cpu import cpu_seconds, process_tree
from pdserve.client import Cancelled, Client, InvalidRequest
from pdserve.engine_process import REEXEC_MARK, initial_environ
from pdserve.preload import torch_libgomp
from pdserve.v1 import generation_pb2, generation_pb2_grpc, worker_pb2, worker_pb2_grpc

from cluster_helpers import wait_until_idle, worker_load

pytestmark = pytest.mark.integration

LONG_OUTPUT = 2000  # several seconds of decoding on the tiny model: a cancel cuts it short
HOLD_WINDOW_S = 1.5  # how long an engine core's CPU is read while it only holds blocks (10 ms ticks)


def _assert_idle(cluster):
    loads = wait_until_idle(cluster)
    assert {w: (l.kv_blocks_used, l.pending_transfers, l.num_running) for w, l in loads.items()} == \
        {w: (0, 0, 0) for w in loads}


def test_client_cancel_mid_stream_frees_blocks_on_both_sides(cluster):
    decode_id = cluster.worker_ids("decode")[0]
    before = worker_load(cluster, decode_id).generation_tokens
    with Client(cluster.grpc_target) as client:
        stream = client.generate("Cancel me.", max_tokens=LONG_OUTPUT, ignore_eos=True)
        received = [next(stream) for _ in range(4)]
        assert worker_load(cluster, decode_id).kv_blocks_used > 0  # the decode side holds the request
        stream.close()  # the client walks away mid-stream
    assert sum(len(c.token_ids) for c in received) >= 4
    _assert_idle(cluster)
    generated = worker_load(cluster, decode_id).generation_tokens - before
    assert generated < LONG_OUTPUT - 1, "the decode engine kept generating after the client left"


@pytest.mark.parametrize("after_s", [0.0, 0.01, 0.03, 0.06, 0.1, 0.2])
def test_a_cancel_during_prefill_or_the_kv_transfer_frees_blocks_on_both_sides(cluster, after_s):
    """A 1000-token prompt cancelled at staggered moments: in the router, during prefill, between
    prefill and decode (the KV held under a lease), during the pull, or once decoding."""
    request = generation_pb2.GenerateRequest(
        token_ids=generation_pb2.TokenIds(ids=[10 + (7 * i + int(after_s * 1000)) % 900 for i in range(1000)]),
        sampling=generation_pb2.SamplingParams(max_tokens=1000, ignore_eos=True))
    with grpc.insecure_channel(cluster.grpc_target) as channel:
        call = generation_pb2_grpc.GenerationStub(channel).Generate(request)
        time.sleep(after_s)
        call.cancel()
        with pytest.raises(grpc.RpcError) as error:
            list(call)
    assert error.value.code() == grpc.StatusCode.CANCELLED
    _assert_idle(cluster)


def test_abort_rpc_ends_the_stream_as_cancelled_and_frees_blocks(tcp_cluster):
    with Client(tcp_cluster.grpc_target) as client:
        stream = client.generate("Abort me from another thread.", max_tokens=LONG_OUTPUT, ignore_eos=True,
                                 request_id="abort-me")
        next(stream)
        assert client.abort("abort-me") is True
        with pytest.raises(Cancelled):
            for _ in stream:
                pass
        assert client.abort("abort-me") is False  # gone
    _assert_idle(tcp_cluster)


def test_prefilled_kv_nobody_pulls_is_freed_by_an_abort_naming_its_transfer(tcp_cluster):
    """The router's cancel path for a request cancelled between prefill and decode."""
    prefill_id = tcp_cluster.worker_ids("prefill")[0]
    with tcp_cluster.worker_channel(prefill_id) as channel:
        worker = worker_pb2_grpc.WorkerStub(channel)
        sampling = generation_pb2.SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
        reply = worker.Prefill(worker_pb2.PrefillRequest(request_id="orphan", prompt_token_ids=list(range(10, 110)),
                                                         sampling=sampling, transfer_id="orphan-transfer"))
        assert reply.kv_transfer_params_json and not reply.finished
        deadline = time.monotonic() + 15
        while (load := worker_load(tcp_cluster, prefill_id)).kv_blocks_used != 4 or load.num_running:
            assert time.monotonic() < deadline, f"never held alone: {load}"
            time.sleep(0.1)
        # 100 tokens, held under the lease with nothing running: CPU over a measuring window
        engine_core = process_tree(tcp_cluster.workers[prefill_id].pid)[1:]  # vLLM's engine core (uni executor)
        before_s, started = cpu_seconds(engine_core), time.monotonic()
        time.sleep(HOLD_WINDOW_S)
        holding_cores = (cpu_seconds(engine_core) - before_s) / (time.monotonic() - started)
        # While it only holds blocks the engine core waits for requests between empty steps
        # (pdserve.vllm_plugin, "Holding"); vLLM's own loop steps every millisecond: 0.29 cores on a
        # 2-vCPU Xeon, against 0.027 with the wait
        assert holding_cores < 0.1
        found = worker.Abort(worker_pb2.WorkerAbortRequest(request_id="orphan", transfer_id="orphan-transfer"))
        assert found.found is True
    _assert_idle(tcp_cluster)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"prompt": ""}, "prompt"),
        ({"token_ids": []}, "prompt"),
        ({"token_ids": [11] * 3000}, "prompt"),
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "hi", "max_tokens": -5}, "max_tokens"),
        ({"prompt": "hi", "temperature": -0.5}, "temperature"),
        ({"prompt": "hi", "top_p": 0.0}, "top_p"),
        ({"token_ids": [10**6]}, "token"),
    ],
)
def test_bad_input_over_grpc_is_invalid_argument_naming_the_field(tcp_cluster, kwargs, field):
    with Client(tcp_cluster.grpc_target) as client:
        with pytest.raises(InvalidRequest) as error:
            list(client.generate(**kwargs))
    assert field in error.value.message


def test_raw_grpc_status_for_bad_input_is_invalid_argument(tcp_cluster):
    with grpc.insecure_channel(tcp_cluster.grpc_target) as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        request = generation_pb2.GenerateRequest(text="hi", sampling=generation_pb2.SamplingParams(max_tokens=0))
        with pytest.raises(grpc.RpcError) as error:
            list(stub.Generate(request))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_tokens" in error.value.details()


@pytest.mark.parametrize(
    "body, field",
    [
        ({"prompt": "", "max_tokens": 4}, "prompt"),
        ({"prompt": "x " * 3000, "max_tokens": 4}, "prompt"),
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "hi", "max_tokens": -1}, "max_tokens"),
        ({"prompt": "hi", "temperature": -1}, "temperature"),
        ({"prompt": "hi", "max_tokens": 4, "suffix": "x"}, "suffix"),  # vLLM's, not served
        ({"max_tokens": 4}, "prompt"),
    ],
)
def test_bad_input_over_http_is_400_with_an_openai_error_naming_the_field(tcp_cluster, body, field):
    response = httpx.post(f"{tcp_cluster.http_url}/v1/completions", json=body, timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "BadRequestError" and field in error["message"]


def test_a_sampling_value_only_the_engine_refused_is_400_and_takes_no_worker_out(tcp_cluster):
    """The denial of service found by fuzzing: temperature 1e30 passed the router, the decode engine
    refused it, and the router quarantined the worker, so valid requests got 503 for seconds."""
    for _ in range(3):
        response = httpx.post(f"{tcp_cluster.http_url}/v1/completions", timeout=30,
                              json={"prompt": "hello", "max_tokens": 4, "temperature": 1e30})
        assert response.status_code == 400 and response.json()["error"]["param"] == "temperature"
        served = httpx.post(f"{tcp_cluster.http_url}/v1/completions", timeout=30,
                            json={"prompt": "hello", "max_tokens": 4, "temperature": 0, "ignore_eos": True})
        assert served.status_code == 200 and served.json()["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_worker_answers_input_its_engine_refuses_with_invalid_argument(tcp_cluster, role):
    """Behind the router's check, the worker itself maps vLLM's validation error to the client's."""
    worker_id = tcp_cluster.worker_ids(role)[0]
    sampling = generation_pb2.SamplingParams(max_tokens=4, temperature=3.0)
    with tcp_cluster.worker_channel(worker_id) as channel:
        worker = worker_pb2_grpc.WorkerStub(channel)
        with pytest.raises(grpc.RpcError) as error:
            if role == "prefill":
                worker.Prefill(worker_pb2.PrefillRequest(request_id="hot", prompt_token_ids=[10, 11, 12],
                                                         sampling=sampling, transfer_id="hot-transfer"))
            else:
                list(worker.Decode(worker_pb2.DecodeRequest(request_id="hot", prompt_token_ids=[10, 11, 12],
                                                            sampling=sampling)))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "temperature" in error.value.details()


def test_the_cluster_keeps_serving_after_bad_input(tcp_cluster):
    with Client(tcp_cluster.grpc_target) as client:
        chunks = list(client.generate("Still here?", max_tokens=5, temperature=0, ignore_eos=True))
    assert sum(len(c.token_ids) for c in chunks) == 5 and chunks[-1].finish_reason == "length"
    _assert_idle(tcp_cluster)


def test_http_completions_stream_chat_and_models(tcp_cluster):
    base = tcp_cluster.http_url
    whole = httpx.post(f"{base}/v1/completions", json={"prompt": "Hello", "max_tokens": 6, "temperature": 0,
                                                         "ignore_eos": True}, timeout=30).json()
    assert whole["usage"]["completion_tokens"] == 6 and whole["choices"][0]["finish_reason"] == "length"
    with httpx.stream("POST", f"{base}/v1/completions", timeout=30,
                      json={"prompt": "Hello", "max_tokens": 6, "temperature": 0, "ignore_eos": True, "stream": True,
                            "stream_options": {"include_usage": True}}) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    import json

    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == whole["choices"][0]["text"]
    assert chunks[-1]["usage"]["completion_tokens"] == 6
    chat = httpx.post(f"{base}/v1/chat/completions", timeout=30,
                      json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}).json()
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"]["role"] == "assistant"
    models = httpx.get(f"{base}/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"]


def test_every_process_of_a_worker_runs_on_the_workers_cores(tcp_cluster):
    """The API process and vLLM's engine core, which on CPU runs the model itself (executor "auto":
    uni there, no model-runner process) with the OpenMP binding vLLM gives a model runner: none
    polls on the other worker's core."""
    for role, core in (("prefill", 0), ("decode", 1)):
        worker = tcp_cluster.workers[tcp_cluster.worker_ids(role)[0]]
        tree = process_tree(worker.pid)
        names = {pid: psutil.Process(pid).name() for pid in tree}
        engine_cores = [pid for pid, name in names.items() if "EngineCore" in name]
        assert len(engine_cores) == 1, f"{role}: not one engine core among {sorted(names.values())}"
        assert not any(name.startswith("VLLM::Worker") for name in names.values()), \
            f"{role}: a model-runner process among {sorted(names.values())}, where the engine core runs the model"
        environ = initial_environ(worker.pid)   # the engine core is its fork: its OpenMP was loaded under this
        assert (environ.get("OMP_PLACES"), environ.get("OMP_PROC_BIND")) == (f"{{{core}}}", "true")
        assert {pid: os.sched_getaffinity(pid) for pid in tree} == {pid: {core} for pid in tree}


def test_the_router_runs_on_the_prefill_workers_core_off_the_decode_workers(tcp_cluster):
    """Every thread of it: the tokens it relays must not lengthen the decode worker's steps."""
    router = tcp_cluster.router.pid
    threads = [int(tid) for tid in os.listdir(f"/proc/{router}/task")]
    assert len(threads) > 1, "expected gRPC's and asyncio's threads beside the main one"
    assert {tid: os.sched_getaffinity(tid) for tid in threads} == {tid: {0} for tid in threads}


def test_the_engine_processes_run_with_the_default_preload(tcp_cluster):
    """The libraries measurement chose (tcmalloc; vLLM's CPU guide) in LD_PRELOAD. A worker puts
    them there before its engine core starts (and, executor mp, its model runner), where the compute runs."""
    from pdserve.preload import DEFAULT_LIBRARIES, find_preload, loaded_libraries

    preload = find_preload(names=DEFAULT_LIBRARIES)
    if preload.missing:
        pytest.skip(preload.summary())
    wanted = {os.path.basename(os.path.realpath(path)) for path in preload.paths}  # maps name the real file
    for role in ("prefill", "decode"):
        worker = tcp_cluster.workers[tcp_cluster.worker_ids(role)[0]]
        engine_processes = process_tree(worker.pid)[1:]  # the engine core, ...
        assert engine_processes, f"{role}: vLLM's processes not found"
        assert {pid: wanted <= loaded_libraries(pid) for pid in engine_processes} == \
            {pid: True for pid in engine_processes}


def test_a_workers_engine_core_is_forked_from_it_under_the_environment_the_worker_started_with(tcp_cluster):
    """No second import of vLLM (pdserve.engine_process): the worker re-executed itself under its
    engine's environment (the binding, the allocator, pdserve's vLLM settings) and forked its engine
    core, whose OpenMP runtime and allocator are therefore the ones loaded under it. Spawning would
    have started multiprocessing's resource tracker beside it; vLLM's title survives the fork.
    (The fork's own /proc environ is no witness: setproctitle writes the title over that block.)"""
    for role, core in (("prefill", 0), ("decode", 1)):
        worker_id = tcp_cluster.worker_ids(role)[0]
        worker = tcp_cluster.workers[worker_id]
        children = process_tree(worker.pid)[1:]
        assert [psutil.Process(pid).cmdline()[0] for pid in children] == ["VLLM::EngineCore"], \
            f"{role}: the worker's processes should be its engine core alone"
        worker_env = initial_environ(worker.pid)
        assert worker_env.get(REEXEC_MARK) == "1"
        assert (worker_env["VLLM_CPU_OMP_THREADS_BIND"], worker_env["OMP_NUM_THREADS"]) == (str(core), "1")
        assert {"PDSERVE_VLLM_SPIN_S", "PDSERVE_VLLM_HOLD_WAIT_S"} <= worker_env.keys()
        libgomp = torch_libgomp()   # what vLLM would have preloaded into a spawned engine core
        assert libgomp is None or libgomp in worker_env["LD_PRELOAD"].split(":")
        log = (tcp_cluster.log_dir / f"{worker_id}.log").read_text(errors="replace")
        assert "vLLM's engine core starts by fork" in log


def test_every_thread_of_a_worker_and_its_thread_pools_fit_the_workers_core(tcp_cluster):
    """OpenMP's compute threads, MKL's and every other thread of the API process, the engine core
    and the model runner run on the worker's one core, and the pools are sized for one core."""
    for role, core in (("prefill", 0), ("decode", 1)):
        worker = tcp_cluster.workers[tcp_cluster.worker_ids(role)[0]]
        env = initial_environ(worker.pid)   # what its engine core, a fork of it, loaded OpenMP and MKL under
        assert (env.get("OMP_NUM_THREADS"), env.get("MKL_NUM_THREADS")) == ("1", "1"), role
        for pid in process_tree(worker.pid):
            threads = _thread_affinities(pid)
            assert threads and threads == {tid: {core} for tid in threads}, (role, pid)


def _thread_affinities(pid: int) -> dict[int, set[int]]:
    """Each live thread of `pid` and its allowed cores (a thread that ends meanwhile is left out)."""
    affinities = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            affinities[int(tid)] = os.sched_getaffinity(int(tid))
        except ProcessLookupError:
            continue
    return affinities


def test_a_cache_salt_keeps_cached_prompt_blocks_to_requests_of_the_same_salt(tcp_cluster):
    """vLLM's cache_salt through both engines: the same prompt is served from the prefix cache only
    to a request with the salt that cached it; the tokens are the same whatever the salt."""
    prompt = [1777] + [10 + (k * 37) % 1700 for k in range(99)]   # 100 tokens no other test sends

    def served(salt: str) -> tuple[list[int], int]:
        with Client(tcp_cluster.grpc_target) as client:
            chunks = list(client.generate(token_ids=prompt, max_tokens=4, temperature=0, ignore_eos=True,
                                          cache_salt=salt))
        return [t for c in chunks for t in c.token_ids], chunks[-1].timings.cached_prompt_tokens

    first, cold = served("tenant-a")
    again, warm = served("tenant-a")
    other, other_cached = served("tenant-b")
    unsalted, unsalted_cached = served("")
    assert (cold, other_cached, unsalted_cached) == (0, 0, 0)
    assert warm >= 64                                   # whole 32-token blocks of the 100-token prompt
    assert first == again == other == unsalted
    with Client(tcp_cluster.grpc_target) as client, pytest.raises(InvalidRequest, match="cache_salt"):
        list(client.generate(token_ids=prompt, max_tokens=2, cache_salt="a/b"))
