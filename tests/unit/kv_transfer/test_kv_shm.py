"""The one-sided shared-memory transport: the handshake's choice, exact block copies, the one-round-trip
and vouched pulls (the segment itself: test_kv_shm_segment.py)."""

from __future__ import annotations

import time

import pytest
import torch

from kv_transfer.consumer import PullClient
from kv_transfer.geometry import BlockGeometry
from kv_transfer.layout import KVLayout
from kv_transfer.lease_board import LeaseBoard
from kv_transfer.leases import Lease, LeaseTable
from kv_transfer.producer import TransferServer
from kv_transfer.shm_segment import Segment, map_segment
from kv_transfer.transports.base import SERVED
from kv_transfer.transports.shm import SharedCache, ShmConsumerChannel, ShmTransport
from kv_transfer.wire import IncompatiblePeer, TransferError

GEOMETRY = BlockGeometry(num_layers=3, num_kv_heads=2, head_dim=32, block_size=32, dtype="bfloat16")
NUM_BLOCKS = 24


def _producer(transport: str, in_segment: bool, board: bool = True):
    """A transfer server whose cache (seeded bytes) is in a segment or in ordinary memory; with
    `board`, its leases are published on the segment's lease board, as a prefill worker's are."""
    segment = Segment(GEOMETRY.cache_bytes(NUM_BLOCKS)) if in_segment else None
    caches = GEOMETRY.caches(NUM_BLOCKS, seed=None, memory=segment.tensor if segment else None)
    for index, tensor in enumerate(caches.values()):
        tensor.view(torch.uint8).copy_(torch.randint(0, 256, tensor.view(torch.uint8).shape, dtype=torch.uint8,
                                                     generator=torch.Generator().manual_seed(index)))
    layout = KVLayout(caches, NUM_BLOCKS)
    leases = LeaseTable()
    if segment is not None and board:
        leases.attach_board(LeaseBoard(segment.board_area()))   # as a prefill worker's
    shared = SharedCache.of(segment, caches, NUM_BLOCKS) if segment else None
    server = TransferServer(layout, layout.compat("m", 32), leases, "127.0.0.1", 0, grant_wait_s=0.5,
                            transports=SERVED[transport], shared_cache=shared)
    return caches, leases, f"127.0.0.1:{server.start()}", server, segment


@pytest.fixture
def shm_producer():
    caches, leases, address, server, segment = _producer("shm", in_segment=True)
    yield caches, leases, address, server
    server.stop()
    segment.close()


def _released(leases: LeaseTable, timeout_s: float = 5.0) -> set[str]:
    """The request ids freed so far, waiting up to `timeout_s` for the first (a vouched pull's
    release reaches the producer after the consumer has gone on)."""
    deadline = time.monotonic() + timeout_s
    while not (released := leases.take_released()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return released


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bytewise (random bytes hold NaN patterns, which compare unequal as numbers)."""
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _consumer(transport: str) -> tuple[dict, PullClient]:
    caches = GEOMETRY.caches(NUM_BLOCKS)
    layout = KVLayout(caches, NUM_BLOCKS)
    return caches, PullClient(layout, layout.compat("m", 32), transport)


@pytest.mark.parametrize("transport", ["shm", "auto"])
def test_a_same_host_consumer_copies_exactly_the_leased_blocks_itself(shm_producer, transport):
    source, leases, address, server = shm_producer
    leases.grant(Lease("t1", "r1", (5, 6, 7, 20), 100, time.monotonic() + 30))
    target, client = _consumer(transport)
    untouched = {name: t[0].clone() for name, t in target.items()}
    result = client.pull(address, "t1", [5, 6, 7, 20], [1, 2, 9, 10], release=True)
    for name in source:
        assert _same_bytes(source[name][[5, 6, 7, 20]], target[name][[1, 2, 9, 10]])
        assert _same_bytes(untouched[name], target[name][0])
    assert result.num_bytes == 4 * GEOMETRY.bytes_per_block
    assert (server.stats.data_channels, server.stats.mapped_channels) == (1, 1)
    assert _released(leases) == {"r1"}  # released at DONE (or COPIED), as on every transport
    client.close()


def test_auto_falls_back_to_tcp_when_the_producer_cache_is_not_shared():
    source, leases, address, server, _ = _producer("auto", in_segment=False)
    try:
        leases.grant(Lease("t1", "r1", (3, 4), 50, time.monotonic() + 30))
        target, client = _consumer("auto")
        client.pull(address, "t1", [3, 4], [0, 1])
        assert all(_same_bytes(source[n][[3, 4]], target[n][[0, 1]]) for n in source)
        assert (server.stats.data_channels, server.stats.mapped_channels) == (1, 0)
        client.close()
    finally:
        server.stop()


def test_auto_falls_back_to_tcp_for_a_consumer_on_another_host(shm_producer, monkeypatch):
    source, leases, address, server = shm_producer
    original = ShmTransport.consumer_offer

    def offer_from_another_boot(self, sock, device):
        offer = original(self, sock, device)
        offer.fields["boot_id"] = "another-host"
        return offer

    monkeypatch.setattr(ShmTransport, "consumer_offer", offer_from_another_boot)
    leases.grant(Lease("t1", "r1", (2,), 20, time.monotonic() + 30))
    target, client = _consumer("auto")
    client.pull(address, "t1", [2], [5])
    assert all(_same_bytes(source[n][2], target[n][5]) for n in source)
    assert server.stats.mapped_channels == 0
    client.close()


def test_explicit_shm_is_refused_with_the_reason_when_the_cache_is_not_shared():
    _, _, address, server, _ = _producer("shm", in_segment=False)
    try:
        _, client = _consumer("shm")
        with pytest.raises(IncompatiblePeer, match="not in shared memory"):
            client.pull(address, "t1", [1], [1])
        client.close()
    finally:
        server.stop()


def test_a_consumer_lets_go_of_a_gone_producers_map_and_reconnects():
    caches, leases, address, server, segment = _producer("shm", in_segment=True)
    target, client = _consumer("shm")
    try:
        leases.grant(Lease("t1", "r1", (1,), 10, time.monotonic() + 30))
        client.pull(address, "t1", [1], [2])
        assert client.drop_stale() == []      # the producer is alive: its map stays
        segment.close()                       # the producer's engine stopped: the segment is unlinked
        assert client.drop_stale() == [address]
    finally:
        client.close()
        server.stop()


def test_a_consumer_that_dies_mid_copy_leaves_the_lease_to_expire_and_the_producer_serving(shm_producer):
    """The consumer got SENDING (the blocks are pinned for it) and vanished before DONE: the pin ends
    with its connection, the lease is neither released nor lost, and expiry frees the blocks."""
    import socket as socket_module

    from kv_transfer.auth import authenticate_to_producer, process_credentials
    from kv_transfer.shm_segment import boot_id, proof
    from kv_transfer.wire import encode, expect, recv_message, send_message

    source, leases, address, server = shm_producer
    leases.grant(Lease("dying", "r-dying", (3, 4), 50, time.monotonic() + 1.0))
    leases.grant(Lease("next", "r-next", (5,), 20, time.monotonic() + 30))
    _, probe_client = _consumer("shm")
    host, port = address.rsplit(":", 1)
    with socket_module.create_connection((host, int(port)), timeout=5) as sock:
        _, auth_proof = authenticate_to_producer(sock, process_credentials(), probe_client.compat.model_fingerprint)
        sock.sendall(auth_proof + encode({"op": "HELLO", "compat": probe_client.compat.to_dict(), "transport": "shm",
                                          "boot_id": boot_id()}))
        welcome = expect(recv_message(sock), "WELCOME")
        mapped = map_segment(welcome["segment"]["path"], welcome["segment"]["size"])
        send_message(sock, {"op": "CHANNEL", "kind": "shm", "proof": proof(mapped.token)})
        assert expect(recv_message(sock), "CHANNEL_OK")["kind"] == "shm"
        send_message(sock, {"op": "PULL", "transfer_id": "dying", "block_ids": [3, 4], "local_block_ids": [0, 1],
                            "release": True})
        expect(recv_message(sock), "SENDING")
        mapped.close()
    # the connection is gone without DONE: the lease is not released, and other pulls go on
    target, client = _consumer("shm")
    client.pull(address, "next", [5], [7], release=True)
    assert _same_bytes(source[next(iter(source))][5], target[next(iter(target))][7])
    assert _released(leases) == {"r-next"}
    deadline = time.monotonic() + 10
    while not leases.expire() and time.monotonic() < deadline:  # its deadline passes; the worker half expires it
        time.sleep(0.05)
    assert leases.num_held == 0 and leases.take_released() == {"r-dying"}
    client.close()
    probe_client.close()


@pytest.mark.parametrize("transport, channel", [("auto", "buffers"), ("shm", None)])
def test_a_consumer_that_maps_the_wrong_memory_gets_tcp_under_auto_and_an_error_under_shm(
        shm_producer, monkeypatch, transport, channel):
    """The proof is the token read through the map: another segment's token is refused, and
    the producer's CHANNEL_OK tells the consumer which channel it accepted."""
    import kv_transfer.transports.shm as shm_module

    def map_the_wrong_memory(path, size):
        mapped = map_segment(path, size)
        mapped.token = b"\0" * 32
        return mapped

    monkeypatch.setattr(shm_module, "map_segment", map_the_wrong_memory)
    source, leases, address, server = shm_producer
    leases.grant(Lease("t1", "r1", (4,), 20, time.monotonic() + 30))
    target, client = _consumer(transport)
    if channel is None:
        with pytest.raises(TransferError):
            client.pull(address, "t1", [4], [6])
    else:
        client.pull(address, "t1", [4], [6])
        assert all(_same_bytes(source[n][4], target[n][6]) for n in source)
        assert next(iter(client._connections.values())).channel.kind == channel
    assert server.stats.mapped_channels == 0
    client.close()


def test_an_auto_consumer_is_served_by_a_tcp_producer():
    source, leases, address, server, _ = _producer("tcp", in_segment=False)
    try:
        leases.grant(Lease("t1", "r1", (1,), 10, time.monotonic() + 30))
        target, client = _consumer("auto")
        client.pull(address, "t1", [1], [2])
        assert all(_same_bytes(source[n][1], target[n][2]) for n in source)
        client.close()
    finally:
        server.stop()


@pytest.mark.parametrize("board", [True, False])
def test_a_lease_granted_before_the_copy_costs_no_wait_on_the_board_and_one_round_trip_without(board):
    source, leases, address, server, segment = _producer("shm", in_segment=True, board=board)
    target, client = _consumer("shm")
    try:
        leases.grant(Lease("t1", "r1", (3, 4), 50, time.monotonic() + 30))
        client.pull(address, "t1", [3, 4], [0, 1], release=True)
        connection = client._connections[address]
        assert connection.channel.one_round_trip and server.stats.recopies == 0
        assert (connection.channel.board is not None) == board
        layer = next(iter(source))
        assert _same_bytes(source[layer][[3, 4]], target[layer][[0, 1]])
        assert _released(leases) == {"r1"}
        assert (server.stats.transfers, server.stats.vouched_transfers) == (1, 1 if board else 0)
    finally:
        client.close()
        server.stop()
        segment.close()


def test_a_vouched_pull_without_release_tells_the_producer_nothing_and_the_lease_stays(shm_producer):
    source, leases, address, server = shm_producer
    leases.grant(Lease("kept", "r-kept", (5,), 32, time.monotonic() + 30))
    target, client = _consumer("shm")
    for local in (7, 8):   # one lease serves both
        client.pull(address, "kept", [5], [local])
    layer = next(iter(source))
    assert _same_bytes(source[layer][5], target[layer][8])
    client.close()   # sends whatever notices are queued first
    assert leases.num_held == 1 and leases.take_released() == set() and server.stats.transfers == 0


def test_a_lease_that_ends_during_the_copy_is_not_vouched_for_and_the_pull_fails_cleanly(shm_producer, monkeypatch):
    """The board showed the lease before the copy; it expired (or was released) while the copy ran:
    the consumer must not keep those bytes on the board's word, and the producer says MISSING."""
    source, leases, address, server = shm_producer
    leases.grant(Lease("brief", "r-brief", (13, 14), 64, time.monotonic() + 30))
    target, client = _consumer("shm")
    copy = ShmConsumerChannel.copy

    def copy_while_released(channel, local, remote):
        leases.release("brief")   # the abort path, racing the copy
        return copy(channel, local, remote)

    monkeypatch.setattr(ShmConsumerChannel, "copy", copy_while_released)
    with pytest.raises(TransferError, match="no KV held"):
        client.pull(address, "brief", [13, 14], [2, 3], release=True)
    assert server.stats.vouched_transfers == 0 and server.stats.missing_transfers == 1
    client.close()


def test_a_copy_that_began_before_the_grant_is_made_again_and_lands_the_final_bytes(shm_producer, monkeypatch):
    """The consumer copies at once; the prefill finishes writing the blocks and grants them while it
    does: the producer answers RECOPY, and the second copy brings the bytes as granted."""
    import threading

    source, leases, address, server = shm_producer
    layer = next(iter(source))
    for tensor in source.values():
        tensor[[8, 9]] = 0  # the prefill has not written these blocks yet
    copy_began = threading.Event()
    copy = ShmConsumerChannel.copy

    def copy_and_say_so(channel, local, remote):
        copy_began.set()
        return copy(channel, local, remote)

    def finish_prefill():
        assert copy_began.wait(10)  # the grant comes after the consumer's copy began, however slow the host
        for tensor in source.values():
            tensor[[8, 9]] = 1
        leases.grant(Lease("late", "r-late", (8, 9), 64, time.monotonic() + 30))

    monkeypatch.setattr(ShmConsumerChannel, "copy", copy_and_say_so)
    prefill = threading.Thread(target=finish_prefill)
    target, client = _consumer("shm")
    prefill.start()
    client.pull(address, "late", [8, 9], [2, 3], release=True)
    prefill.join()
    assert server.stats.recopies == 1
    assert _same_bytes(source[layer][[8, 9]], target[layer][[2, 3]])
    assert int(target[layer][[2, 3]].float().ne(1).sum()) == 0
    client.close()


def test_a_missing_transfer_fails_its_pull_and_the_one_round_trip_connection_stays_in_step(shm_producer):
    source, leases, address, server = shm_producer
    target, client = _consumer("shm")
    with pytest.raises(TransferError, match="no KV held"):
        client.pull(address, "never", [1], [1])  # the producer waits grant_wait_s, then says MISSING
    leases.grant(Lease("t2", "r2", (6,), 20, time.monotonic() + 30))
    client.pull(address, "t2", [6], [7], release=True)  # same connection: the DONE was read, no stray message
    assert server.stats.connections == 1 and server.stats.missing_transfers == 1
    layer = next(iter(source))
    assert _same_bytes(source[layer][6], target[layer][7])
    client.close()


def test_a_producer_that_does_not_offer_one_round_trip_gets_the_two_step_pull(shm_producer, monkeypatch):
    source, leases, address, server = shm_producer
    offered = ShmTransport.welcome_fields
    monkeypatch.setattr(ShmTransport, "welcome_fields",
                        lambda self, hello: {k: v for k, v in offered(self, hello).items() if k != "one_round_trip"})
    leases.grant(Lease("t3", "r3", (11,), 20, time.monotonic() + 30))
    target, client = _consumer("shm")
    client.pull(address, "t3", [11], [12], release=True)
    assert not client._connections[address].channel.one_round_trip
    layer = next(iter(source))
    assert _same_bytes(source[layer][11], target[layer][12]) and leases.take_released() == {"r3"}
    client.close()
