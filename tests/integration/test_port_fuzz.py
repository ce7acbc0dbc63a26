"""Random bytes at every TCP port a live cluster's processes listen on (the router's gRPC and HTTP
ports, each worker's gRPC, KV and metrics ports, and whatever vLLM's own processes open): every
connection ends or is abandoned by us, no process dies, none grows its memory by more than a
bound, and the cluster serves a request afterwards (issue 17: "random bytes on every port").
Bounded to a few seconds; `HYPOTHESIS_PORT_EXAMPLES=500` hunts longer."""

from __future__ import annotations

import os
import socket

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdserve.client import Client

pytestmark = pytest.mark.integration

EXAMPLES = int(os.environ.get("HYPOTHESIS_PORT_EXAMPLES", "40"))
READ_TIMEOUT_S = 0.3           # most servers wait for a whole request: we give up first, as a scanner would
MAX_RSS_GROWTH_BYTES = 64 << 20


def cluster_processes(cluster) -> list[psutil.Process]:
    roots = [cluster.router.pid, *(worker.pid for worker in cluster.workers.values())]
    processes = []
    for pid in roots:
        root = psutil.Process(pid)
        processes += [root, *root.children(recursive=True)]
    return processes


def listening_ports(processes: list[psutil.Process]) -> dict[int, str]:
    """port -> "pid/name" of every TCP socket the processes listen on (IPv4 and IPv6)."""
    ports = {}
    for process in processes:
        for connection in process.net_connections(kind="tcp"):
            if connection.status == psutil.CONN_LISTEN:
                ports[connection.laddr.port] = f"{process.pid}/{process.name()}"
    return ports


def poke(port: int, payload: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=2.0) as sock:
        sock.settimeout(READ_TIMEOUT_S)
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
        except OSError:  # a timeout (still waiting for more), a reset or ENOTCONN (it dropped us): all fine
            pass  # what matters is the process after


@pytest.fixture(scope="module")
def before(tcp_cluster):
    processes = cluster_processes(tcp_cluster)
    ports = listening_ports(processes)
    assert len(ports) >= 6, ports  # router gRPC + HTTP; per worker gRPC + metrics; the prefill worker's KV port
    return processes, {p.pid: p.memory_info().rss for p in processes}, sorted(ports)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_bytes_at_any_listening_port_end_the_connection_and_nothing_else(before, data):
    processes, _, ports = before
    port = data.draw(st.sampled_from(ports), label="port")
    payload = data.draw(st.one_of(st.binary(min_size=1, max_size=4096),
                                  st.binary(min_size=1, max_size=64).map(lambda b: b * 256)), label="payload")
    poke(port, payload)
    dead = [p.pid for p in processes if not p.is_running() or p.status() == psutil.STATUS_ZOMBIE]
    assert dead == [], f"bytes at port {port} killed {dead}"


def test_after_the_bytes_every_process_lives_within_its_memory_and_the_cluster_serves(tcp_cluster, before):
    processes, rss_before, _ = before
    for process in processes:
        assert process.is_running() and process.status() != psutil.STATUS_ZOMBIE, f"{process.pid} died"
        grown = process.memory_info().rss - rss_before[process.pid]
        assert grown < MAX_RSS_GROWTH_BYTES, f"{process.pid} ({process.name()}) grew {grown >> 20} MiB"
    with Client(tcp_cluster.grpc_target) as client:
        chunks = list(client.generate(token_ids=[11, 12, 13, 14], max_tokens=4, ignore_eos=True))
    assert sum(len(c.token_ids) for c in chunks) == 4 and chunks[-1].finished
