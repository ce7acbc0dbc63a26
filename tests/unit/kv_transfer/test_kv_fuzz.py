"""Random bytes and random frames at a producer's KV port, before and after authentication: every
connection ends (answered or dropped), the producer keeps serving (the next example connects, the last test
pulls), and the lease it holds is neither released nor bound by any of it. Bounded to a few seconds (`max_examples`); raise it to hunt longer:
`HYPOTHESIS_KV_EXAMPLES=2000 pytest tests/unit/kv_transfer/test_kv_fuzz.py`."""

import os
import secrets
import socket
import struct
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kv_transfer.auth import Credentials, authenticate_to_producer
from kv_transfer.consumer import PullClient
from kv_transfer.layout import KVLayout
from kv_transfer.leases import Lease, LeaseTable
from kv_transfer.producer import TransferServer
from kv_transfer.wire import encode, expect, recv_message

SECRET = secrets.token_bytes(32)
EXAMPLES = int(os.environ.get("HYPOTHESIS_KV_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _layout(seed: int) -> KVLayout:
    generator = torch.Generator().manual_seed(seed)
    return KVLayout({f"layer.{i}": torch.randn(8, 2, 32, 64, generator=generator).to(torch.bfloat16)
                     for i in range(2)}, 8)


@pytest.fixture(scope="module")
def producer():
    layout, leases = _layout(0), LeaseTable()
    server = TransferServer(layout, layout.compat("tiny", 32), leases, "127.0.0.1", 0, grant_wait_s=0.01,
                            transports=("tcp",), credentials=Credentials("prefill-0", SECRET), auth_timeout_s=1.0,
                            grant_token="the-engines-token")
    leases.grant(Lease("kept", "r-kept", (2, 3), 64, time.monotonic() + 600))
    address = f"127.0.0.1:{server.start()}"
    yield leases, address, server
    server.stop()


def _send_and_wait_for_close(address: str, data: bytes, authenticated: bool = False) -> None:
    """Sends `data` (after the handshake if `authenticated`, and a HELLO), then EOF, and reads
    until the producer closes: it must, whatever `data` was."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        if authenticated:
            _, proof = authenticate_to_producer(sock, Credentials("fuzzer", SECRET), "")
            sock.sendall(proof + encode({"op": "HELLO", "compat": _layout(1).compat("tiny", 32).to_dict(),
                                         "transport": "tcp"}))
            expect(recv_message(sock), "WELCOME")
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
        except (ConnectionResetError, BrokenPipeError, OSError) as error:  # ENOTCONN from shutdown included
            assert not isinstance(error, TimeoutError), "the producer kept a fuzzed connection open"


def _unharmed(leases: LeaseTable) -> None:
    assert leases.num_held == 1 and leases.take_released() == set() and leases.consumer_of("kept") is None


_json = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
                     | st.text(max_size=12),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                     max_leaves=12)
_transfer_ids = st.text(max_size=10).filter(lambda t: t != "kept")
_messages = st.fixed_dictionaries(
    {"op": st.sampled_from(["AUTH", "PROOF", "HELLO", "PULL", "COPIED", "RELEASE", "DONE", "GRANT_HELLO", "GRANT",
                            "CHANNEL", "READY", "bogus"])},
    optional={"transfer_id": _transfer_ids | _json, "block_ids": st.lists(st.integers(-5, 2**40), max_size=6) | _json,
              "local_block_ids": st.lists(st.integers(-5, 40), max_size=6) | _json, "release": st.booleans() | _json,
              "copy_started_s": st.floats(allow_nan=False) | _json, "vouched": st.booleans(),
              "identity": st.text(max_size=20) | _json, "nonce": st.text(max_size=70) | _json,
              "fingerprint": _json, "proof": st.text(max_size=70) | _json, "token": st.text(max_size=20),
              "compat": _json, "transport": st.sampled_from(["tcp", "shm", "torch", "auto", ""]) | _json})


def _frame(body: bytes, lie: int) -> bytes:
    """`body` framed with its length, or with a length off by `lie` (a truncated or overlong frame)."""
    return struct.pack("!I", max(0, min(2**32 - 1, len(body) + lie))) + body


_frames = st.lists(st.tuples(_messages.map(lambda m: encode(m)[4:]) | st.binary(max_size=64),
                             st.sampled_from([0, 0, 0, -1, 1, 2**31])), min_size=1, max_size=4) \
    .map(lambda frames: b"".join(_frame(body, lie) for body, lie in frames))


@FUZZ
@given(data=st.binary(max_size=2048) | _frames)
def test_random_bytes_and_frames_before_authentication_are_dropped(producer, data):
    leases, address, server = producer
    _send_and_wait_for_close(address, data)
    _unharmed(leases)


@FUZZ
@given(data=st.binary(max_size=512) | _frames)
def test_random_frames_from_an_authenticated_consumer_never_touch_anothers_lease(producer, data):
    leases, address, server = producer
    _send_and_wait_for_close(address, data, authenticated=True)
    _unharmed(leases)


def test_after_the_fuzzing_the_producer_still_serves_its_lease(producer):
    leases, address, server = producer
    layout = _layout(1)
    client = PullClient(layout, layout.compat("tiny", 32), "tcp", timeout_s=5, credentials=Credentials("d", SECRET))
    assert client.pull(address, "kept", [2, 3], [4, 5]).num_blocks == 2
    client.close()
