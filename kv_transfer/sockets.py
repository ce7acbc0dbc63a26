"""Socket settings and exact-length I/O shared by the control plane and the `tcp` transport.

Sockets here stay in blocking mode. A Python socket in timeout mode (`settimeout(x)`) polls before
every call and reacquires the GIL between chunks; instead the kernel enforces the timeout
(`SO_RCVTIMEO`/`SO_SNDTIMEO`): a call that makes no progress for that long fails with `EAGAIN`,
which surfaces here as `TransferTimeout`. A connection's *idle* time between two exchanges is not a
call and has no timeout: TCP keepalive finds a peer that vanished instead.

Bulk connections also choose their TCP congestion control (`congestion`, default "cubic", falling
back to "reno", which Linux always lets a process pick; "" keeps the host's default). The host's
default may be BBR, which paces every send at its bandwidth estimate: on loopback between two
pinned cores, 96 MiB took 25-28 ms under BBR and 13.7-14.7 ms under cubic or reno, 12 MiB 2.5 ms
and 1.95-2.05 ms, with BBR's spread three times wider. BBR is built for long, shared WAN paths; a
prefill-to-decode link is one hop in a cluster.
"""

from __future__ import annotations

import logging
import select
import socket
import struct
from collections.abc import Callable

from kv_transfer.errors import PeerClosed, TransferTimeout

logger = logging.getLogger(__name__)

# A peer silent this long gets keepalive probes; unanswered probes close the connection.
KEEPALIVE_IDLE_S = 30
KEEPALIVE_INTERVAL_S = 10
KEEPALIVE_PROBES = 3

DEFAULT_CONGESTION = "cubic"
_FALLBACK_CONGESTION = "reno"  # in every Linux's net.ipv4.tcp_allowed_congestion_control


def configure(sock: socket.socket, io_timeout_s: float, congestion: str = DEFAULT_CONGESTION) -> None:
    """Blocking mode with kernel-side timeouts, keepalive probes on idle, and `tune_bulk`."""
    sock.settimeout(None)
    tune_bulk(sock, congestion)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                        ("TCP_KEEPCNT", KEEPALIVE_PROBES)):
        if hasattr(socket, name):  # Linux; other systems keep their defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    set_io_timeout(sock, io_timeout_s)


def tune_bulk(sock: socket.socket, congestion: str = DEFAULT_CONGESTION) -> None:
    """No Nagle delay and `congestion` control (if the host lets us). The socket buffers stay with
    the kernel's autotuning: with cubic, fixed 4 MiB buffers measured the same (12 MiB in 1.96 vs
    2.00 ms, 96 MiB in 14.5 vs 14.9 ms); they only helped under BBR."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if congestion and hasattr(socket, "TCP_CONGESTION"):
        _set_congestion(sock, congestion)


def _set_congestion(sock: socket.socket, name: str) -> None:
    """`name`, else reno; else the host's default stays (a socket works with any of them)."""
    for candidate in dict.fromkeys((name, _FALLBACK_CONGESTION)):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, candidate.encode())
            return
        except OSError as error:  # not loaded, or not allowed without CAP_NET_ADMIN
            logger.debug("TCP congestion control %s unavailable: %s", candidate, error)


def set_io_timeout(sock: socket.socket, seconds: float) -> None:
    """Every later send/recv call on `sock` fails with `TransferTimeout` after `seconds` without progress."""
    if seconds <= 0:
        raise ValueError(f"an I/O timeout must be positive seconds, not {seconds}")
    whole = int(seconds)
    timeval = struct.pack("@ll", whole, int((seconds - whole) * 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)


def connect(host: str, port: int, timeout_s: float, congestion: str = DEFAULT_CONGESTION) -> socket.socket:
    """A connected, `configure`d socket; the connect itself waits at most `timeout_s`."""
    sock = socket.create_connection((host, port), timeout=timeout_s)
    try:
        configure(sock, timeout_s, congestion)
    except BaseException:
        sock.close()
        raise
    return sock


def wait_readable(sock: socket.socket) -> None:
    """Blocks, without a timeout, until `sock` has data, its peer closed, or it failed (a keepalive
    timeout included). Another thread's `sock.shutdown()` wakes it too. A sealed socket's bytes
    already opened count as data (`kv_transfer.sealed_socket.SealedSocket.pending_bytes`)."""
    if getattr(sock, "pending_bytes", 0):
        return
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLPRI)
    poller.poll()


def peer_closed(sock: socket.socket) -> bool:
    """True when the peer closed or reset `sock` (or it is closed here). Never blocks and consumes
    nothing, so it is safe next to another thread's exchange on a blocking-mode socket (`configure`)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False  # nothing to read: the connection is alive and idle
    except OSError:
        return True


RECV_CHUNK_BYTES = 256 << 10   # at most this much per read (recvmsg_into_all)


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


def recvmsg_into_all(sock: socket.socket, buffers: list[memoryview], max_iov: int = 512,
                     on_received: Callable[[int], None] | None = None, chunk_bytes: int = RECV_CHUNK_BYTES) -> None:
    """Fills every buffer of `buffers` in order with scatter reads, each taking what has arrived, up
    to `chunk_bytes`. Errors as `recv_into_exactly`. `on_received(bytes received so far)` after each
    read lets the caller work on what just landed while it is in this core's cache (the KV
    checksums, `kv_transfer.checksum.ReceivedSums`).

    Measured (loopback, 12 spread 8 MiB ranges): reading what has arrived, call after call, moved
    96 MiB in 20.7 ms where one `MSG_WAITALL` call took 22.2 ms; the same at 12 MiB. Capping each
    read at 256 KiB then took 12 MiB from 3.3-7.6 ms to 2.0-3.4 ms (medians of four interleaved A/B
    runs, sender on core 0, reader on core 1): a read of everything queued holds the socket for a
    long copy while the sender's segments wait in its backlog. Not done, on purpose: raising `SO_RCVLOWAT` to wake once per MiB.
    It was faster still, but a window-limited sender can leave less than the low-water mark queued,
    and the read then sleeps until the socket timeout (seen here: a 3 s stall in 1 of 7 96 MiB reads)."""
    pending = [b for b in buffers if len(b)]
    received = 0
    while pending:
        try:
            n = sock.recvmsg_into(_first_bytes(pending[:max_iov], chunk_bytes))[0]
        except BlockingIOError as error:
            raise TransferTimeout(f"peer sent nothing for the socket timeout ({received} bytes in)") from error
        except ConnectionResetError as error:
            raise PeerClosed("peer reset the connection", received) from error
        if n == 0:
            raise PeerClosed("peer closed the connection", received)
        received += n
        pending = _advance(pending, n)
        if on_received is not None:
            on_received(received)


def _first_bytes(buffers: list[memoryview], num_bytes: int) -> list[memoryview]:
    """The first `num_bytes` of `buffers` (all of them if fewer), as a list of buffers."""
    taken = []
    for buffer in buffers:
        if num_bytes <= 0:
            break
        taken.append(buffer[:num_bytes])
        num_bytes -= len(buffer)
    return taken


def sendmsg_all(sock: socket.socket, buffers: list[memoryview], timeout_s: float, max_iov: int = 512) -> None:
    """Sends every byte of `buffers` in order: non-blocking scatter/gather sends of what the socket
    buffer takes, and a wait for room (at most `timeout_s`) in between.

    Measured against one blocking `sendmsg` of everything (which sleeps inside the kernel with the
    socket locked, so acknowledgements wait in the backlog): 96 MiB in 20.7 ms instead of 26.6 ms,
    12 MiB alike."""
    pending = [b for b in buffers if len(b)]
    poller = None
    while pending:
        try:
            sent = sock.sendmsg(pending[:max_iov], [], socket.MSG_DONTWAIT)
        except BlockingIOError:
            if poller is None:
                poller = select.poll()
                poller.register(sock, select.POLLOUT)
            if not poller.poll(int(timeout_s * 1000)):
                raise TransferTimeout(f"peer did not read for {timeout_s} s") from None
            continue
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


__all__ = ["DEFAULT_CONGESTION", "configure", "connect", "peer_closed", "recv_into_exactly", "recvmsg_into_all",
           "sendmsg_all", "set_io_timeout", "tune_bulk", "wait_readable"]
