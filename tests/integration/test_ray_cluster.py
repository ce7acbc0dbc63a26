"""`pdserve up --ray ADDRESS` on a real local Ray cluster: real engines, Redis, actors and restarts.

One Ray cluster (started here with `ray.init`) and one `pdserve up --ray` process (as a user runs
it) serve the whole module; the planner's Ray actuator attaches from this process, as a planner
running elsewhere would. Engines: the tiny model, 64 MiB of KV, prefill on core 0, decode on core 1.
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
from pdserve.launcher import ClusterSpec
from pdserve.registry import worker_key

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")

from pdserve.ray.cluster import RayCluster, RayClusterError  # noqa: E402
from pdserve.ray.spec import RayClusterSpec  # noqa: E402
from planner.actuators.ray import RayActuator, RayActuatorConfig  # noqa: E402

CLUSTER = "raytest"
START_TIMEOUT_S = 900.0   # engines start in ~20 s on an idle machine; this one is shared
PROMPTS = [0, 4, 8, 12]   # indices into the shared prompts: 1, 33, 96 and 200 tokens


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
    context = ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    yield context.address_info["gcs_address"]
    ray.shutdown()


@pytest.fixture(scope="module")
def up(ray_address, tiny_model, tmp_path_factory, reference_outputs):
    """`pdserve up --ray ADDRESS` in its own process, as a user runs it (after the reference run,
    so the engines do not share the cores with it)."""
    folder = tmp_path_factory.mktemp("ray-cluster")
    argv = [sys.executable, "-m", "pdserve.cli", "up", "--ray", ray_address, "--cluster", CLUSTER,
            "--model", str(tiny_model), "--kv-cache-mb", "64", "--max-num-seqs", "16", "--grpc-port", "0",
            "--http-port", "0", "--prefill-cores", "0", "--decode-cores", "1", "--router-cpus", "0",
            "--worker-cpus", "0.5", "--log-dir", str(folder / "members")]
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
    client = redis.Redis.from_url(cluster.redis_url, decode_responses=True)
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


def test_the_ray_actuator_scales_decode_from_one_to_two_and_back(ray_address, cluster, registry, prompts,
                                                                reference_outputs):
    actuator = RayActuator.connect(RayActuatorConfig(address=ray_address, cluster=CLUSTER))
    assert actuator.current() == {"prefill": 1, "decode": 1}

    actuator.scale("decode", 2)
    assert actuator.current() == {"prefill": 1, "decode": 2}
    added = "decode-2"
    assert cluster.worker_ids("decode") == ["decode-1", added]
    cluster.wait_ready(added, START_TIMEOUT_S)
    wait_for(lambda: workers_seen_by_router(cluster) == (1, 2), 30, "the router seeing the new decode worker")
    with ThreadPoolExecutor(6) as pool:  # concurrent and long enough to overlap: the router spreads them
        served = list(pool.map(lambda i: generate(cluster.grpc_target, prompts[i], 48)[1].decode_worker, range(6)))
    assert set(served) == {"decode-1", added}

    removed_pid = cluster.member(added).child_pid
    actuator.scale("decode", 1)
    assert actuator.current() == {"prefill": 1, "decode": 1}
    assert cluster.worker_ids("decode") == ["decode-1"]          # the newest one went
    assert process_gone(removed_pid) and not registry.exists(worker_key(CLUSTER, added))
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
def test_killed_members_are_restarted_by_ray_and_register_again(cluster, registry, prompts, reference_outputs):
    """decode-1: its actor process is SIGKILLed; prefill-0: its worker process is. Both come back."""
    decode, prefill = cluster.member("decode-1"), cluster.member("prefill-0")
    os.kill(decode.actor_pid, signal.SIGKILL)
    os.kill(prefill.child_pid, signal.SIGKILL)
    # the old processes are gone (the decode worker got SIGTERM from its dying actor) and so are
    # their registry entries, so the router stops sending them requests
    wait_for(lambda: process_gone(decode.child_pid), 60, "the dead actor's worker process exiting")
    for worker in ("decode-1", "prefill-0"):
        wait_for(lambda: not registry.exists(worker_key(CLUSTER, worker)), 30, f"{worker} leaving the registry")
    # Ray restarts both actors; each starts a new worker that registers again under the same id
    for old in (decode, prefill):
        new = wait_for(lambda: _restarted(cluster, old), START_TIMEOUT_S, f"{old.member_id} restarted and ready", 1.0)
        assert registry.hget(worker_key(CLUSTER, old.member_id), "grpc_address") == new.address
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
