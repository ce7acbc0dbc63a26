"""Both transports over real sockets between two KV layouts (one process, server threads)."""

import time

import pytest
import torch

from kv_transfer.consumer import PullClient, release_transfer
from kv_transfer.layout import KVLayout
from kv_transfer.leases import Lease, LeaseTable
from kv_transfer.producer import TransferServer
from kv_transfer.wire import IncompatiblePeer, TransferError


def _caches(seed: int, layers: int = 4, num_blocks: int = 32):
    generator = torch.Generator().manual_seed(seed)
    return {f"layer.{i}": torch.randn(num_blocks, 2, 32, 64, generator=generator).to(torch.bfloat16)
            for i in range(layers)}


@pytest.fixture
def producer():
    caches = _caches(0)
    layout = KVLayout(caches, 32)
    leases = LeaseTable()
    server = TransferServer(layout, layout.compat("tiny", 32), leases, "127.0.0.1", 0, grant_wait_s=0.5)
    port = server.start()
    yield caches, leases, f"127.0.0.1:{port}", server
    server.stop()


@pytest.mark.parametrize("transport", ["tcp", "torch"])
def test_pull_copies_exactly_the_leased_blocks_into_the_local_ones(producer, transport):
    source, leases, address, server = producer
    leases.grant(Lease("t1", "r1", (5, 6, 7, 20), 100, time.monotonic() + 30))
    target = _caches(1)
    layout = KVLayout(target, 32)
    untouched = {name: t[0].clone() for name, t in target.items()}
    client = PullClient(layout, layout.compat("tiny", 32), transport)
    result = client.pull(address, "t1", [5, 6, 7, 20], [1, 2, 9, 10])
    for name in source:
        assert torch.equal(source[name][[5, 6, 7, 20]], target[name][[1, 2, 9, 10]])
        assert torch.equal(untouched[name], target[name][0])
    assert result.num_bytes == 4 * layout.bytes_per_block == 4 * 4 * 2 * 32 * 64 * 2
    deadline = time.monotonic() + 5  # the producer counts once its send returns, maybe after our recv
    while server.stats.bytes_sent != result.num_bytes and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.stats.bytes_sent == result.num_bytes
    assert client.release(address, "t1") is True
    assert leases.take_released() == {"r1"}
    client.close()


@pytest.mark.parametrize("transport", ["tcp", "torch"])
def test_pull_of_a_released_transfer_fails_and_the_next_pull_works(producer, transport):
    _, leases, address, _ = producer
    leases.grant(Lease("gone", "r1", (1,), 10, time.monotonic() + 30))
    leases.grant(Lease("kept", "r2", (2,), 10, time.monotonic() + 30))
    assert release_transfer(address, "gone") is True
    layout = KVLayout(_caches(1), 32)
    client = PullClient(layout, layout.compat("tiny", 32), transport)
    with pytest.raises(TransferError, match="no KV held for transfer gone"):
        client.pull(address, "gone", [1], [3])
    assert client.pull(address, "kept", [2], [3]).num_blocks == 1
    client.close()


def test_handshake_refuses_a_mismatched_peer_with_the_differences(producer):
    _, leases, address, server = producer
    layout = KVLayout(_caches(1, layers=5), 32)
    client = PullClient(layout, layout.compat("bench", 32), "tcp")
    with pytest.raises(IncompatiblePeer, match=r"model: 'tiny' here vs 'bench' at the peer.*num_layers: 4 here vs 5"):
        client.pull(address, "t1", [1], [1])
    assert server.stats.refused_handshakes == 1


def test_pull_from_a_dead_producer_fails_fast():
    layout = KVLayout(_caches(1), 32)
    client = PullClient(layout, layout.compat("tiny", 32), "tcp", timeout_s=2)
    started = time.monotonic()
    with pytest.raises((TransferError, OSError)):
        client.pull("127.0.0.1:1", "t1", [1], [1])
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("transport", ["tcp", "torch"])
def test_concurrent_first_pulls_to_one_producer_share_one_handshake(producer, transport):
    from concurrent.futures import ThreadPoolExecutor

    source, leases, address, server = producer
    for i in range(6):
        leases.grant(Lease(f"c{i}", f"r{i}", (i,), 10, time.monotonic() + 30))
    target = _caches(1)
    layout = KVLayout(target, 32)
    client = PullClient(layout, layout.compat("tiny", 32), transport)
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda i: client.pull(address, f"c{i}", [i], [10 + i]), range(6)))
    assert [r.num_blocks for r in results] == [1] * 6
    assert server.stats.data_channels == 1
    for name in source:
        assert torch.equal(source[name][0:6], target[name][10:16])
    client.close()


def test_paired_runs_cut_both_sides_at_the_same_places():
    from kv_transfer.layout import coalesce_paired

    remote, local = [5, 6, 7, 20], [1, 2, 9, 10]
    assert coalesce_paired(remote, local) == [(5, 7), (7, 8), (20, 21)]
    assert coalesce_paired(local, remote) == [(1, 3), (9, 10), (10, 11)]
    assert coalesce_paired([3, 4, 5], [0, 1, 2]) == [(3, 6)]


@pytest.mark.parametrize("transport", ["tcp", "torch"])
def test_a_long_run_per_layer_moves_intact(transport):
    """40 consecutive blocks of 8 KiB per layer: the torch transport sends one message per layer."""
    source = _caches(3, num_blocks=96)
    layout = KVLayout(source, 96)
    leases = LeaseTable()
    server = TransferServer(layout, layout.compat("tiny", 32), leases, "127.0.0.1", 0)
    address = f"127.0.0.1:{server.start()}"
    try:
        leases.grant(Lease("long", "r1", tuple(range(10, 50)), 40 * 32, time.monotonic() + 30))
        target = _caches(4, num_blocks=96)
        local_layout = KVLayout(target, 96)
        client = PullClient(local_layout, local_layout.compat("tiny", 32), transport)
        result = client.pull(address, "long", list(range(10, 50)), list(range(50, 90)))
        assert result.num_bytes == 40 * layout.bytes_per_block
        for name in source:
            assert torch.equal(source[name][10:50], target[name][50:90])
        client.close()
    finally:
        server.stop()
