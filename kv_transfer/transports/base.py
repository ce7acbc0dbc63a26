"""The data plane between one KV producer and one consumer.

A connection between them starts as a TCP control socket (see `kv_transfer.wire`). The transport
decides how the bulk bytes travel once the handshake is done:

    consumer: offer = transport.consumer_offer(sock, device) -> fields added to HELLO
    producer: transport.refusal(hello)                    -> why not ("": go on)
    producer: transport.welcome_fields(hello)             -> fields added to WELCOME
    producer: transport.producer_channel(sock, hello, device, welcome) -> DataChannel  (after WELCOME)
    consumer: offer.connect(sock, welcome)                -> DataChannel   (after WELCOME)

A DataChannel moves one transfer's byte ranges: `send(header, ranges)` on the producer, which
also puts the framed SENDING message `header` on the control socket first, and `recv(ranges)` on
the consumer once it has read that header. Both sides pass the ranges of `KVLayout` cut alike
(`paired_with`), as `memoryview`s when the channel's `kind` is "buffers" (socket I/O) or as uint8
tensors when it is "tensors". A "mapped" channel (`shm` on CPU, `cuda_ipc` on CUDA) moves no bytes
through the producer: the consumer copies blocks by id (`copy(local_ids, remote_ids)`), and the
producer answers DONE with DONE_OK. Every wait inside has the transport's timeout. Channels are
used by one thread at a time; callers serialise.
"""

from __future__ import annotations

import socket
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Callable, Literal, Protocol, Sequence

import torch

if TYPE_CHECKING:
    from kv_transfer.faults import FaultInjector
    from kv_transfer.layout import KVLayout

RangeKind = Literal["buffers", "tensors", "mapped"]


class DataChannel(ABC):
    kind: RangeKind = "tensors"
    faults: "FaultInjector | None" = None   # tests and chaos runs only (kv_transfer.faults)
    # A mapped channel whose consumer copies before the producer's answer (`kv_transfer.wire`'s one
    # round trip); set on both ends when the producer offered it at handshake.
    one_round_trip: bool = False

    @abstractmethod
    def send(self, header: bytes, ranges: Sequence) -> None:
        """Sends `header` on the control socket, then the bytes of `ranges`, in order. Returns
        when the local side is done with the ranges (the blocks may be freed after that)."""

    @abstractmethod
    def recv(self, ranges: Sequence, on_received: Callable[[int], None] | None = None) -> None:
        """Fills `ranges`, in order, with the bytes the peer sends. Returns when they are written.
        `on_received(n)`, if given, may be called as the first `n` bytes of the ranges are written
        (n grows; never after a fault was injected): the consumer sums what just landed
        (`kv_transfer.checksum.ReceivedSums`). A channel may also never call it."""

    def begin_transfer(self, sock: socket.socket) -> None:
        """Producer of a one-sided channel, on a COPIED, before it looks at the lease: the point where
        a producer-side fault strikes (the channel's `send` is that point for a PULL)."""
        return None

    def stale(self) -> bool:
        """True when the channel can no longer serve (a one-sided channel whose producer is gone)."""
        return False

    def close(self) -> None:
        return None


class ConsumerOffer(Protocol):
    fields: dict

    def connect(self, sock: socket.socket, welcome: dict) -> DataChannel: ...


class Transport(ABC):
    name: str
    # Whether a sealed connection (kv_transfer.sealed_socket) covers the KV bytes: they ride the
    # control socket (tcp) or never leave the host (shm, cuda_ipc). Not so over gloo/NCCL (torch).
    sealable: bool = True

    def __init__(self, timeout_s: float = 30.0, faults: "FaultInjector | None" = None):
        if timeout_s <= 0:
            raise ValueError(f"a transport timeout must be positive seconds, not {timeout_s}")
        self.timeout_s = timeout_s
        self.faults = faults   # handed to every channel this transport opens

    @abstractmethod
    def consumer_offer(self, sock: socket.socket, device: torch.device) -> ConsumerOffer:
        """Called on a connected control socket, before HELLO."""

    def refusal(self, hello: dict) -> str:
        """Producer: why this consumer's HELLO cannot get a channel of this transport ("": it can)."""
        return ""

    def welcome_fields(self, hello: dict) -> dict:
        """Producer: what the consumer needs in WELCOME to open the channel."""
        return {}

    @abstractmethod
    def producer_channel(self, sock: socket.socket, hello: dict, device: torch.device,
                         welcome: dict | None = None) -> DataChannel: ...


def byte_ranges(channel: DataChannel, layout: "KVLayout", runs: list[tuple[int, int]]) -> list:
    """The ranges `channel` moves for `runs` (cut by `layout.runs`), in the form it wants."""
    if channel.kind == "mapped":
        return []  # the consumer copies by block id
    if channel.kind == "buffers":
        return layout.buffers_of(runs)
    return layout.views_of(runs)


def total_bytes(views: Sequence[torch.Tensor]) -> int:
    return sum(view.numel() for view in views)


TransportName = Literal["tcp", "torch", "shm", "auto"]
TRANSPORTS: tuple[TransportName, ...] = ("tcp", "torch", "shm", "auto")
# What a producer configured with a transport serves: a cache in shared memory serves tcp too.
# An `auto` consumer is served by every producer (tcp where there is no segment to read).
SERVED: dict[str, tuple[str, ...]] = {"tcp": ("tcp", "auto"), "torch": ("torch", "auto"),
                                      "shm": ("shm", "auto", "tcp"), "auto": ("auto", "shm", "tcp")}
# The same on CUDA, where the fallback of shm and auto is torch (NCCL) rather than tcp.
SERVED_CUDA: dict[str, tuple[str, ...]] = {"tcp": ("tcp", "auto"), "torch": ("torch", "auto"),
                                           "shm": ("shm", "auto", "torch"), "auto": ("auto", "shm", "torch")}


def served(name: str, device_type: str = "cpu") -> tuple[str, ...]:
    """The transports a producer configured with `name` serves, for a cache on `device_type`."""
    return (SERVED if device_type == "cpu" else SERVED_CUDA)[name]


def get_transport(name: str, timeout_s: float = 30.0, cache=None, local: "KVLayout | None" = None,
                  device: torch.device | None = None, faults: "FaultInjector | None" = None) -> Transport:
    """`tcp`, `torch` (torch.distributed p2p: gloo for CPU caches, nccl for CUDA caches), `shm`
    (one-sided reads of the producer's cache) or `auto` (one-sided on one node, else tcp on CPU and
    torch on CUDA); every wait inside the transport gives up after `timeout_s`.

    `shm` and `auto` pick their implementation by the cache's `device` (default: `local`'s, else
    the CPU): a segment on CPU (`kv_transfer.transports.shm`), CUDA IPC handles on CUDA
    (`kv_transfer.transports.cuda_ipc`). A producer passes its `cache` (`SharedCache` on CPU,
    `CudaCache` on CUDA, or None) and its device, a consumer its `local` layout. `faults`: an
    injector for tests and chaos runs, which every transport acts on."""
    device_type = (device or (local.device if local is not None else torch.device("cpu"))).type
    if name in ("shm", "auto") and device_type == "cuda":
        from kv_transfer.transports.cuda_ipc import CudaIpcTransport

        return CudaIpcTransport(timeout_s, cache=cache, local=local, fallback_torch=name == "auto", faults=faults)
    if name in ("shm", "auto"):
        from kv_transfer.transports.shm import ShmTransport

        return ShmTransport(timeout_s, cache=cache, local=local, fallback_tcp=name == "auto", faults=faults)
    if name == "tcp":
        from kv_transfer.transports.tcp import TcpTransport

        return TcpTransport(timeout_s, faults)
    if name == "torch":
        from kv_transfer.transports.torch_dist import TorchDistTransport

        return TorchDistTransport(timeout_s, faults)
    raise ValueError(f"unknown KV transport {name!r}: choose one of {', '.join(TRANSPORTS)}")
