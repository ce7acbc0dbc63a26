"""KV bytes over the control socket itself: scatter/gather socket I/O straight from and into the
paged cache, no staging copy on either side. Works everywhere; CPU caches only (a CUDA cache would
need a host bounce buffer, which the `torch` transport's NCCL path makes unnecessary)."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Sequence

import torch

from kv_transfer.transports.base import ConsumerOffer, DataChannel, Transport
from kv_transfer.wire import recv_into_exactly

_MAX_IOV = 512  # below IOV_MAX (1024 on Linux)
_SOCKET_BUFFER_BYTES = 4 << 20


def _byte_view(view: torch.Tensor) -> memoryview:
    if view.device.type != "cpu":
        raise ValueError("the tcp transport moves CPU KV caches only; use the torch transport for CUDA")
    return memoryview(view.numpy()).cast("B")


def tune_socket(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, _SOCKET_BUFFER_BYTES)


class TcpChannel(DataChannel):
    def __init__(self, sock: socket.socket):
        self._sock = sock

    def send(self, views: Sequence[torch.Tensor]) -> None:
        pending = [_byte_view(v) for v in views if v.numel()]
        while pending:
            batch = pending[:_MAX_IOV]
            sent = self._sock.sendmsg(batch)
            pending = _advance(pending, sent)

    def recv(self, views: Sequence[torch.Tensor]) -> None:
        for view in views:
            if view.numel():
                recv_into_exactly(self._sock, _byte_view(view))


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


@dataclass
class _TcpOffer:
    fields: dict = field(default_factory=dict)

    def connect(self, sock: socket.socket) -> DataChannel:
        return TcpChannel(sock)


class TcpTransport(Transport):
    name = "tcp"

    def consumer_offer(self, sock: socket.socket, device: torch.device) -> ConsumerOffer:
        return _TcpOffer()

    def producer_channel(self, sock: socket.socket, hello: dict, device: torch.device) -> DataChannel:
        return TcpChannel(sock)
