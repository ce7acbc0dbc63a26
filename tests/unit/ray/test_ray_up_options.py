"""`pdserve up --ray ...` builds the RayClusterSpec the user asked for; without --ray, nothing changes."""

from __future__ import annotations

import pytest

from cli.main import build_parser
from cli.commands.ray_options import ray_cluster_spec
from launch.ray.spec import RoleResources, actor_options


def parse(*argv: str):
    return build_parser().parse_args(["up", "--model", "/models/tiny", *argv])


def test_ray_options_become_the_spec():
    spec = ray_cluster_spec(parse("--ray", "10.0.0.1:6379", "--cluster", "c1", "--decode", "3",
                                  "--redis-url", "redis://10.0.0.9:6379/0", "--router-cpus", "0.5",
                                  "--worker-cpus", "4", "--gpus-per-worker", "1", "--max-restarts", "3",
                                  "--grpc-port", "0", "--kv-cache-mb", "64"))
    assert (spec.address, spec.namespace, spec.redis_url, spec.max_restarts) == (
        "10.0.0.1:6379", "pdserve-c1", "redis://10.0.0.9:6379/0", 3)
    assert (spec.router, spec.prefill, spec.decode) == (
        RoleResources(num_cpus=0.5), RoleResources(num_cpus=4, num_gpus=1), RoleResources(num_cpus=4, num_gpus=1))
    assert (spec.cluster.cluster, spec.cluster.num_decode, spec.cluster.grpc_port) == ("c1", 3, 0)
    assert spec.cluster.engine.kv_cache_bytes == 64 << 20
    assert spec.cluster.engine.tensor_parallel_size == 1


def test_prefill_and_decode_are_sized_separately_and_fall_back_to_the_worker_options():
    spec = ray_cluster_spec(parse("--ray", "auto", "--worker-cpus", "2", "--gpus-per-worker", "1",
                                  "--prefill-cpus", "8", "--decode-gpus", "0"))
    assert (spec.prefill, spec.decode) == (RoleResources(num_cpus=8, num_gpus=1), RoleResources(num_cpus=2, num_gpus=0))
    assert actor_options(spec, "prefill", "prefill-0")["num_cpus"] == 8
    assert (actor_options(spec, "decode", "decode-1")["num_cpus"], actor_options(spec, "decode", "decode-1")["num_gpus"]) == (2, 0)


@pytest.mark.parametrize("argv, message", [
    (("--gpus-per-worker", "2"), "prefill workers ask for 2 GPUs each"),
    (("--decode-gpus", "4"), "decode workers ask for 4 GPUs each"),
    (("--gpus-per-worker", "2", "--tensor-parallel-size", "2"), "prefill workers ask for 2 GPUs"),
    (("--gpus-per-worker", "1", "--tensor-parallel-size", "2"), "--tensor-parallel-size 2: prefill and decode"),
])
def test_a_worker_spanning_several_gpus_is_refused_before_ray_is_touched(argv, message):
    with pytest.raises(ValueError, match=message) as refused:
        ray_cluster_spec(parse("--ray", "10.255.255.1:6379", *argv))  # nobody listens there: never reached
    assert "KV connector moves one tensor-parallel rank's KV cache" in str(refused.value)


def test_cores_are_pinned_only_when_asked_because_this_hosts_split_means_nothing_on_other_nodes():
    assert ray_cluster_spec(parse("--ray", "auto")).cluster.cpu_cores == {}
    assert ray_cluster_spec(parse("--ray", "auto", "--decode-cores", "2-3")).cluster.cpu_cores == {"decode": "2-3"}


def test_defaults_ask_one_cpu_per_member_and_restart_for_ever_with_redis_in_an_actor():
    spec = ray_cluster_spec(parse("--ray", "auto"))
    assert (spec.address, spec.redis_url, spec.max_restarts, spec.namespace) == ("auto", "", -1, "pdserve-default")
    assert (spec.router, spec.prefill, spec.decode) == (RoleResources(num_cpus=1.0),) * 3


def test_without_ray_up_stays_local():
    assert parse().ray is None


def test_relative_model_and_log_paths_become_absolute_because_actors_start_elsewhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    args = build_parser().parse_args(["up", "--model", "models/tiny", "--ray", "auto", "--log-dir", "logs"])
    spec = ray_cluster_spec(args)
    assert (spec.cluster.engine.model, spec.cluster.log_dir) == (str(tmp_path / "models/tiny"), str(tmp_path / "logs"))


def test_a_model_that_is_no_local_path_is_passed_on_as_given():
    assert ray_cluster_spec(build_parser().parse_args(
        ["up", "--model", "org/some-model", "--ray", "auto"])).cluster.engine.model == "org/some-model"
