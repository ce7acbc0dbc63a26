"""RayClusterSpec: validation, resource requests per role, and the exact commands members run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pdserve.engine import EngineSettings, native_dtype
from launch.commands import ClusterSpec, redis_argv
from launch.ray.spec import RayClusterSpec, RoleResources, actor_options, member_id, member_index

ENGINE = EngineSettings(model="/models/tiny", block_size=32, max_model_len=1024, kv_cache_bytes=64 << 20,
                        max_num_seqs=16, seed=7)


def make_spec(**overrides) -> RayClusterSpec:
    cluster = ClusterSpec(engine=ENGINE, cluster="c1", grpc_port=50051, http_port=8000, transport="torch",
                          cpu_cores={"decode": "1"}, lease_s=20.0, ttl_s=4.0, local_prefill_max_tokens=16)
    return RayClusterSpec(cluster=cluster, **overrides)


def test_worker_runs_the_local_launchers_worker_command_with_the_clusters_settings():
    assert make_spec().cluster.worker_argv("decode", "decode-3", "redis://10.0.0.5:6379/0") == [
        "worker", "--role", "decode", "--worker-id", "decode-3", "--redis-url", "redis://10.0.0.5:6379/0",
        "--cluster", "c1", "--transport", "torch", "--cpu-cores", "1", "--lease-s", "20.0",
        "--kv-pull-timeout-s", "30.0", "--kv-encryption", "auto", "--ttl-s", "4.0",
        "--model", "/models/tiny", "--dtype", native_dtype(), "--block-size", "32", "--max-model-len", "1024",
        "--kv-cache-mb", "64", "--max-num-seqs", "16", "--seed", "7", "--vllm-spin-ms", "5",
        "--vllm-executor", "auto", "--vllm-engine-start", "auto", "--preload", "tcmalloc"]


def test_a_role_without_cores_is_not_pinned():
    argv = make_spec().cluster.worker_argv("prefill", "prefill-0", "redis://h:1/0")
    assert argv[argv.index("--cpu-cores") + 1] == ""


def test_router_runs_the_router_command_on_the_clusters_ports():
    assert make_spec().cluster.router_argv("redis://10.0.0.5:6379/0") == [
        "router", "--model", "/models/tiny", "--redis-url", "redis://10.0.0.5:6379/0", "--cluster", "c1",
        "--grpc-port", "50051", "--http-port", "8000", "--max-model-len", "1024", "--local-prefill-max-tokens", "16",
        "--topology", "disaggregated"]


def test_the_router_gets_the_clusters_topology_and_placement_flags():
    cluster = replace(make_spec().cluster, topology="hybrid", router_flags=("--slo-ttft-ms", "1500"))
    argv = cluster.router_argv("redis://h:1/0")
    assert argv[argv.index("--topology") + 1] == "hybrid" and argv[-2:] == ["--slo-ttft-ms", "1500"]
    with pytest.raises(ValueError, match="pass --prefill 0"):
        replace(make_spec().cluster, topology="aggregated")   # an aggregated cluster has no prefill pool


def test_each_role_asks_ray_for_its_own_resources_and_restarts():
    spec = make_spec(router=RoleResources(num_cpus=0.5), prefill=RoleResources(num_cpus=6, num_gpus=1),
                     decode=RoleResources(num_cpus=2, num_gpus=1), max_restarts=5)
    assert actor_options(spec, "decode", "decode-1") == {
        "name": "decode-1", "namespace": "pdserve-c1", "num_cpus": 2, "num_gpus": 1,
        "max_restarts": 5, "max_task_retries": -1, "max_concurrency": 4}
    assert actor_options(spec, "prefill", "prefill-0") == {
        "name": "prefill-0", "namespace": "pdserve-c1", "num_cpus": 6, "num_gpus": 1,
        "max_restarts": 5, "max_task_retries": -1, "max_concurrency": 4}
    assert actor_options(spec, "router", "router") == {
        "name": "router", "namespace": "pdserve-c1", "num_cpus": 0.5, "num_gpus": 0,
        "max_restarts": 5, "max_task_retries": -1, "max_concurrency": 4}


def test_redis_never_restarts_because_a_new_one_would_have_another_address():
    options = actor_options(make_spec(max_restarts=-1), "redis", "redis")
    assert (options["max_restarts"], options["max_task_retries"], options["num_cpus"]) == (0, 0, 0.0)


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_worker_asking_for_several_gpus_is_refused_with_the_reason(role):
    with pytest.raises(ValueError, match=f"{role} workers ask for 2 GPUs each.*add workers"):
        make_spec(**{role: RoleResources(num_cpus=1, num_gpus=2)})


def test_a_tensor_parallel_engine_is_refused_because_its_kv_would_be_split():
    cluster = ClusterSpec(engine=EngineSettings(model="/models/tiny", tensor_parallel_size=2))
    with pytest.raises(ValueError, match="tensor-parallel-size 2: prefill and decode engines run with 1"):
        RayClusterSpec(cluster=cluster, prefill=RoleResources(num_gpus=1), decode=RoleResources(num_gpus=1))


def test_redis_binds_the_node_address_so_other_nodes_reach_it():
    argv = redis_argv("/usr/bin/redis-server", "10.0.0.5", 6380, "/tmp/r", protected=False)
    assert argv[:5] == ["/usr/bin/redis-server", "--port", "6380", "--bind", "10.0.0.5"]
    assert argv[argv.index("--save") + 1] == "" and argv[argv.index("--appendonly") + 1] == "no"
    assert argv[argv.index("--protected-mode") + 1] == "no"


def test_member_ids_are_the_local_launchers_and_carry_their_creation_order():
    assert [member_id("decode", 4), member_id("router", 9), member_id("redis", 0)] == ["decode-4", "router", "redis"]
    assert [member_index("decode-12"), member_index("prefill-0"), member_index("router")] == [12, 0, -1]


@pytest.mark.parametrize("overrides, message", [
    ({"address": ""}, "Ray address is empty"),
    ({"redis_url": "10.0.0.5:6379"}, "must look like redis://"),
    ({"max_restarts": -2}, "max_restarts must be -1"),
    ({"ready_timeout_s": 0}, "must be > 0"),
])
def test_bad_settings_are_refused_with_the_fix(overrides, message):
    with pytest.raises(ValueError, match=message):
        make_spec(**overrides)


def test_a_cluster_name_that_cannot_name_a_namespace_is_refused():
    with pytest.raises(ValueError, match="use letters, digits"):
        RayClusterSpec(cluster=ClusterSpec(engine=ENGINE, cluster="my cluster"))


def test_the_same_port_for_grpc_and_http_is_refused():
    with pytest.raises(ValueError, match="pick two ports"):
        RayClusterSpec(cluster=ClusterSpec(engine=ENGINE, grpc_port=9000, http_port=9000))


@pytest.mark.parametrize("resources", [{"num_cpus": -1}, {"num_gpus": 1.5}, {"num_gpus": -1}])
def test_negative_or_fractional_gpu_requests_are_refused(resources):
    with pytest.raises(ValueError, match="must be"):
        RoleResources(**resources)
