"""Both transports over real sockets between two KV layouts (one process, server threads)."""

import socket
import time
from datetime import timedelta

import pytest
import torch

from kv_transfer.auth import authenticate_to_producer, process_credentials
from kv_transfer.consumer import PullClient, release_transfer
from kv_transfer.layout import KVLayout
from kv_transfer.leases import Lease, LeaseTable
from kv_transfer.producer import TransferServer
from kv_transfer.wire import PeerClosed, TransferError, encode, expect, recv_message, send_message


def _caches(seed: int, layers: int = 4, num_blocks: int = 32):
    generator = torch.Generator().manual_seed(seed)
    return {f"layer.{i}": torch.randn(num_blocks, 2, 32, 64, generator=generator).to(torch.bfloat16)
            for i in range(layers)}


def _eventually(read, expected, timeout_s=5.0):
    """`read()` once it equals `expected` (the producer counts a pull when it reads DONE, just
    after the consumer's pull returns), or its last value after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    value = read()
    while value != expected and time.monotonic() < deadline:
        time.sleep(0.005)
        value = read()
    return value


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
    assert _eventually(lambda: server.stats.bytes_sent, result.num_bytes) == result.num_bytes
    assert client.release(address, "t1") is True
    assert leases.take_released() == {"r1"}
    client.close()


@pytest.mark.parametrize("transport", ["tcp", "torch"])
def test_pull_of_a_released_transfer_fails_and_the_next_pull_works(producer, transport):
    _, leases, address, server = producer
    leases.grant(Lease("gone", "r1", (1,), 10, time.monotonic() + 30))
    leases.grant(Lease("kept", "r2", (2,), 10, time.monotonic() + 30))
    assert release_transfer(address, "gone") is True
    layout = KVLayout(_caches(1), 32)
    client = PullClient(layout, layout.compat("tiny", 32), transport)
    with pytest.raises(TransferError, match="no KV held for transfer gone"):
        client.pull(address, "gone", [1], [3])
    assert client.pull(address, "kept", [2], [3]).num_blocks == 1
    assert server.stats.data_channels == 1  # MISSING is an answer, not a broken connection
    client.close()


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


def _server(caches, leases, **kwargs):
    layout = KVLayout(caches, 32)
    return TransferServer(layout, layout.compat("tiny", 32), leases, "127.0.0.1", kwargs.pop("port", 0), **kwargs)


def _client(transport="tcp", timeout_s=30.0, seed=1):
    target = _caches(seed)
    layout = KVLayout(target, 32)
    return target, PullClient(layout, layout.compat("tiny", 32), transport, timeout_s)


@pytest.mark.parametrize("transport", ["tcp", "torch"])
def test_a_connection_idle_longer_than_the_io_timeout_still_serves_the_next_pull(transport):
    """The producer's I/O timeout bounds waits inside an exchange, never the idle time between
    two: a decode worker idle for a while must not find its connection gone (and recompute)."""
    source, leases = _caches(0), LeaseTable()
    server = _server(source, leases, io_timeout_s=0.3)
    address = f"127.0.0.1:{server.start()}"
    try:
        for i in range(2):
            leases.grant(Lease(f"idle{i}", f"r{i}", (i,), 32, time.monotonic() + 30))
        target, client = _client(transport)
        assert client.pull(address, "idle0", [0], [5]).attempts == 1
        time.sleep(1.0)  # idle for 3x the producer's I/O timeout
        assert client.pull(address, "idle1", [1], [6]).attempts == 1
        stats = server.stats
        assert _eventually(lambda: (stats.connections, stats.data_channels, stats.transfers), (1, 1, 2)) == (1, 1, 2)
        for name in source:
            assert torch.equal(source[name][[0, 1]], target[name][[5, 6]])
        client.close()
    finally:
        server.stop()


@pytest.mark.parametrize("transport", ["tcp", "torch"])
def test_a_cached_connection_to_a_restarted_producer_is_redialed_once(transport):
    """The producer restarts at the same address: the cached connection is dead before any byte
    of the reply, so the pull runs again on a fresh connection instead of failing."""
    source, leases = _caches(0), LeaseTable()
    first = _server(source, leases)
    port = first.start()
    leases.grant(Lease("before", "r1", (3,), 32, time.monotonic() + 30))
    leases.grant(Lease("after", "r2", (4,), 32, time.monotonic() + 30))
    target, client = _client(transport)
    assert client.pull(f"127.0.0.1:{port}", "before", [3], [7]).attempts == 1
    first.stop()
    second = _server(source, leases, port=port)
    second.start()
    try:
        result = client.pull(f"127.0.0.1:{port}", "after", [4], [8])
        assert (result.attempts, result.num_blocks) == (2, 1)
        assert second.stats.data_channels == 1
        for name in source:
            assert torch.equal(source[name][4], target[name][8])
        client.close()
    finally:
        second.stop()


@pytest.mark.parametrize("transport", ["tcp", "torch"])
def test_a_pull_with_release_frees_the_lease_on_its_own_connection(producer, transport):
    _, leases, address, server = producer
    leases.grant(Lease("t1", "r1", (5, 6), 64, time.monotonic() + 30))
    _, client = _client(transport)
    assert client.pull(address, "t1", [5, 6], [1, 2], release=True).num_blocks == 2
    assert _eventually(lambda: server.num_held_leases, 0) == 0  # released when the producer reads DONE
    assert leases.take_released() == {"r1"}
    assert (server.stats.connections, leases.num_held) == (1, 0)
    with pytest.raises(TransferError, match="no KV held for transfer t1"):
        client.pull(address, "t1", [5, 6], [1, 2])
    client.close()


def _raw_consumer(address: str, compat: dict, transport: str = "tcp", **fields) -> socket.socket:
    """A consumer that speaks the wire protocol by hand, to hold an exchange at a chosen point."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    _, proof = authenticate_to_producer(sock, process_credentials(), compat["model_fingerprint"])
    sock.sendall(proof + encode({"op": "HELLO", "compat": compat, "transport": transport, **fields}))
    expect(recv_message(sock), "WELCOME")
    return sock


def test_a_release_during_a_send_takes_effect_when_the_send_ends(producer):
    """The abort arrives while the consumer is still reading the blocks: the producer must not let
    the engine reuse them until the send is over (it would send another request's KV)."""
    source, leases, address, server = producer
    leases.grant(Lease("t1", "r1", tuple(range(20)), 640, time.monotonic() + 30))
    layout = KVLayout(_caches(1), 32)
    sock = _raw_consumer(address, layout.compat("tiny", 32).to_dict())
    with sock:
        send_message(sock, {"op": "PULL", "transfer_id": "t1", "block_ids": list(range(20)),
                            "local_block_ids": list(range(20)), "release": False})
        assert expect(recv_message(sock), "SENDING")["num_bytes"] == 20 * layout.bytes_per_block
        assert release_transfer(address, "t1") is True        # the abort, mid-send
        time.sleep(0.2)
        assert leases.take_released() == set() and leases.num_held == 1
        received = bytearray(20 * layout.bytes_per_block)
        view, got = memoryview(received), 0
        while got < len(received):
            got += sock.recv_into(view[got:])
        send_message(sock, {"op": "DONE"})
        assert _eventually(lambda: leases.num_held, 0) == 0
        assert leases.take_released() == {"r1"}
    assert bytes(received[: layout.bytes_per_block // 4]) == \
        source["layer.0"][0].view(torch.uint8).reshape(-1).numpy().tobytes()


def test_an_expired_lease_is_never_served(producer):
    _, leases, address, server = producer
    leases.grant(Lease("late", "r1", (1,), 32, time.monotonic() - 0.001))  # expire() has not run
    _, client = _client()
    with pytest.raises(TransferError, match="no KV held for transfer late"):
        client.pull(address, "late", [1], [2])
    assert leases.take_released() == {"r1"} and server.stats.transfers == 0
    client.close()


def test_a_consumer_that_never_joins_the_torch_group_is_dropped_after_the_io_timeout():
    """The process group's timeout is the I/O timeout, not a fixed minute."""
    import torch.distributed as dist

    leases = LeaseTable()
    server = _server(_caches(0), leases, io_timeout_s=1.0)
    address = f"127.0.0.1:{server.start()}"
    store = dist.TCPStore("127.0.0.1", 0, world_size=2, is_master=True, timeout=timedelta(seconds=30),
                          wait_for_workers=False)
    try:
        layout = KVLayout(_caches(1), 32)
        sock = _raw_consumer(address, layout.compat("tiny", 32).to_dict(), "torch", store_host="127.0.0.1",
                             store_port=store.port, pair_id="never-joins")
        started = time.monotonic()
        with sock, pytest.raises((PeerClosed, ConnectionResetError)):
            sock.settimeout(20)
            recv_message(sock)  # the producer gives up on the group and closes the connection
        assert time.monotonic() - started < 10
    finally:
        server.stop()
