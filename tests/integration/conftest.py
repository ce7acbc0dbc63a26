"""Fixtures for the integration tests (helpers live in cluster_helpers.py)."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from cluster_helpers import TOOL_PARSER_FLAGS, engine_settings, kv_segments_of, start_cluster

from pdserve.engine_step_trace import STEP_TRACE_ENV


@pytest.fixture(scope="session")
def tcp_cluster(tiny_model, tmp_path_factory):
    """One prefill + one decode worker over the tcp transport, shared by the integration modules; its
    router parses tool calls as the session's vLLM OpenAI server does (TOOL_PARSER_FLAGS)."""
    cluster = start_cluster(tiny_model, tmp_path_factory.mktemp("cluster-tcp"), "tcp", router_flags=TOOL_PARSER_FLAGS)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def torch_cluster(tiny_model, tmp_path_factory):
    """The same cluster over the torch (gloo) transport."""
    cluster = start_cluster(tiny_model, tmp_path_factory.mktemp("cluster-torch"), "torch")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def shm_trace_dir(tmp_path_factory):
    """Where the shm cluster's first engines write their step and join traces."""
    return tmp_path_factory.mktemp("shm-steps")


@pytest.fixture(scope="session")
def shm_cluster(tiny_model, tmp_path_factory, shm_trace_dir):
    """The same cluster over the one-sided shared-memory transport. When it stops, no KV segment
    its workers mapped outlives it (the producers unlink theirs, whatever killed workers left is swept).
    The workers it starts with trace their engines' steps into `shm_trace_dir`
    (`pdserve.engine_step_trace`: a measurement; nothing they serve changes)."""
    earlier = os.environ.get(STEP_TRACE_ENV)
    os.environ[STEP_TRACE_ENV] = str(shm_trace_dir)
    try:
        cluster = start_cluster(tiny_model, tmp_path_factory.mktemp("cluster-shm"), "shm")
    finally:
        if earlier is None:
            del os.environ[STEP_TRACE_ENV]
        else:
            os.environ[STEP_TRACE_ENV] = earlier
    yield cluster
    segments = set().union(*(kv_segments_of(cluster, worker_id) for worker_id in list(cluster.workers)))
    cluster.stop()
    assert segments and not any(os.path.exists(path) for path in segments), "KV segments outlived the cluster"


@pytest.fixture(params=["tcp", "torch", "shm"])
def cluster(request):
    """Each transport's cluster in turn."""
    return request.getfixturevalue(f"{request.param}_cluster")


@pytest.fixture(scope="session")
def vllm_openai_server(tiny_model, tmp_path_factory):
    """vLLM's own OpenAI server (`python -m vllm.entrypoints.openai.api_server`) with the clusters'
    engine settings, serving the model as "tiny" (the name pdserve serves it under, its directory's),
    with the tcp cluster router's tool-call flags: one for the session, shared by the compatibility
    suite and the load generator's tests."""
    from loadgen.vllm_server import VllmOpenAIServer

    log = tmp_path_factory.mktemp("vllm-openai-server") / "server.log"   # vLLM logs here; never parsed
    # bound to every core, as the profile and the benchmarks run it: left to vLLM's auto binding on
    # two vCPUs, its worker gets one and its engine core's polling starves the API process on the
    # other, and streams arrive in bursts (loadgen/vllm_server.py)
    cores = ",".join(str(core) for core in sorted(os.sched_getaffinity(0)))
    with VllmOpenAIServer(replace(engine_settings(tiny_model), cpu_cores=cores), log_path=log,
                          served_model_name=tiny_model.name,
                          extra_args=TOOL_PARSER_FLAGS) as server:
        yield server
