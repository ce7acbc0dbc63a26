"""Socket settings and exact-length I/O on real loopback TCP sockets."""

import socket
import time

import pytest

from kv_transfer.errors import PeerClosed, TransferTimeout
from kv_transfer.sockets import configure, recv_into_exactly, recvmsg_into_all, sendmsg_all, tune_bulk


@pytest.fixture
def pair():
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    yield client, server
    client.close()
    server.close()


def _congestion(sock) -> str:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode()


def test_bulk_sockets_get_the_chosen_congestion_control_or_reno(pair):
    client, server = pair
    default = _congestion(server)
    tune_bulk(client, "cubic")
    assert _congestion(client) in ("cubic", "reno")  # reno where cubic needs a privilege we lack
    tune_bulk(server, "no-such-algorithm")
    assert _congestion(server) == "reno"
    fresh = socket.socket()
    tune_bulk(fresh, "")
    assert _congestion(fresh) == default  # "" keeps the host's choice
    assert fresh.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    fresh.close()


def test_a_stalled_peer_is_a_timeout_inside_an_exchange(pair):
    client, server = pair
    configure(client, 0.2)
    started = time.monotonic()
    with pytest.raises(TransferTimeout):
        recv_into_exactly(client, memoryview(bytearray(10)))
    assert 0.15 < time.monotonic() - started < 2
    with pytest.raises(TransferTimeout, match="did not read for 0.2 s"):
        sendmsg_all(client, [memoryview(bytearray(64 << 20))], timeout_s=0.2)  # nobody reads 64 MiB


def test_scatter_reads_fill_every_buffer_in_order_and_report_how_much_came_before_eof(pair):
    client, server = pair
    configure(client, 5.0)
    payload = bytes(range(256)) * 4096  # 1 MiB
    server.sendall(payload)
    parts = [bytearray(1000), bytearray(0), bytearray(len(payload) - 1000)]
    recvmsg_into_all(client, [memoryview(p) for p in parts])
    assert bytes(parts[0]) + bytes(parts[2]) == payload
    server.sendall(b"abc")
    server.close()
    with pytest.raises(PeerClosed) as closed:
        recv_into_exactly(client, memoryview(bytearray(10)))
    assert closed.value.received == 3
