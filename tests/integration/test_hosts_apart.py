"""Hosts apart (issue 18 item 3): the router (with Redis), the prefill worker and two decode workers
each on a "host" of its own, a network namespace joined to the others by a veth cable into one
bridge (tests/netns.py). KV crosses the cables over the tcp transport, as between machines.

Cables are cut mid-stream and mid-transfer (dropped silently: no RST, no FIN, as when a cable is
pulled), made lossy and slow. A request completes with the tokens it would have had, or fails
cleanly, always within a bound; no KV block stays pinned; a host whose cable returns serves again.
The tests run in order on one cluster: each leaves every cable plugged in and the cluster idle.

Skipped where network namespaces cannot be made (not root, no iproute2, `ip netns add` refused);
the loss test needs nftables (`nft`), the delay test the kernel's sch_netem (`tc netem`).
"""

from __future__ import annotations

import time

import pytest

import netns
from cluster_helpers import (blocks_for, engine_settings, kv_bytes_per_block, wait_for_workers, wait_until_idle,
                             worker_load)
from launch.commands import Host
from launch.local import ClusterSpec, LocalCluster
from pdserve.client import Client
from pdserve.rpc_keepalive import PING_EVERY_S, PING_TIMEOUT_S

UNAVAILABLE = netns.unavailable_reason()   # checked at collection: no engine starts only to be skipped
pytestmark = [pytest.mark.integration, pytest.mark.skipif(bool(UNAVAILABLE), reason=UNAVAILABLE)]

HOSTS = ("router", "prefill", "decode-a", "decode-b")
LEASE_S = 8.0          # the prefill worker's hold on KV nobody pulled
TTL_S = 3.0            # the registry lease of a worker that stops heartbeating
PULL_TIMEOUT_S = 8.0   # the workers' --kv-pull-timeout-s: every wait of a pull


class Placement:
    """Redis and the router on "router", the prefill worker on "prefill", the decode workers on
    "decode-a" and "decode-b" in the order they start."""

    def __init__(self, topo: netns.Topology):
        self.topo = topo
        self.host_names: dict[str, str] = {"redis": "router", "router": "router"}

    def __call__(self, process: str) -> Host:
        if process not in self.host_names:
            free = [h for h in ("decode-a", "decode-b") if h not in self.host_names.values()]
            self.host_names[process] = "prefill" if process.startswith("prefill") else free[0]
        host = self.topo[self.host_names[process]]
        return Host(host.address, host.command_prefix)


@pytest.fixture(scope="module")
def hosts(tiny_model, tmp_path_factory):
    """(topology, placement, cluster): 1 prefill + 2 decode workers, each on its own host."""
    with netns.topology(HOSTS) as topo:
        placement = Placement(topo)
        spec = ClusterSpec(engine=engine_settings(tiny_model), num_decode=2, transport="tcp",
                           cpu_cores={"prefill": "0", "decode": "1"}, ttl_s=TTL_S, lease_s=LEASE_S,
                           kv_pull_timeout_s=PULL_TIMEOUT_S, log_dir=str(tmp_path_factory.mktemp("hosts-apart")),
                           router_flags=("--insecure",))   # plaintext beyond loopback: a private test link
        with LocalCluster(spec, hosts=placement) as cluster:
            yield topo, placement, cluster
            topo.heal()   # a failed test may have left a cable cut, lossy or slow


def _generate(client: Client, token_ids: list[int], max_tokens: int, timeout_s: float):
    """(tokens, last chunk, seconds) of one greedy request."""
    started = time.monotonic()
    chunks = list(client.generate(token_ids=token_ids, max_tokens=max_tokens, temperature=0, ignore_eos=True,
                                  timeout_s=timeout_s))
    return [t for chunk in chunks for t in chunk.token_ids], chunks[-1], time.monotonic() - started


def _by_length(prompts, reference_outputs, length: int) -> tuple[list[int], list[int]]:
    prompt, expected = next((p, e) for p, e in zip(prompts, reference_outputs) if len(p["token_ids"]) == length)
    return prompt["token_ids"], expected


def test_requests_across_hosts_get_the_reference_tokens_with_their_kv_carried_over_the_cable(
        hosts, tiny_model, prompts, reference_outputs):
    topo, placement, cluster = hosts
    assert {w: placement.host_names[w] for w in cluster.workers} == {
        "prefill-0": "prefill", "decode-1": "decode-a", "decode-2": "decode-b"}
    assert cluster.grpc_target.startswith(topo["router"].address + ":")
    sent_before = topo.sent_bytes("prefill")
    kv_bytes = 0
    with Client(cluster.grpc_target) as client:
        for length in (100, 257, 511):
            token_ids, expected = _by_length(prompts, reference_outputs, length)
            tokens, last, _ = _generate(client, token_ids, len(expected), timeout_s=60)
            assert tokens == expected, f"prompt of {length} tokens"
            timings = last.timings
            assert (timings.prefill_worker, timings.kv_transfer_blocks) == ("prefill-0", blocks_for(length))
            assert timings.kv_transfer_bytes == blocks_for(length) * kv_bytes_per_block(tiny_model)
            kv_bytes += timings.kv_transfer_bytes
    assert topo.sent_bytes("prefill") - sent_before >= kv_bytes   # the blocks left the prefill host by its cable


def test_a_decode_host_cut_mid_stream_resumes_on_the_other_decode_host_with_the_same_tokens(hosts):
    """With a second decode host the request completes, not UNAVAILABLE: the router's keepalive
    pings go unanswered, the call fails UNAVAILABLE within PING_EVERY_S + PING_TIMEOUT_S, and the
    decode resumes on the other host from the tokens already sent. The client sees no error."""
    topo, placement, cluster = hosts
    token_ids, max_tokens = list(range(40, 140)), 600
    with Client(cluster.grpc_target) as client:
        unbroken, _, _ = _generate(client, token_ids, max_tokens, timeout_s=60)
        stream = client.generate(token_ids=token_ids, max_tokens=max_tokens, temperature=0, ignore_eos=True,
                                 timeout_s=120)
        chunks = [next(stream) for _ in range(5)]
        serving = [w for w in cluster.worker_ids("decode") if worker_load(cluster, w).num_running > 0]
        assert len(serving) == 1
        topo.cut(placement.host_names[serving[0]])
        cut_at = time.monotonic()
        try:
            chunks += list(stream)
            resumed_after_s = time.monotonic() - cut_at
        finally:
            topo.restore(placement.host_names[serving[0]])
    assert [t for chunk in chunks for t in chunk.token_ids] == unbroken and len(unbroken) == max_tokens
    assert chunks[-1].timings.decode_worker not in ("", serving[0])
    # the pings' deadline, the resumed decode (a prompt of 700 tokens, then the rest) and a margin for 2 busy cores
    assert resumed_after_s < PING_EVERY_S + PING_TIMEOUT_S + 20


def test_a_prefill_host_cut_mid_transfer_costs_a_recompute_and_its_lease_lapses(hosts, prompts, reference_outputs):
    """The prefill host's cable is slowed so its 1000-token prompt's 32 blocks take seconds to
    cross, and cut once some of them crossed. The pull times out (PULL_TIMEOUT_S), the decode
    worker computes the prompt itself (vLLM's recompute): the reference's tokens. The KV the
    prefill worker leased for it is freed when the lease ends, nobody having released it."""
    topo, placement, cluster = hosts
    token_ids, expected = _by_length(prompts, reference_outputs, 1000)
    topo.limit_rate("prefill", mbit=4)   # 2 MiB of KV: about 4 s
    try:
        with Client(cluster.grpc_target) as client:
            stream = client.generate(token_ids=token_ids, max_tokens=len(expected), temperature=0, ignore_eos=True,
                                     timeout_s=PULL_TIMEOUT_S + 60)
            chunks = [next(stream)]   # the prefill worker's first token: the decode worker pulls now
            sent_before, deadline = topo.sent_bytes("prefill"), time.monotonic() + 10
            while topo.sent_bytes("prefill") - sent_before < 256 << 10 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert topo.sent_bytes("prefill") - sent_before >= 256 << 10, "the pull never started"
            topo.cut("prefill")
            cut_at = time.monotonic()
            chunks += list(stream)
            finished_after_s = time.monotonic() - cut_at
    finally:
        topo.restore("prefill")
        topo.limit_rate("prefill", mbit=0)
    timings = chunks[-1].timings
    assert [t for chunk in chunks for t in chunk.token_ids] == expected
    assert timings.kv_transfer_blocks == 0 and timings.decode_computed_prompt_tokens > 0
    assert finished_after_s < PULL_TIMEOUT_S + 15
    loads = wait_until_idle(cluster, timeout_s=LEASE_S + 10)
    assert (loads["prefill-0"].kv_blocks_used, loads["prefill-0"].pending_transfers) == (0, 0)


def test_a_host_whose_cable_returns_registers_again_and_serves(hosts, prompts, reference_outputs):
    """Each decode host in turn is the only one left (the other cut until its registry lease
    lapses): requests land there, the prefill host's KV crosses to it, the reference's tokens.
    Then both are back, and no KV block is held anywhere."""
    topo, placement, cluster = hosts
    wait_for_workers(cluster, 3)
    with Client(cluster.grpc_target) as client:
        for serving, length in (("decode-1", 129), ("decode-2", 200)):
            other = next(w for w in cluster.worker_ids("decode") if w != serving)
            topo.cut(placement.host_names[other])
            try:
                deadline = time.monotonic() + TTL_S + 10
                while client.model_info().num_decode_workers != 1 and time.monotonic() < deadline:
                    time.sleep(0.1)
                token_ids, expected = _by_length(prompts, reference_outputs, length)
                tokens, last, _ = _generate(client, token_ids, len(expected), timeout_s=60)
            finally:
                topo.restore(placement.host_names[other])
            assert tokens == expected
            assert (last.timings.decode_worker, last.timings.kv_transfer_blocks) == (serving, blocks_for(length))
            wait_for_workers(cluster, 3)
    loads = wait_until_idle(cluster)
    assert {w: (l.kv_blocks_used, l.pending_transfers, l.num_running) for w, l in loads.items()} == {
        w: (0, 0, 0) for w in cluster.workers}


def test_lossy_cables_cost_retransmissions_not_tokens(hosts, prompts, reference_outputs):
    topo, _, cluster = hosts
    reason = netns.lossless_reason()
    if reason:
        pytest.skip(reason)
    try:
        for name in ("prefill", "decode-a", "decode-b"):
            topo.lose(name, percent=10)
        with Client(cluster.grpc_target) as client:
            for length in (65, 96, 128):   # prompts no decode worker has cached: their KV crosses
                token_ids, expected = _by_length(prompts, reference_outputs, length)
                tokens, last, seconds = _generate(client, token_ids, len(expected), timeout_s=60)
                assert tokens == expected, f"prompt of {length} tokens"
                assert last.timings.kv_transfer_blocks == blocks_for(length) and seconds < 30
    finally:
        for name in ("prefill", "decode-a", "decode-b"):
            topo.lose(name, percent=0)
    loads = wait_until_idle(cluster)
    assert {w: l.kv_blocks_used for w, l in loads.items()} == {w: 0 for w in cluster.workers}


def test_delayed_cables_cost_time_not_tokens(hosts, prompts, reference_outputs):
    topo, _, cluster = hosts
    try:
        topo.delay("prefill", ms=40)
    except netns.NetnsError as error:
        pytest.skip(f"tc netem is not available (the kernel has no sch_netem, CONFIG_NET_SCH_NETEM): {error}")
    try:
        topo.delay("decode-a", ms=40)
        topo.delay("decode-b", ms=40)
        with Client(cluster.grpc_target) as client:
            for length in (31, 33):
                token_ids, expected = _by_length(prompts, reference_outputs, length)
                tokens, last, seconds = _generate(client, token_ids, len(expected), timeout_s=60)
                assert tokens == expected, f"prompt of {length} tokens"
                assert 0.04 <= last.timings.ttft_s and seconds < 30   # the prefill host's reply left 40 ms late
    finally:
        for name in ("prefill", "decode-a", "decode-b"):
            topo.delay(name, ms=0)
