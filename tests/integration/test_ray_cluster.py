"""`pdserve up --ray ADDRESS` on a real local Ray cluster: real engines, Redis, actors and restarts.

One Ray cluster (started here with `ray.init`) and one `pdserve up --ray` process (as a user runs
it) serve the whole module; the planner's Ray actuator attaches from this process, as a planner
running elsewhere would. Engines: the tiny model, 64 MiB of KV, prefill on core 0, decode on core 1;
Ray reserves 0.5 CPU per prefill worker and 0.25 per decode worker (of the 2 `ray.init` offers).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from pdserve.client import Client
from pdserve.engine import EngineSettings
from launch.local import ClusterSpec
from pdserve.keys import worker_key

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")

from launch.ray.cluster import RayCluster, RayClusterError  # noqa: E402
from launch.ray.spec import RayClusterSpec  # noqa: E402
from planner.actuators.ray import RayActuator, RayActuatorConfig  # noqa: E402

CLUSTER = "raytest"
ADDED = "decode-2"        # the decode member the actuator adds (member ids carry creation order)
START_TIMEOUT_S = 900.0   # engines start in ~20 s on an idle machine; this one is shared
PROMPTS = [0, 4, 8, 12]   # indices into the shared prompts: 1, 33, 96 and 200 tokens
RAY_CPUS = 2
PREFILL_CPUS, DECODE_CPUS = 0.5, 0.25   # what each pool's members ask Ray for (router and redis: 0)


def wait_for(predicate, timeout_s: float, what: str, poll_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise TimeoutError(f"{what} within {timeout_s:.0f} s")


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] == "Z"   # a zombie: no longer runs
    except FileNotFoundError:  # reaped between the two looks
        return True


@pytest.fixture(scope="module")
def ray_address():
    context = ray.init(num_cpus=RAY_CPUS, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    yield context.address_info["gcs_address"]
    ray.shutdown()


@pytest.fixture(scope="module")
def up(ray_address, tiny_model, tmp_path_factory, reference_outputs):
    """`pdserve up --ray ADDRESS` in its own process, as a user runs it (after the reference run,
    so the engines do not share the cores with it)."""
    folder = tmp_path_factory.mktemp("ray-cluster")
    argv = [sys.executable, "-m", "cli.main", "up", "--ray", ray_address, "--cluster", CLUSTER,
            "--model", str(tiny_model), "--kv-cache-mb", "64", "--max-num-seqs", "16", "--grpc-port", "0",
            "--http-port", "0", "--prefill-cores", "0", "--decode-cores", "1", "--router-cpus", "0",
            "--prefill-cpus", str(PREFILL_CPUS), "--decode-cpus", str(DECODE_CPUS), "--log-dir", str(folder / "members")]
    with open(folder / "up.log", "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    process.log_path = folder / "up.log"
    yield process
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def cluster(ray_address, up):
    """The cluster `up` started, attached from this process once it serves."""
    return wait_for(lambda: _attach_unless_exited(up, ray_address), START_TIMEOUT_S, "pdserve up --ray serving", 1.0)


def _attach_unless_exited(up: subprocess.Popen, ray_address: str) -> RayCluster | None:
    if up.poll() is not None:
        raise RuntimeError(f"pdserve up --ray exited with {up.returncode}:\n{up.log_path.read_text()[-3000:]}")
    try:
        return RayCluster.attach(ray_address, CLUSTER)
    except RayClusterError:
        return None


@pytest.fixture(scope="module")
def registry(cluster):
    client = redis.Redis.from_url(cluster.redis_client_url, decode_responses=True)
    yield client
    client.close()


def generate(target: str, prompt: dict, max_tokens: int = 0) -> tuple[list[int], object]:
    with Client(target) as client:
        chunks = list(client.generate(token_ids=prompt["token_ids"], max_tokens=max_tokens or prompt["max_tokens"],
                                      temperature=0, ignore_eos=True, timeout_s=120))
    return [t for chunk in chunks for t in chunk.token_ids], chunks[-1].timings


def workers_seen_by_router(cluster: RayCluster) -> tuple[int, int]:
    """(prefill, decode) workers the router routes to."""
    with Client(cluster.grpc_target) as client:
        info = client.model_info()
    return info.num_prefill_workers, info.num_decode_workers


def test_requests_through_the_ray_router_give_colocated_vllm_tokens(cluster, registry, prompts, reference_outputs):
    node_ip = cluster.member("router").node_ip
    assert {m.member_id: m.status for m in cluster.members()} == {
        "redis": "ready", "router": "ready", "prefill-0": "ready", "decode-1": "ready"}
    for index in PROMPTS:
        tokens, timings = generate(cluster.grpc_target, prompts[index])
        assert tokens == reference_outputs[index], f"prompt {index} ({len(prompts[index]['token_ids'])} tokens)"
        assert (timings.disaggregated, timings.prefill_worker, timings.decode_worker) == (True, "prefill-0", "decode-1")
    # the workers registered themselves in Redis, reachable at their Ray node's address
    record = registry.hgetall(worker_key(CLUSTER, "decode-1"))
    assert record["role"] == "decode" and record["grpc_address"] == cluster.worker_address("decode-1")
    assert record["grpc_address"].startswith(f"{node_ip}:")
    # each pool asked Ray for its own CPUs: what is left is the cluster's minus one of each
    wait_for(lambda: ray.available_resources().get("CPU") == RAY_CPUS - PREFILL_CPUS - DECODE_CPUS, 10,
             f"Ray accounting {PREFILL_CPUS} CPU to prefill-0 and {DECODE_CPUS} to decode-1")


def test_the_ray_actuator_scales_decode_to_two_and_both_give_colocated_vllm_tokens(ray_address, cluster, prompts,
                                                                                 reference_outputs):
    actuator = RayActuator.connect(RayActuatorConfig(address=ray_address, cluster=CLUSTER))
    assert actuator.current() == {"prefill": 1, "decode": 1}

    actuator.scale("decode", 2)
    assert actuator.current() == {"prefill": 1, "decode": 2}
    assert cluster.worker_ids("decode") == ["decode-1", ADDED]
    cluster.wait_ready(ADDED, START_TIMEOUT_S)
    wait_for(lambda: workers_seen_by_router(cluster) == (1, 2), 30, "the router seeing the new decode worker")
    with ThreadPoolExecutor(6) as pool:  # concurrent and long enough to overlap: the router spreads them
        results = list(pool.map(lambda i: generate(cluster.grpc_target, prompts[i], 48), range(6)))
    assert {timings.decode_worker for _, timings in results} == {"decode-1", ADDED}
    for index, (tokens, timings) in enumerate(results):
        # greedy: the first tokens of a longer answer are the colocated reference's answer
        reference = reference_outputs[index]
        assert tokens[:len(reference)] == reference, f"prompt {index} on {timings.decode_worker}"
        assert len(tokens) == 48


@pytest.mark.chaos
def test_while_a_killed_decode_actor_restarts_requests_succeed_on_the_survivor(cluster, registry, prompts,
                                                                             reference_outputs):
    killed = cluster.member(ADDED)
    os.kill(killed.actor_pid, signal.SIGKILL)
    # its worker got SIGTERM from the dying actor (PR_SET_PDEATHSIG): it leaves the registry at once
    wait_for(lambda: workers_seen_by_router(cluster) == (1, 1), 30, "the router dropping the killed worker")
    served = []
    for index in PROMPTS:
        tokens, timings = generate(cluster.grpc_target, prompts[index])
        assert tokens == reference_outputs[index], f"prompt {index} during the outage"
        served.append(timings.decode_worker)
    assert cluster.member(ADDED).status != "ready", "the outage ended before the requests did"
    assert served == ["decode-1"] * len(PROMPTS)
    # Ray restarts the actor, which starts a new worker registering under the same id
    wait_for(lambda: process_gone(killed.child_pid), 60, "the dead actor's worker process exiting")
    new = wait_for(lambda: _restarted(cluster, killed), START_TIMEOUT_S, f"{ADDED} restarted and ready", 1.0)
    assert registry.hget(worker_key(CLUSTER, ADDED), "grpc_address") == new.address
    wait_for(lambda: workers_seen_by_router(cluster) == (1, 2), 30, "the router seeing the restarted worker")


def test_the_ray_actuator_scales_decode_back_to_one_removing_the_newest(ray_address, cluster, registry, prompts,
                                                                       reference_outputs):
    actuator = RayActuator.connect(RayActuatorConfig(address=ray_address, cluster=CLUSTER))
    assert actuator.current() == {"prefill": 1, "decode": 2}
    removed_pid = cluster.member(ADDED).child_pid
    actuator.scale("decode", 1)
    assert actuator.current() == {"prefill": 1, "decode": 1}
    assert cluster.worker_ids("decode") == ["decode-1"]          # the newest one went
    assert process_gone(removed_pid) and not registry.exists(worker_key(CLUSTER, ADDED))
    wait_for(lambda: workers_seen_by_router(cluster) == (1, 1), 30, "the router dropping the removed worker")
    tokens, timings = generate(cluster.grpc_target, prompts[PROMPTS[1]])
    assert (tokens, timings.decode_worker) == (reference_outputs[PROMPTS[1]], "decode-1")


def test_a_second_cluster_with_the_same_name_is_refused(ray_address, cluster, tiny_model):
    spec = RayClusterSpec(ClusterSpec(engine=EngineSettings(model=str(tiny_model)), cluster=CLUSTER),
                          address=ray_address)
    with pytest.raises(RayClusterError, match="already runs on this Ray cluster"):
        RayCluster(spec).start()


def test_attaching_to_a_cluster_that_does_not_exist_says_how_to_start_one(ray_address):
    with pytest.raises(RayClusterError, match=f"start one with `pdserve up --ray {ray_address} --cluster nosuch"):
        RayCluster.attach(ray_address, "nosuch")


@pytest.mark.chaos
def test_a_killed_worker_process_is_restarted_by_ray_and_registers_again(cluster, registry, prompts,
                                                                         reference_outputs):
    """prefill-0's worker process is SIGKILLed (its actor lives on, sees the exit, and exits so Ray
    restarts it); the actor-killed case is the decode test above."""
    prefill = cluster.member("prefill-0")
    os.kill(prefill.child_pid, signal.SIGKILL)
    wait_for(lambda: not registry.exists(worker_key(CLUSTER, "prefill-0")), 30, "prefill-0 leaving the registry")
    new = wait_for(lambda: _restarted(cluster, prefill), START_TIMEOUT_S, "prefill-0 restarted and ready", 1.0)
    assert registry.hget(worker_key(CLUSTER, "prefill-0"), "grpc_address") == new.address
    wait_for(lambda: workers_seen_by_router(cluster) == (1, 1), 30, "the router seeing both workers again")
    tokens, timings = generate(cluster.grpc_target, prompts[PROMPTS[2]])
    assert tokens == reference_outputs[PROMPTS[2]]
    assert (timings.prefill_worker, timings.decode_worker) == ("prefill-0", "decode-1")


def _restarted(cluster: RayCluster, old):
    new = cluster.member(old.member_id)
    return new if new.status == "ready" and new.actor_pid != old.actor_pid and new.child_pid != old.child_pid else None


def test_ctrl_c_on_pdserve_up_stops_every_process_of_the_cluster(ray_address, up, cluster):
    """Last in this module: it stops the cluster the other tests share."""
    pids = [pid for member in cluster.members() for pid in (member.actor_pid, member.child_pid)]
    up.send_signal(signal.SIGINT)
    assert up.wait(timeout=120) == 0
    wait_for(lambda: all(process_gone(pid) for pid in pids), 30, "every actor and its process exiting")
    with pytest.raises(RayClusterError, match="no pdserve cluster named"):
        RayCluster.attach(ray_address, CLUSTER)
