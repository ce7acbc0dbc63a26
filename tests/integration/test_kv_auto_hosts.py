"""`auto` picks shm only where the consumer can really read the producer's memory.

A second "host" is a network namespace joined to this one by a veth link, with its own /dev/shm
(a private mount namespace and tmpfs), as another machine has. The consumer there reaches the
producer over the link, is offered the segment (the kernel's boot id is the same: one kernel),
cannot open it, and takes tcp; the same consumer sharing our /dev/shm takes shm. With the cluster
secret, `kv_encryption=auto` (the default) encrypts the link to the other host. Skipped where
namespaces cannot be made (not root, no `ip`/`unshare`).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import time

import pytest
import torch

from kv_transfer.auth import Credentials
from kv_transfer.geometry import BlockGeometry
from kv_transfer.layout import KVLayout
from kv_transfer.leases import Lease, LeaseTable
from kv_transfer.producer import TransferServer
from kv_transfer.shm_segment import Segment
from kv_transfer.transports.base import SERVED
from kv_transfer.transports.shm import SharedCache

pytestmark = pytest.mark.integration

GEOMETRY = BlockGeometry(num_layers=2, num_kv_heads=2, head_dim=32, block_size=32, dtype="bfloat16")
NUM_BLOCKS = 16
HOST_ADDRESS, PEER_ADDRESS = "10.201.7.1", "10.201.7.2"  # the test's own link, inside its namespaces

CONSUMER = """
import hashlib, json, sys
import torch
from kv_transfer.consumer import PullClient
from kv_transfer.geometry import BlockGeometry
from kv_transfer.layout import KVLayout
geometry = BlockGeometry(**json.loads(sys.argv[1]))
caches = geometry.caches({num_blocks})
layout = KVLayout(caches, {num_blocks})
client = PullClient(layout, layout.compat("m", 32), "auto", timeout_s=10)
client.pull(sys.argv[2], sys.argv[3], [2, 3], [0, 1], release=True)
connection = next(iter(client._connections.values()))
digest = hashlib.sha256(b"".join(t[[0, 1]].contiguous().view(torch.uint8).numpy().tobytes()
                                 for _, t in sorted(caches.items()))).hexdigest()
print(json.dumps({{"channel": connection.channel.kind, "digest": digest}}))
client.close()
"""


SEALED_CONSUMER = """
import hashlib, json, os, sys
import torch
from kv_transfer.auth import Credentials
from kv_transfer.consumer import PullClient
from kv_transfer.geometry import BlockGeometry
from kv_transfer.layout import KVLayout
geometry = BlockGeometry(**json.loads(sys.argv[1]))
caches = geometry.caches({num_blocks})
layout = KVLayout(caches, {num_blocks})
credentials = Credentials("decode-far", bytes.fromhex(os.environ["PDSERVE_TEST_KV_SECRET"]), "auto")
client = PullClient(layout, layout.compat("m", 32), "tcp", timeout_s=10, credentials=credentials)
client.pull(sys.argv[2], sys.argv[3], [2, 3], [0, 1], release=True)
connection = next(iter(client._connections.values()))
digest = hashlib.sha256(b"".join(t[[0, 1]].contiguous().view(torch.uint8).numpy().tobytes()
                                 for _, t in sorted(caches.items()))).hexdigest()
print(json.dumps({{"socket": type(connection.sock).__name__, "digest": digest}}))
client.close()
"""


def _run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@pytest.fixture
def peer_host():
    """A network namespace linked to this one; yields the `ip netns exec` prefix."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"):
        pytest.skip("network namespaces need root and iproute2/util-linux")
    name = f"pdserve-kv-{secrets.token_hex(3)}"
    host_link, peer_link = f"pdh{name[-6:]}", f"pdp{name[-6:]}"
    try:
        _run(["ip", "netns", "add", name])
        _run(["ip", "link", "add", host_link, "type", "veth", "peer", "name", peer_link])
        _run(["ip", "link", "set", peer_link, "netns", name])
        _run(["ip", "addr", "add", f"{HOST_ADDRESS}/30", "dev", host_link])
        _run(["ip", "link", "set", host_link, "up"])
        for command in (["ip", "addr", "add", f"{PEER_ADDRESS}/30", "dev", peer_link],
                        ["ip", "link", "set", peer_link, "up"], ["ip", "link", "set", "lo", "up"]):
            _run(["ip", "netns", "exec", name, *command])
    except (subprocess.CalledProcessError, OSError) as error:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        pytest.skip(f"cannot make a network namespace here: {error}")
    yield ["ip", "netns", "exec", name]
    subprocess.run(["ip", "link", "del", host_link], capture_output=True)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.fixture
def producer():
    segment = Segment(GEOMETRY.cache_bytes(NUM_BLOCKS))
    caches = GEOMETRY.caches(NUM_BLOCKS, memory=segment.tensor)
    for index, tensor in enumerate(caches.values()):
        tensor.view(torch.uint8).copy_(torch.randint(0, 256, tensor.view(torch.uint8).shape, dtype=torch.uint8,
                                                     generator=torch.Generator().manual_seed(index)))
    layout = KVLayout(caches, NUM_BLOCKS)
    leases = LeaseTable()
    server = TransferServer(layout, layout.compat("m", 32), leases, HOST_ADDRESS, 0, grant_wait_s=2,
                            transports=SERVED["auto"], shared_cache=SharedCache.of(segment, caches, NUM_BLOCKS))
    server.start()
    expected = hashlib.sha256(b"".join(t[[2, 3]].contiguous().view(torch.uint8).numpy().tobytes()
                                       for _, t in sorted(caches.items()))).hexdigest()
    yield leases, server, expected
    server.stop()
    segment.close()


def _pull_from(prefix: list[str], producer, transfer_id: str, script: str = CONSUMER, env: dict | None = None) -> dict:
    leases, server, _ = producer
    leases.grant(Lease(transfer_id, f"r-{transfer_id}", (2, 3), 64, time.monotonic() + 30))
    geometry = json.dumps({"num_layers": GEOMETRY.num_layers, "num_kv_heads": GEOMETRY.num_kv_heads,
                           "head_dim": GEOMETRY.head_dim, "block_size": GEOMETRY.block_size, "dtype": GEOMETRY.dtype})
    code = script.format(num_blocks=NUM_BLOCKS)
    run = subprocess.run([*prefix, sys.executable, "-c", code, geometry, f"{HOST_ADDRESS}:{server.port}", transfer_id],
                         capture_output=True, text=True, timeout=120,
                         env=os.environ | {"PYTHONPATH": os.getcwd(), **(env or {})})
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_consumer_on_another_host_takes_tcp_and_gets_the_same_bytes(peer_host, producer):
    other_host = [*peer_host, "unshare", "--mount", "--propagation", "private", "sh", "-c",
                  'mount -t tmpfs tmpfs /dev/shm && exec "$@"', "sh"]
    result = _pull_from(other_host, producer, "far")
    assert result == {"channel": "buffers", "digest": producer[2]}  # tcp: socket buffers
    assert producer[1].stats.mapped_channels == 0


def test_a_consumer_in_another_network_namespace_of_this_host_reads_shared_memory(peer_host, producer):
    """Same kernel, same /dev/shm: one host, whatever its network namespaces; shm is right there."""
    result = _pull_from(peer_host, producer, "near")
    assert result == {"channel": "mapped", "digest": producer[2]}
    assert producer[1].stats.mapped_channels == 1


def test_a_link_to_another_host_is_encrypted_by_default_and_delivers_the_same_bytes(peer_host):
    secret = secrets.token_bytes(32)
    caches = GEOMETRY.caches(NUM_BLOCKS, seed=3)
    layout = KVLayout(caches, NUM_BLOCKS)
    leases = LeaseTable()
    server = TransferServer(layout, layout.compat("m", 32), leases, HOST_ADDRESS, 0, grant_wait_s=2,
                            transports=("tcp",), credentials=Credentials("prefill-near", secret))
    server.start()
    expected = hashlib.sha256(b"".join(t[[2, 3]].contiguous().view(torch.uint8).numpy().tobytes()
                                       for _, t in sorted(caches.items()))).hexdigest()
    try:
        result = _pull_from(peer_host, (leases, server, expected), "sealed", SEALED_CONSUMER,
                            {"PDSERVE_TEST_KV_SECRET": secret.hex()})
        assert result == {"socket": "SealedSocket", "digest": expected}
        assert (server.stats.data_channels, server.stats.sealed_channels) == (1, 1)
        deadline = time.monotonic() + 5
        while leases.num_held and time.monotonic() < deadline:   # the release rides the consumer's DONE
            time.sleep(0.01)
        assert (server.stats.transfers, leases.num_held) == (1, 0)
    finally:
        server.stop()
