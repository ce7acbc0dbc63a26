"""`pdserve up --ray HOST:PORT` on a Ray head started as users start one, with token authentication:
real engines, Redis, actors, restarts and the planner's Ray actuator.

The head is `ray start --head --port <free>` in a subprocess (tests/ray_head.py: its own HOME,
RAY_TMPDIR and ports). Ray's token authentication is at its default: on, because the head's
HOME holds a token (`ray get-auth-token --generate`). `pdserve up` runs as if on another machine:
its HOME holds no token, so it is given the head's with --ray-auth-token-file; without it, or
with another token, it must say so at once. One `pdserve up` serves the whole module; the
planner's Ray actuator attaches from this process with the same token file, as a planner running
elsewhere would. Engines: the tiny model, 64 MiB of KV, prefill on core 0, decode on core 1; Ray
reserves 0.5 CPU per prefill worker and 0.25 per decode worker (of the head's 4).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from launch.local import ClusterSpec
from pdserve.client import Client
from pdserve.engine import EngineSettings
from pdserve.keys import worker_key
from ray_head import RAY, free_ray_port, isolating_flags, private_dir, ray_env, session_processes, start_head, stop_session

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")

from launch.ray.cluster import RayCluster, RayClusterError  # noqa: E402
from launch.ray.spec import RayClusterSpec  # noqa: E402
from planner.actuators.ray import RayActuator, RayActuatorConfig  # noqa: E402

CLUSTER = "raytest"
ADDED = "decode-2"          # the decode member the actuator adds (member ids carry creation order)
HEAD_CPUS = 4
PREFILL_CPUS, DECODE_CPUS = 0.5, 0.25   # what each pool's members ask Ray for (router and redis: 0)
START_TIMEOUT_S = 900.0     # engines start in ~20 s on an idle machine; this one is shared
REFUSAL_TIMEOUT_S = 60.0    # a refusal takes seconds (ray.init would retry `InvalidAuthToken` for a minute)
PROMPTS = [0, 4, 8, 12]     # indices into the shared prompts: 1, 33, 96 and 200 tokens
AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")


@dataclass(frozen=True)
class Head:
    address: str      # the GCS, as `ray start` prints it for others to join
    session: int      # the session of every process of this head
    token_file: Path  # the head's ~/.ray/auth_token
    folder: Path      # its HOME and RAY_TMPDIR live here


def wait_for(predicate, timeout_s: float, what: str, poll_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise TimeoutError(f"{what} within {timeout_s:.0f} s")


def process_gone(pid: int) -> bool:
    """Not running: gone, or a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.fixture(scope="module")
def head():
    folder = private_dir("pdray-")
    home = folder / "head-home"
    home.mkdir()
    env = ray_env(home, folder)
    log, session = folder / "ray-start.log", None
    try:
        subprocess.run([str(RAY), "get-auth-token", "--generate"], env=env, check=True, capture_output=True,
                       timeout=120)
        session = start_head(f"{RAY} start --head --port {free_ray_port()} --num-cpus {HEAD_CPUS} --include-dashboard false "
                             f"--disable-usage-stats {' '.join(isolating_flags())}", env, log)
        output = log.read_text()
        assert "Token authentication is enabled for this Ray cluster" in output, output[-3000:]
        address = re.search(r"ray start --address='([^']+)'", output).group(1)
        yield Head(address, session, home / ".ray" / "auth_token", folder)
    finally:
        if session is not None:
            stop_session(session)
        shutil.rmtree(folder, ignore_errors=True)


def pdserve_up_argv(head: Head, model: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "cli.main", "up", "--ray", head.address, "--cluster", CLUSTER, "--model", str(model),
            "--kv-cache-mb", "64", "--max-num-seqs", "16", "--grpc-port", "0", "--http-port", "0",
            "--prefill-cores", "0", "--decode-cores", "1", "--router-cpus", "0", "--prefill-cpus", str(PREFILL_CPUS),
            "--decode-cpus", str(DECODE_CPUS), "--insecure", *extra]


def tokenless_env(head: Head) -> dict[str, str]:
    """Another machine's environment, as far as Ray's token goes: a HOME without one."""
    home = head.folder / "driver-home"
    home.mkdir(exist_ok=True)
    return ray_env(home, head.folder)


def run_refused_up(head: Head, model: Path, *extra: str) -> tuple[str, float]:
    started = time.monotonic()
    result = subprocess.run(pdserve_up_argv(head, model, *extra), env=tokenless_env(head), capture_output=True,
                            text=True, timeout=REFUSAL_TIMEOUT_S)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    return output, time.monotonic() - started


def test_without_a_token_pdserve_up_says_what_is_missing_instead_of_retrying(head, tiny_model):
    output, took_s = run_refused_up(head, tiny_model)
    assert f"the Ray cluster at {head.address} uses token authentication and pdserve found no token (looked at " \
           "--ray-auth-token-file, RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)." in " ".join(output.split())
    assert "InvalidAuthToken" not in output and "Traceback" not in output
    assert took_s < REFUSAL_TIMEOUT_S


def test_with_another_token_pdserve_up_names_the_token_it_sent(head, tiny_model, tmp_path):
    wrong = tmp_path / "wrong-token"
    wrong.write_text("0" * 32)
    output, _ = run_refused_up(head, tiny_model, "--ray-auth-token-file", str(wrong))
    assert (f"the Ray cluster at {head.address} refused the token from --ray-auth-token-file {wrong}: the cluster was "
            "started with another token.") in " ".join(output.split())
    assert "InvalidAuthToken" not in output and "Traceback" not in output


@pytest.fixture(scope="module")
def up(head, tiny_model, reference_outputs):
    """`pdserve up --ray` with the head's token file, in its own process (after the reference run,
    so the engines do not share the cores with it)."""
    argv = pdserve_up_argv(head, tiny_model, "--ray-auth-token-file", str(head.token_file),
                           "--log-dir", str(head.folder / "members"))
    log_path = head.folder / "up.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=tokenless_env(head),
                                   start_new_session=True)
    process.log_path = log_path
    yield process
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def cluster(head, up):
    """The cluster `up` started, attached from this process with the same token file. The
    variables Ray's and pdserve's token handling set here are put back afterwards."""
    assert not ray.is_initialized(), "this process is still connected to another Ray cluster"
    with pytest.MonkeyPatch.context() as environment:
        for name in AUTH_VARS:
            environment.delenv(name, raising=False)
        try:
            yield wait_for(lambda: _attach_unless_exited(up, head), START_TIMEOUT_S, "pdserve up --ray serving", 1.0)
        finally:
            ray.shutdown()


def _attach_unless_exited(up: subprocess.Popen, head: Head) -> RayCluster | None:
    if up.poll() is not None:
        raise RuntimeError(f"pdserve up --ray exited with {up.returncode}:\n{up.log_path.read_text()[-3000:]}")
    try:
        return RayCluster.attach(head.address, CLUSTER, auth_token_file=str(head.token_file))
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
    with Client(cluster.grpc_target) as client:
        info = client.model_info()
    return info.num_prefill_workers, info.num_decode_workers


def test_requests_give_colocated_vllm_tokens_from_members_on_the_address_ray_gives_the_node(
        head, cluster, registry, prompts, reference_outputs):
    (node_ip,) = [node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"]]
    members = cluster.members()
    assert {m.member_id: m.status for m in members} == {
        "redis": "ready", "router": "ready", "prefill-0": "ready", "decode-1": "ready"}
    assert {m.node_ip for m in members} == {node_ip}
    assert cluster.grpc_target.startswith(f"{node_ip}:") and cluster.redis_url.startswith(f"redis://{node_ip}:")
    for worker in ("prefill-0", "decode-1"):
        assert registry.hget(worker_key(CLUSTER, worker), "grpc_address") == cluster.worker_address(worker)
        assert cluster.worker_address(worker).startswith(f"{node_ip}:")
    assert registry.hget(worker_key(CLUSTER, "decode-1"), "role") == "decode"
    # the router's view of the pools follows the registry: until it has seen prefill-0, it serves a
    # request on the decode worker alone (a clean-clone run once caught the first request there)
    wait_for(lambda: workers_seen_by_router(cluster) == (1, 1), 30, "the router seeing both pools")
    for index in PROMPTS:
        tokens, timings = generate(cluster.grpc_target, prompts[index])
        assert tokens == reference_outputs[index], f"prompt {index} ({len(prompts[index]['token_ids'])} tokens)"
        assert (timings.disaggregated, timings.prefill_worker, timings.decode_worker) == (True, "prefill-0", "decode-1")
    # each pool asked Ray for its own CPUs: what is left is the head's minus one of each
    wait_for(lambda: ray.available_resources().get("CPU") == HEAD_CPUS - PREFILL_CPUS - DECODE_CPUS, 10,
             f"Ray accounting {PREFILL_CPUS} CPU to prefill-0 and {DECODE_CPUS} to decode-1")


def _actuator(head: Head) -> RayActuator:
    return RayActuator.connect(RayActuatorConfig(address=head.address, cluster=CLUSTER,
                                                 auth_token_file=str(head.token_file)))


def test_the_ray_actuator_scales_decode_to_two_and_both_give_colocated_vllm_tokens(head, cluster, prompts,
                                                                                 reference_outputs):
    actuator = _actuator(head)
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
        reference = reference_outputs[index]  # greedy: a longer answer starts with the reference's
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


def test_the_ray_actuator_scales_decode_back_to_one_draining_the_newest(head, cluster, registry, prompts,
                                                                       reference_outputs):
    actuator = _actuator(head)
    assert actuator.current() == {"prefill": 1, "decode": 2}
    removed_pid = cluster.member(ADDED).child_pid
    actuator.scale("decode", 1)
    assert actuator.current() == {"prefill": 1, "decode": 1}
    assert cluster.worker_ids("decode") == ["decode-1"]          # the newest one went, drained
    assert process_gone(removed_pid) and not registry.exists(worker_key(CLUSTER, ADDED))
    wait_for(lambda: workers_seen_by_router(cluster) == (1, 1), 30, "the router dropping the removed worker")
    tokens, timings = generate(cluster.grpc_target, prompts[PROMPTS[1]])
    assert (tokens, timings.decode_worker) == (reference_outputs[PROMPTS[1]], "decode-1")


def test_a_second_cluster_with_the_same_name_is_refused(head, cluster, tiny_model):
    spec = RayClusterSpec(ClusterSpec(engine=EngineSettings(model=str(tiny_model)), cluster=CLUSTER),
                          address=head.address, auth_token_file=str(head.token_file))
    with pytest.raises(RayClusterError, match="already runs on this Ray cluster"):
        RayCluster(spec).start()


def test_attaching_to_a_cluster_that_does_not_exist_says_how_to_start_one(head, cluster):
    with pytest.raises(RayClusterError, match=f"start one with `pdserve up --ray {head.address} --cluster nosuch"):
        RayCluster.attach(head.address, "nosuch", auth_token_file=str(head.token_file))


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


def test_ctrl_c_stops_pdserve_and_the_head_then_stops_with_nothing_left(head, up, cluster):
    """Last in this module: it stops what the others share."""
    pids = {pid for member in cluster.members() for pid in (member.actor_pid, member.child_pid)}
    up.send_signal(signal.SIGINT)
    assert up.wait(timeout=120) == 0
    wait_for(lambda: all(process_gone(pid) for pid in pids), 30, "every actor and its process exiting")
    with pytest.raises(RayClusterError, match="no pdserve cluster named"):
        RayCluster.attach(head.address, CLUSTER)
    ray.shutdown()
    assert stop_session(head.session) == set(), "Ray processes had to be killed"
    assert session_processes(head.session) == {}
