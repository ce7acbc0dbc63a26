"""Encrypted KV connections over real sockets: a pull through a tap on the wire sees no KV byte in
clear, a flipped or replayed byte fails the transfer cleanly, settings that contradict each other
or a downgrade on the path are refused before any KV moves, and lengths stay bounded."""

import json
import logging
import secrets
import socket
import struct
import threading
import time
import tracemalloc

import pytest
import torch

from kv_transfer.auth import Credentials, authenticate_to_producer
from kv_transfer.consumer import PullClient, release_transfer
from kv_transfer.encryption import derive_session_keys
from kv_transfer.errors import ChecksumMismatch, IncompatiblePeer, TransferError
from kv_transfer.faults import FaultPlan
from kv_transfer.layout import KVLayout
from kv_transfer.leases import Lease, LeaseTable
from kv_transfer.producer import TransferServer
from kv_transfer.sealed_socket import SealBroken, SealedSocket
from kv_transfer.sockets import wait_readable
from kv_transfer.wire import encode, recv_message, send_message

SECRET = secrets.token_bytes(32)


def _caches(seed: int):
    generator = torch.Generator().manual_seed(seed)
    return {f"layer.{i}": torch.randn(16, 2, 32, 64, generator=generator).to(torch.bfloat16) for i in range(2)}


def _server(encryption="auto", transports=("tcp",)):
    caches, leases = _caches(0), LeaseTable()
    layout = KVLayout(caches, 16)
    server = TransferServer(layout, layout.compat("tiny", 32), leases, "127.0.0.1", 0, grant_wait_s=0.2,
                            transports=transports, credentials=Credentials("prefill-0", SECRET, encryption),
                            auth_timeout_s=1.0)
    leases.grant(Lease("t1", "r1", (5, 6), 64, time.monotonic() + 60))
    return caches, leases, server.start(), server


@pytest.fixture
def producer():
    caches, leases, port, server = _server()
    yield caches, leases, port, server
    server.stop()


def _client(encryption="on", identity="decode-0", transport="tcp", **kwargs):
    target = _caches(1)
    layout = KVLayout(target, 16)
    return target, PullClient(layout, layout.compat("tiny", 32), transport, timeout_s=5,
                              credentials=Credentials(identity, SECRET, encryption), **kwargs)


class Tap:
    """A man in the middle on 127.0.0.1: forwards every connection to `port`, keeps what crossed in
    each direction, and may flip the byte at `flip_at` of one direction (first connection only) or
    rewrite the consumer's first frame (its AUTH) with `rewrite_auth`."""

    def __init__(self, port: int, flip: tuple[str, int] | None = None, rewrite_auth=None):
        self.port, self.flip, self.rewrite_auth = port, flip, rewrite_auth
        self.seen = {"to_producer": bytearray(), "to_consumer": bytearray()}
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.create_connection(("127.0.0.1", self.port))
            first = self.connections == 1
            for source, sink, direction in ((downstream, upstream, "to_producer"), (upstream, downstream, "to_consumer")):
                threading.Thread(target=self._pump, args=(source, sink, direction, first), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, direction: str, first: bool) -> None:
        forwarded = 0
        try:
            if direction == "to_producer" and self.rewrite_auth is not None:
                (length,) = struct.unpack("!I", _read_exactly(source, 4))
                auth = self.rewrite_auth(json.loads(_read_exactly(source, length)))
                sink.sendall(encode(auth))
            while data := source.recv(65536):
                data = bytearray(data)
                self.seen[direction] += data
                if first and self.flip is not None and self.flip[0] == direction:
                    at = self.flip[1] - forwarded
                    if 0 <= at < len(data):
                        data[at] ^= 0x01
                forwarded += len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._listener.close()


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise OSError("closed")
        data += chunk
    return data


def _wait_for(condition, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def _closed_by_peer(sock: socket.socket, within_s: float = 3.0) -> bool:
    sock.settimeout(within_s)
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def _block_bytes(caches, block: int) -> bytes:
    return caches["layer.0"][block].contiguous().view(torch.uint8).numpy().tobytes()[:64]


def _same_blocks(source, target, remote, local) -> bool:
    return all(torch.equal(source[name][remote], target[name][local]) for name in source)


# ---- round trips -----------------------------------------------------------------------------------
@pytest.mark.parametrize("encryption, sealed", [("on", True), ("auto", False)], ids=["on", "auto on one host"])
def test_an_encrypted_pull_delivers_the_blocks_and_puts_none_of_their_bytes_on_the_wire(producer, encryption,
                                                                                         sealed):
    source, leases, port, server = producer
    tap = Tap(port)
    target, client = _client(encryption)
    try:
        for local in ([1, 2], [3, 4], [7, 8]):
            assert client.pull(tap.address, "t1", [5, 6], local).num_blocks == 2
            assert _same_blocks(source, target, [5, 6], local)
        assert (server.stats.data_channels, server.stats.sealed_channels, tap.connections) == (1, int(sealed), 1)
        wire = bytes(tap.seen["to_consumer"])
        assert (_block_bytes(source, 5) in wire, b'"op":"SENDING"' in wire) == (not sealed, not sealed)
        assert (b'"transfer_id":"t1"' in bytes(tap.seen["to_producer"])) is not sealed
    finally:
        client.close()
        tap.close()


def test_a_release_rides_the_sealed_connection_and_the_transfer_id_stays_off_the_wire(producer):
    _, leases, port, server = producer
    tap = Tap(port)
    try:
        assert release_transfer(tap.address, "t1", credentials=Credentials("prefill-0", SECRET, "on")) is True
        assert leases.take_released() == {"r1"} and b"t1" not in bytes(tap.seen["to_producer"])
    finally:
        tap.close()


def test_an_encrypted_pull_still_checks_block_checksums_after_opening_the_records(producer):
    source, leases, port, server = producer
    target, client = _client("on", faults=FaultPlan.parse("flip_bytes@1"))
    try:
        with pytest.raises(ChecksumMismatch):
            client.pull(f"127.0.0.1:{port}", "t1", [5, 6], [1, 2])
        assert client.pull(f"127.0.0.1:{port}", "t1", [5, 6], [1, 2]).num_blocks == 2
        assert _same_blocks(source, target, [5, 6], [1, 2])
    finally:
        client.close()


# ---- tampering ----------------------------------------------------------------------------------
@pytest.mark.parametrize("flip", [("to_consumer", 2048), ("to_producer", 600)],
                         ids=["a KV byte to the consumer", "a control byte to the producer"])
def test_a_flipped_ciphertext_byte_fails_the_transfer_cleanly_and_the_lease_survives_for_a_retry(producer, flip,
                                                                                                 caplog):
    source, leases, port, server = producer
    tap = Tap(port, flip=flip)
    target, client = _client("on")
    try:
        with caplog.at_level(logging.WARNING, logger="kv_transfer.producer"):
            with pytest.raises(TransferError) as failed:
                client.pull(tap.address, "t1", [5, 6], [1, 2], release=True)
            _wait_for(lambda: "failed its authentication tag" in caplog.text or flip[0] == "to_consumer")
        assert not isinstance(failed.value, ChecksumMismatch)
        if flip[0] == "to_consumer":
            assert isinstance(failed.value.__cause__, SealBroken)
            assert "failed its authentication tag" in str(failed.value)
        else:   # the producer found it, said so, and closed the connection
            assert "closed a KV connection from 127.0.0.1:" in caplog.text and server.stats.transfers == 0
        _wait_for(lambda: leases.num_held == 1)
        assert leases.num_held == 1 and leases.take_released() == set()   # nothing released: no DONE came
        assert client.pull(tap.address, "t1", [5, 6], [1, 2], release=True).num_blocks == 2   # a fresh connection
        assert _same_blocks(source, target, [5, 6], [1, 2]) and tap.connections == 2
    finally:
        client.close()
        tap.close()


def test_switching_encryption_off_on_the_path_is_caught_before_any_kv_byte_moves(producer):
    _, leases, port, server = producer
    tap = Tap(port, rewrite_auth=lambda auth: {**auth, "encryption": "off"})
    _, client = _client("on")
    try:
        with pytest.raises(IncompatiblePeer, match="did not prove the cluster secret"):
            client.pull(tap.address, "t1", [5, 6], [1, 2])
        assert (server.stats.data_channels, server.stats.transfers) == (0, 0) and leases.consumer_of("t1") is None
    finally:
        client.close()
        tap.close()


def test_a_replayed_or_reordered_record_fails_its_tag():
    keys = derive_session_keys(SECRET, "11" * 32, "22" * 32, b"t")
    sender, wire = socket.socketpair()
    sealed = SealedSocket(sender, keys, "producer", 5.0)
    for n in range(3):
        send_message(sealed, {"op": "DONE_OK", "n": n})
    sender.shutdown(socket.SHUT_WR)
    records = b""
    while chunk := wire.recv(65536):
        records += chunk
    one = len(records) // 3
    for replayed in (records[:one] + records[:one], records[one:2 * one] + records[:one]):
        reader, writer = socket.socketpair()
        writer.sendall(replayed)
        opened = SealedSocket(reader, keys, "consumer", 5.0)
        if replayed.startswith(records[:one]):
            assert recv_message(opened) == {"op": "DONE_OK", "n": 0}
        with pytest.raises(SealBroken, match="failed its authentication tag"):
            recv_message(opened)
        for sock in (reader, writer):
            sock.close()
    for sock in (sender, wire):
        sock.close()


def test_records_step_to_new_keys_and_both_ends_keep_in_step():
    keys = derive_session_keys(SECRET, "11" * 32, "22" * 32, b"t")
    a, b = socket.socketpair()
    producer_side = SealedSocket(a, keys, "producer", 5.0, rekey_after_bytes=100)
    consumer_side = SealedSocket(b, keys, "consumer", 5.0, rekey_after_bytes=100)
    for n in range(20):
        send_message(producer_side, {"op": "SENDING", "pad": "x" * n * 7})
        assert recv_message(consumer_side) == {"op": "SENDING", "pad": "x" * n * 7}
        send_message(consumer_side, {"op": "DONE", "n": n})
        assert recv_message(producer_side) == {"op": "DONE", "n": n}
    plain = SealedSocket(b, keys, "consumer", 5.0)   # never stepped: the records after the first key fail
    for _ in range(3):
        send_message(producer_side, {"op": "SENDING"})
    with pytest.raises(SealBroken):
        for _ in range(3):
            recv_message(plain)
    a.close()
    b.close()


def test_a_record_holding_two_messages_is_read_to_its_end_before_the_socket_is_waited_on():
    keys = derive_session_keys(SECRET, "11" * 32, "22" * 32, b"t")
    a, b = socket.socketpair()
    sender, receiver = SealedSocket(a, keys, "consumer", 5.0), SealedSocket(b, keys, "producer", 5.0)
    sender.sendall(encode({"op": "DONE"}) + encode({"op": "RELEASE", "transfer_id": "t"}))
    assert recv_message(receiver) == {"op": "DONE"} and receiver.pending_bytes > 0
    waiter = threading.Thread(target=wait_readable, args=(receiver,), daemon=True)
    waiter.start()
    waiter.join(2.0)
    assert not waiter.is_alive()   # nothing more on the wire, yet a message is ready
    assert recv_message(receiver) == {"op": "RELEASE", "transfer_id": "t"} and receiver.pending_bytes == 0
    a.close()
    b.close()


# ---- settings that disagree ---------------------------------------------------------------------
@pytest.mark.parametrize("consumer, producer_setting", [("on", "off"), ("off", "on")])
def test_contradicting_settings_are_refused_at_the_handshake_with_both_named(consumer, producer_setting):
    _, leases, port, server = _server(producer_setting)
    _, client = _client(consumer)
    try:
        with pytest.raises(IncompatiblePeer, match=f"KV encryption mismatch: the consumer is set to '{consumer}' "
                                                   f"and the producer to '{producer_setting}'"):
            client.pull(f"127.0.0.1:{port}", "t1", [5, 6], [1, 2])
        # the producer counts the refusal after sending it: the consumer may read it first
        _wait_for(lambda: server.stats.failed_authentications == 1)
        assert (server.stats.failed_authentications, server.stats.data_channels) == (1, 0)
        assert leases.num_held == 1 and leases.consumer_of("t1") is None
    finally:
        client.close()
        server.stop()


def test_a_producer_set_to_on_refuses_the_torch_transport_whose_bytes_it_cannot_seal():
    _, leases, port, server = _server("on", transports=("tcp", "torch"))
    _, client = _client("auto", transport="torch")
    try:
        with pytest.raises(IncompatiblePeer, match="kv_encryption=on, but the torch transport's KV bytes travel"):
            client.pull(f"127.0.0.1:{port}", "t1", [5, 6], [1, 2])
        assert server.stats.data_channels == 0
    finally:
        client.close()
        server.stop()


# ---- bounded reads ------------------------------------------------------------------------------
@pytest.mark.parametrize("length", [2**32 - 1, (1 << 20) + 17, 16, 0], ids=["4 GiB", "1 MiB + 1", "empty", "zero"])
def test_an_impossible_record_length_drops_the_connection_before_anything_is_allocated(producer, length):
    source, leases, port, server = producer
    tracemalloc.start()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            peer, proof = authenticate_to_producer(sock, Credentials("decode-z", SECRET, "on"), "")
            assert peer.keys is not None
            tracemalloc.reset_peak()
            sock.sendall(proof + struct.pack("!I", length) + b"x")
            assert _closed_by_peer(sock)   # at once: it did not wait for the record
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_bytes < 256 << 10
    target, client = _client("on")
    assert client.pull(f"127.0.0.1:{port}", "t1", [5, 6], [1, 2]).num_blocks == 2
    assert _same_blocks(source, target, [5, 6], [1, 2])
    client.close()
