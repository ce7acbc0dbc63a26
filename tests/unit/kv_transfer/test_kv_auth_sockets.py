"""The authenticated KV plane over real sockets: the challenge-response, transfers bound to their
consumer, and what a stranger's bytes can do to a producer (nothing but lose their connection)."""

import json
import logging
import secrets
import socket
import struct
import time
import tracemalloc

import pytest
import torch

from kv_transfer import producer as producer_module
from kv_transfer.auth import Credentials, Transcript, authenticate_to_producer, new_nonce, proof
from kv_transfer.consumer import PullClient, release_transfer
from kv_transfer.errors import IncompatiblePeer, TransferError
from kv_transfer.layout import KVLayout
from kv_transfer.leases import Lease, LeaseTable
from kv_transfer.producer import TransferServer
from kv_transfer.wire import encode, expect, recv_message, send_message

SECRET = secrets.token_bytes(32)
OWNER = Credentials("prefill-0", SECRET)


def _caches(seed: int):
    generator = torch.Generator().manual_seed(seed)
    return {f"layer.{i}": torch.randn(16, 2, 32, 64, generator=generator).to(torch.bfloat16) for i in range(2)}


def _server(credentials=OWNER, **kwargs):
    caches, leases = _caches(0), LeaseTable()
    layout = KVLayout(caches, 16)
    server = TransferServer(layout, layout.compat("tiny", 32), leases, "127.0.0.1", 0, grant_wait_s=0.2,
                            transports=("tcp",), credentials=credentials, auth_timeout_s=1.0, **kwargs)
    leases.grant(Lease("t1", "r1", (5, 6), 64, time.monotonic() + 60))
    return caches, leases, f"127.0.0.1:{server.start()}", server


@pytest.fixture
def producer():
    caches, leases, address, server = _server()
    yield caches, leases, address, server
    server.stop()


def _client(identity: str, secret: bytes | None = SECRET):
    target = _caches(1)
    layout = KVLayout(target, 16)
    return target, PullClient(layout, layout.compat("tiny", 32), "tcp", timeout_s=5,
                              credentials=Credentials(identity, secret))


def _connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def _closed_by_peer(sock: socket.socket, within_s: float = 3.0) -> bool:
    """True once the peer closed (EOF or reset), reading and dropping whatever it sent before."""
    sock.settimeout(within_s)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False
    return True


def _held_untouched(leases: LeaseTable) -> bool:
    return leases.num_held == 1 and leases.take_released() == set()


def _fingerprint(client: PullClient) -> str:
    return client.compat.model_fingerprint


# ---- the handshake -----------------------------------------------------------------------------
def test_a_consumer_with_the_cluster_secret_pulls_with_one_handshake_for_many_pulls(producer):
    source, leases, address, server = producer
    target, client = _client("decode-0")
    for _ in range(3):
        assert client.pull(address, "t1", [5, 6], [1, 2]).num_blocks == 2
    assert all(torch.equal(source[name][[5, 6]], target[name][[1, 2]]) for name in source)
    assert (server.stats.connections, server.stats.failed_authentications) == (1, 0)
    client.close()


@pytest.mark.parametrize("secret, consumer_says, producer_logs", [
    (secrets.token_bytes(32), "the KV producer 'prefill-0' did not prove the cluster secret",
     "consumer 'decode-x' left without a proof: it could not verify ours"),
    (None, "refused: authentication failed",
     "consumer 'decode-x' did not prove the cluster secret"),
], ids=["wrong secret", "no secret"])
def test_a_consumer_without_the_right_secret_is_refused_logged_and_no_lease_is_touched(producer, caplog, secret,
                                                                                      consumer_says, producer_logs):
    """With another secret, the consumer finds out first (the producer proves itself first) and
    leaves; without one, it cannot tell and the producer refuses its empty proof."""
    _, leases, address, server = producer
    _, stranger = _client("decode-x", secret)
    with caplog.at_level(logging.WARNING, logger="kv_transfer.producer"):
        with pytest.raises(IncompatiblePeer, match=consumer_says):
            stranger.pull(address, "t1", [5, 6], [1, 2], release=True)
        deadline = time.monotonic() + 5
        while server.stats.failed_authentications == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert "refused a KV connection from 127.0.0.1:" in caplog.text and producer_logs in caplog.text
    assert (server.stats.failed_authentications, server.stats.data_channels) == (1, 0)
    assert _held_untouched(leases) and leases.consumer_of("t1") is None
    stranger.close()


def test_a_consumer_with_the_secret_refuses_a_producer_that_cannot_prove_it():
    _, leases, address, server = _server(credentials=Credentials("impostor"))
    try:
        _, client = _client("decode-0")
        with pytest.raises(IncompatiblePeer, match="producer 'impostor' did not prove the cluster secret"):
            client.pull(address, "t1", [5, 6], [1, 2])
        assert (server.stats.data_channels, server.stats.transfers) == (0, 0)  # we sent it no HELLO, no PULL
        client.close()
    finally:
        server.stop()


def test_a_replayed_proof_or_a_reflected_producer_proof_is_refused_and_the_connection_dropped(producer):
    _, leases, address, server = producer
    auth = {"op": "AUTH", "identity": "decode-0", "fingerprint": "", "nonce": new_nonce()}
    with _connect(address) as sock:  # a genuine handshake, recorded
        send_message(sock, auth)
        challenge = expect(recv_message(sock), "CHALLENGE")
        transcript = Transcript("decode-0", "", auth["nonce"], "prefill-0", challenge["fingerprint"],
                                challenge["nonce"])
        recorded = encode({"op": "PROOF", "proof": proof(SECRET, "consumer", transcript)})
        sock.sendall(recorded + encode({"op": "RELEASE", "transfer_id": "unrelated"}))
        assert expect(recv_message(sock), "RELEASED")["found"] is False
    with _connect(address) as sock:  # the same AUTH and PROOF again: the producer's nonce is new
        send_message(sock, auth)
        assert expect(recv_message(sock), "CHALLENGE")["nonce"] != challenge["nonce"]
        sock.sendall(recorded + encode({"op": "RELEASE", "transfer_id": "t1"}))
        assert recv_message(sock) == {"op": "REFUSED", "error": "authentication failed"}
        assert _closed_by_peer(sock)
    with _connect(address) as sock:  # the producer's own proof sent back as ours
        send_message(sock, {**auth, "nonce": new_nonce()})
        reflected = expect(recv_message(sock), "CHALLENGE")["proof"]
        send_message(sock, {"op": "PROOF", "proof": reflected})
        assert expect(recv_message(sock), "REFUSED") and _closed_by_peer(sock)
    assert server.stats.failed_authentications == 2 and _held_untouched(leases)


@pytest.mark.parametrize("first", [{"op": "RELEASE", "transfer_id": "t1"},
                                   {"op": "PULL", "transfer_id": "t1", "block_ids": [5], "local_block_ids": [1]},
                                   {"op": "HELLO", "compat": {}, "transport": "tcp"},
                                   {"op": "GRANT_HELLO", "token": "guess"}])
def test_a_message_before_authentication_is_refused_and_the_connection_dropped(producer, first):
    _, leases, address, server = producer
    with _connect(address) as sock:
        send_message(sock, first)
        assert _closed_by_peer(sock)
    assert server.stats.failed_authentications == 1 and _held_untouched(leases)


# ---- transfers bound to their consumer -------------------------------------------------------------
def test_pull_and_release_of_another_consumers_transfer_are_refused_and_the_lease_stays_pullable(producer, caplog):
    source, leases, address, server = producer
    target, mine = _client("decode-a")
    _, theirs = _client("decode-b")
    assert mine.pull(address, "t1", [5, 6], [1, 2]).num_blocks == 2     # binds t1 to decode-a
    with caplog.at_level(logging.WARNING, logger="kv_transfer.producer"):
        with pytest.raises(TransferError, match="KV transfer t1 is bound to another consumer"):
            theirs.pull(address, "t1", [5, 6], [3, 4], release=True)
        with pytest.raises(IncompatiblePeer, match="refused to release t1: KV transfer t1 is bound to another"):
            theirs.release(address, "t1")
    assert "refused RELEASE of KV transfer t1 by 'decode-b': it is bound to consumer 'decode-a'" in caplog.text
    assert server.stats.refused_uses == 2 and _held_untouched(leases)
    assert mine.pull(address, "t1", [5, 6], [7, 8], release=True).num_blocks == 2
    assert all(torch.equal(source[name][[5, 6]], target[name][[7, 8]]) for name in source)
    deadline = time.monotonic() + 5
    while leases.num_held and time.monotonic() < deadline:
        time.sleep(0.01)
    assert leases.take_released() == {"r1"}
    mine.close()
    theirs.close()


def test_an_unbound_transfer_binds_to_whoever_touches_it_first_and_the_producers_worker_releases_any(producer):
    _, leases, address, server = producer
    leases.grant(Lease("t2", "r2", (1,), 10, time.monotonic() + 60))
    _, first = _client("decode-b")
    _, second = _client("decode-a")
    assert first.pull(address, "t2", [1], [1]).num_blocks == 1
    with pytest.raises(TransferError, match="bound to another consumer"):
        second.pull(address, "t2", [1], [1])
    assert second.pull(address, "t1", [5, 6], [1, 2]).num_blocks == 1 * 2   # its own transfer still works
    assert release_transfer(address, "t2", credentials=OWNER) is True       # the router's abort, through it
    assert release_transfer(address, "t1", credentials=OWNER) is True
    assert leases.take_released() == {"r1", "r2"}
    first.close()
    second.close()


def test_of_two_consumers_racing_for_an_unbound_lease_exactly_one_binds_it():
    leases = LeaseTable()
    leases.grant(Lease("t", "r", (1,), 10, time.monotonic() + 60))
    assert leases.consumer_of("t") is None
    assert leases.claim("t", "decode-a") == "decode-a"
    assert leases.claim("t", "decode-b") == "decode-a"
    assert leases.consumer_of("t") == "decode-a"
    assert leases.claim("unknown", "decode-b") is None


# ---- malformed and oversized frames -----------------------------------------------------------------
def _legit_pull_works(address: str) -> bool:
    _, client = _client("decode-0")
    try:
        return client.pull(address, "t1", [5, 6], [1, 2]).num_blocks == 2
    finally:
        client.close()


def _authenticated(address: str, identity: str = "decode-z") -> socket.socket:
    sock = _connect(address)
    _, auth_proof = authenticate_to_producer(sock, Credentials(identity, SECRET), "")
    sock.sendall(auth_proof)
    return sock


@pytest.mark.parametrize("authenticated, claimed_bytes", [(False, 1 << 20), (False, 2**32 - 1), (True, 2**32 - 1)],
                         ids=["1 MiB before auth", "4 GiB before auth", "4 GiB after auth"])
def test_an_oversized_length_drops_the_connection_before_anything_is_allocated(producer, authenticated,
                                                                               claimed_bytes):
    _, leases, address, server = producer
    tracemalloc.start()
    try:
        sock = _authenticated(address) if authenticated else _connect(address)
        with sock:
            tracemalloc.reset_peak()
            sock.sendall(struct.pack("!I", claimed_bytes) + b"{")
            assert _closed_by_peer(sock, within_s=2.0)   # at once: it did not wait for the body
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_bytes < 256 << 10
    assert _held_untouched(leases) and _legit_pull_works(address)


@pytest.mark.parametrize("authenticated, body", [
    (False, b"not json"), (False, b"[1, 2]"), (False, b'{"no": "op"}'), (False, b'{"op": 7}'),
    (False, b"[" * 600 + b"]" * 600), (False, b"\xff\xfe"),
    (True, b"[" * 100_000 + b"]" * 100_000), (True, b'{"op": "PULL", "transfer_id": "t1", "block_ids": "5"}'),
    (True, b'{"op": "HELLO", "compat": [], "transport": {"x": 1}}'), (True, b'{"op": "COPIED"}'),
])
def test_a_malformed_frame_drops_the_connection_and_the_producer_serves_on(producer, authenticated, body):
    _, leases, address, server = producer
    with (_authenticated(address) if authenticated else _connect(address)) as sock:
        sock.sendall(struct.pack("!I", len(body)) + body)
        assert _closed_by_peer(sock)
    assert _held_untouched(leases) and _legit_pull_works(address)


def test_a_silent_stranger_is_dropped_after_the_auth_timeout_and_strangers_beyond_the_cap_at_once(monkeypatch):
    monkeypatch.setattr(producer_module, "MAX_UNAUTHENTICATED_CONNECTIONS", 3)
    _, leases, address, server = _server()
    try:
        silent = [_connect(address) for _ in range(3)]
        deadline = time.monotonic() + 5
        while server.stats.connections < 3 and time.monotonic() < deadline:
            time.sleep(0.01)                              # until all three are accepted, in their handshake
        assert server.stats.connections == 3
        started = time.monotonic()
        with _connect(address) as fourth:
            assert _closed_by_peer(fourth, within_s=0.5)  # beyond the cap: closed on accept
        for sock in silent:
            assert _closed_by_peer(sock, within_s=3.0)    # the 1 s auth timeout
            sock.close()
        assert time.monotonic() - started < 3.0
        assert _held_untouched(leases) and _legit_pull_works(address)
    finally:
        server.stop()


def test_a_pre_authentication_message_is_bounded_to_a_kibibyte(producer):
    _, leases, address, _ = producer
    padded = json.dumps({"op": "AUTH", "identity": "d", "fingerprint": "", "nonce": "00" * 32, "pad": "x" * 2048})
    with _connect(address) as sock:
        sock.sendall(struct.pack("!I", len(padded)) + padded.encode())
        assert _closed_by_peer(sock)
    assert _held_untouched(leases)
