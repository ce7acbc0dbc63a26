"""The data plane between one KV producer and one consumer.

A connection between them starts as a TCP control socket (see `kv_transfer.wire`). The transport
decides how the bulk bytes travel once the handshake is done:

    consumer: offer = transport.consumer_offer(sock, device) -> fields added to HELLO
    producer: transport.producer_channel(sock, hello, device) -> DataChannel   (after WELCOME)
    consumer: offer.connect(sock)                         -> DataChannel   (after WELCOME)

A DataChannel moves an ordered list of flat uint8 tensors: `send(views)` on one side and
`recv(views)` on the other, with the same total byte count (the views may be cut differently).
Channels are used by one thread at a time; callers serialise.
"""

from __future__ import annotations

import socket
from abc import ABC, abstractmethod
from typing import Protocol, Sequence

import torch


class DataChannel(ABC):
    @abstractmethod
    def send(self, views: Sequence[torch.Tensor]) -> None:
        """Sends the bytes of `views`, in order. Returns when the local side is done with them."""

    @abstractmethod
    def recv(self, views: Sequence[torch.Tensor]) -> None:
        """Fills `views`, in order, with the bytes the peer sends. Returns when they are written."""

    def close(self) -> None:
        return None


class ConsumerOffer(Protocol):
    fields: dict

    def connect(self, sock: socket.socket) -> DataChannel: ...


class Transport(ABC):
    name: str

    @abstractmethod
    def consumer_offer(self, sock: socket.socket, device: torch.device) -> ConsumerOffer:
        """Called on a connected control socket, before HELLO."""

    @abstractmethod
    def producer_channel(self, sock: socket.socket, hello: dict, device: torch.device) -> DataChannel: ...


def total_bytes(views: Sequence[torch.Tensor]) -> int:
    return sum(view.numel() for view in views)


def get_transport(name: str) -> Transport:
    """`tcp` or `torch` (torch.distributed p2p: gloo for CPU caches, nccl for CUDA caches)."""
    if name == "tcp":
        from kv_transfer.transports.tcp import TcpTransport

        return TcpTransport()
    if name == "torch":
        from kv_transfer.transports.torch_dist import TorchDistTransport

        return TorchDistTransport()
    raise ValueError(f"unknown KV transport {name!r}: choose 'tcp' or 'torch'")
