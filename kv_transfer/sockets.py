"""Socket settings and exact-length I/O shared by the control plane and the `tcp` transport.

Sockets here stay in blocking mode. A Python socket in timeout mode (`settimeout(x)`) polls before
every call and reacquires the GIL between chunks; instead the kernel enforces the timeout
(`SO_RCVTIMEO`/`SO_SNDTIMEO`): a call that makes no progress for that long fails with `EAGAIN`,
which surfaces here as `TransferTimeout`. A connection's *idle* time between two exchanges is not a
call and has no timeout: TCP keepalive finds a peer that vanished instead.
"""

from __future__ import annotations

import select
import socket
import struct

from kv_transfer.errors import PeerClosed, TransferTimeout

# A peer silent this long gets keepalive probes; unanswered probes close the connection.
KEEPALIVE_IDLE_S = 30
KEEPALIVE_INTERVAL_S = 10
KEEPALIVE_PROBES = 3


def configure(sock: socket.socket, io_timeout_s: float) -> None:
    """Blocking mode with kernel-side timeouts, no Nagle delay, keepalive probes on idle.

    The socket buffers are left to the kernel's autotuning (forcing a size turns autotuning off)."""
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                        ("TCP_KEEPCNT", KEEPALIVE_PROBES)):
        if hasattr(socket, name):  # Linux; other systems keep their defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    set_io_timeout(sock, io_timeout_s)


def set_io_timeout(sock: socket.socket, seconds: float) -> None:
    """Every later send/recv call on `sock` fails with `TransferTimeout` after `seconds` without progress."""
    if seconds <= 0:
        raise ValueError(f"an I/O timeout must be positive seconds, not {seconds}")
    whole = int(seconds)
    timeval = struct.pack("@ll", whole, int((seconds - whole) * 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)


def connect(host: str, port: int, timeout_s: float) -> socket.socket:
    """A connected, `configure`d socket; the connect itself waits at most `timeout_s`."""
    sock = socket.create_connection((host, port), timeout=timeout_s)
    try:
        configure(sock, timeout_s)
    except BaseException:
        sock.close()
        raise
    return sock


def wait_readable(sock: socket.socket) -> None:
    """Blocks, without a timeout, until `sock` has data, its peer closed, or it failed (a keepalive
    timeout included). Another thread's `sock.shutdown()` wakes it too."""
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLPRI)
    poller.poll()


def recv_into_exactly(sock: socket.socket, target: memoryview) -> None:
    """Fills `target` from `sock`. Raises `PeerClosed` when the peer closes or resets the connection
    (with `received`, the bytes read before that) and `TransferTimeout` when it stalls longer than
    the socket's timeout."""
    received, size = 0, len(target)
    while received < size:
        try:
            n = sock.recv_into(target[received:], size - received, socket.MSG_WAITALL)
        except BlockingIOError as error:
            raise TransferTimeout(f"peer sent nothing for the socket timeout ({received}/{size} bytes)") from error
        except ConnectionResetError as error:
            raise PeerClosed("peer reset the connection", received) from error
        if n == 0:
            raise PeerClosed("peer closed the connection", received)
        received += n


def recvmsg_into_all(sock: socket.socket, buffers: list[memoryview], max_iov: int = 512) -> None:
    """Fills every buffer of `buffers` in order with scatter reads (`MSG_WAITALL`: one system call
    for a whole transfer unless a signal or the timeout cuts it). Errors as `recv_into_exactly`.

    Not done, on purpose: raising `SO_RCVLOWAT` so the thread wakes once per MiB instead of per
    segment. It was faster, but a window-limited sender can leave less than the low-water mark
    queued and the read then sleeps until the socket timeout (seen here: a 3 s stall in 1 of 7
    96 MiB reads)."""
    pending = [b for b in buffers if len(b)]
    received = 0
    while pending:
        try:
            n = sock.recvmsg_into(pending[:max_iov], 0, socket.MSG_WAITALL)[0]
        except BlockingIOError as error:
            raise TransferTimeout(f"peer sent nothing for the socket timeout ({received} bytes in)") from error
        except ConnectionResetError as error:
            raise PeerClosed("peer reset the connection", received) from error
        if n == 0:
            raise PeerClosed("peer closed the connection", received)
        received += n
        pending = _advance(pending, n)


def sendmsg_all(sock: socket.socket, buffers: list[memoryview], max_iov: int = 512) -> None:
    """Sends every byte of `buffers` in order with scatter/gather calls (one, on a blocking socket,
    unless a signal or the send timeout cuts it short)."""
    pending = [b for b in buffers if len(b)]
    while pending:
        try:
            sent = sock.sendmsg(pending[:max_iov])
        except BlockingIOError as error:
            raise TransferTimeout("peer did not read for the socket timeout") from error
        pending = _advance(pending, sent)


def _advance(buffers: list[memoryview], num_sent: int) -> list[memoryview]:
    """Drops the first `num_sent` bytes from a list of buffers."""
    index = 0
    while index < len(buffers) and num_sent >= len(buffers[index]):
        num_sent -= len(buffers[index])
        index += 1
    rest = buffers[index:]
    if rest and num_sent:
        rest[0] = rest[0][num_sent:]
    return rest


__all__ = ["configure", "connect", "recv_into_exactly", "recvmsg_into_all", "sendmsg_all",
           "set_io_timeout", "wait_readable"]
