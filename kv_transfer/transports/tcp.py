"""KV bytes over the control socket itself: scatter/gather socket I/O straight from and into the
paged cache, no staging copy on either side. Works everywhere; CPU caches only (a CUDA cache would
need a host bounce buffer, which the `torch` transport's NCCL path makes unnecessary).

The producer sends the SENDING header and the ranges with scatter/gather `sendmsg` calls, the
consumer reads them with `recvmsg_into` calls (see `kv_transfer.sockets` for why these and not
single blocking calls); no copy, no per-range call.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from kv_transfer.faults import FaultInjector
from kv_transfer.sockets import recvmsg_into_all, sendmsg_all
from kv_transfer.transports import faulty
from kv_transfer.transports.base import ConsumerOffer, DataChannel, Transport


class TcpChannel(DataChannel):
    kind = "buffers"

    def __init__(self, sock: socket.socket, timeout_s: float, faults: FaultInjector | None = None):
        self._sock = sock
        self._timeout_s = timeout_s
        self.faults = faults

    def send(self, header: bytes, ranges: Sequence[memoryview]) -> None:
        fault = self.faults.next_fault() if self.faults is not None else None
        if fault is not None:
            faulty.producer_send(self._sock, header, ranges, fault, self._timeout_s)
        sendmsg_all(self._sock, [memoryview(header), *ranges], self._timeout_s)

    def recv(self, ranges: Sequence[memoryview], on_received: Callable[[int], None] | None = None) -> None:
        fault = self.faults.next_fault() if self.faults is not None else None
        if fault is not None:
            faulty.consumer_recv(self._sock, ranges, fault)
            return
        recvmsg_into_all(self._sock, list(ranges), on_received=on_received)


@dataclass
class _TcpOffer:
    timeout_s: float
    fields: dict = field(default_factory=dict)
    faults: FaultInjector | None = None

    def connect(self, sock: socket.socket, welcome: dict | None = None) -> DataChannel:
        return TcpChannel(sock, self.timeout_s, self.faults)


class TcpTransport(Transport):
    name = "tcp"

    def consumer_offer(self, sock: socket.socket, device: torch.device) -> ConsumerOffer:
        _require_cpu(device)
        return _TcpOffer(self.timeout_s, faults=self.faults)

    def producer_channel(self, sock: socket.socket, hello: dict, device: torch.device,
                         welcome: dict | None = None) -> DataChannel:
        _require_cpu(device)
        return TcpChannel(sock, self.timeout_s, self.faults)


def _require_cpu(device: torch.device) -> None:
    if device.type != "cpu":
        raise ValueError("the tcp transport moves CPU KV caches only; use the torch transport for CUDA")
