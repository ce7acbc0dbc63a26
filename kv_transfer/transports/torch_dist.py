"""KV bytes over torch.distributed point-to-point on a private two-rank process group per
producer/consumer pair, never the engine's default group.

The backend follows the cache: NCCL when the KV cache is on CUDA (NCCL itself picks NVLink within a
node and InfiniBand/RoCE across nodes), gloo on CPU. The consumer hosts the pair's rendezvous store
(a TCPStore on a free port) and sends its address in HELLO; the producer joins it as rank 0, the
consumer as rank 1. Both sides cut a transfer's bytes at the same places (runs of blocks consecutive
on both sides). A few large views (the usual case: one run per layer) go one message each, straight
from cache to cache; many small ones (a fragmented cache) are gathered into one staging buffer,
which costs a device-local copy on each side and saves the per-message latency of every run. The
staging buffer is kept per channel and grows to the largest transfer seen.
"""

from __future__ import annotations

import socket
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Sequence

import torch
import torch.distributed as dist

from kv_transfer.transports.base import ConsumerOffer, DataChannel, Transport, total_bytes

PRODUCER_RANK, CONSUMER_RANK = 0, 1
MAX_MESSAGES_PER_TRANSFER = 256
MIN_BYTES_PER_MESSAGE = 256 << 10  # below this on average, per-message latency beats a staging copy
_TIMEOUT = timedelta(seconds=60)


def _local_host(sock: socket.socket) -> str:
    return sock.getsockname()[0]


def _process_group(store: dist.Store, rank: int, device: torch.device, host: str):
    if device.type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        return dist.ProcessGroupNCCL(store, rank, 2, options)
    options = dist.ProcessGroupGloo._Options()
    options._timeout = _TIMEOUT
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    return dist.ProcessGroupGloo(store, rank, 2, options)


class TorchChannel(DataChannel):
    """Point-to-point on a two-rank group; `peer` is the other rank."""

    def __init__(self, group, peer: int, device: torch.device, store: dist.Store):
        self._group = group
        self._peer = peer
        self._device = device
        self._store = store  # keeps the rendezvous alive as long as the group
        self._staging = torch.empty(0, dtype=torch.uint8, device=device)

    def send(self, views: Sequence[torch.Tensor]) -> None:
        if _one_message_per_view(views):
            for work in [self._group.send([view], self._peer, tag) for tag, view in enumerate(views)]:
                work.wait()
            return
        payload = self._staging_for(total_bytes(views))
        torch.cat(list(views), out=payload)
        self._group.send([payload], self._peer, 0).wait()

    def recv(self, views: Sequence[torch.Tensor]) -> None:
        if _one_message_per_view(views):
            for work in [self._group.recv([view], self._peer, tag) for tag, view in enumerate(views)]:
                work.wait()
            return
        staging = self._staging_for(total_bytes(views))
        self._group.recv([staging], self._peer, 0).wait()
        offset = 0
        for view in views:
            view.copy_(staging[offset : offset + view.numel()])
            offset += view.numel()

    def _staging_for(self, num_bytes: int) -> torch.Tensor:
        """A staging buffer kept across transfers: a fresh one per transfer cost a page fault per
        4 KiB on CPU (for an 8k-token prompt of the bench model, more than the copy itself)."""
        if self._staging.numel() < num_bytes:
            self._staging = torch.empty(num_bytes, dtype=torch.uint8, device=self._device)
        return self._staging[:num_bytes]

    def close(self) -> None:
        shutdown = getattr(self._group, "shutdown", None)
        if shutdown is not None:
            shutdown()


def _one_message_per_view(views: Sequence[torch.Tensor]) -> bool:
    """Few, large views go as they are (no staging copy); many small ones as one staged message.

    Both sides decide on their own views, which the wire protocol cuts alike (`KVLayout.views`
    with `paired_with`), so they always agree."""
    return len(views) <= MAX_MESSAGES_PER_TRANSFER and total_bytes(views) >= MIN_BYTES_PER_MESSAGE * len(views)


@dataclass
class _TorchOffer:
    fields: dict
    store: dist.TCPStore
    device: torch.device
    host: str

    def connect(self, sock: socket.socket) -> DataChannel:
        prefixed = dist.PrefixStore(self.fields["pair_id"], self.store)
        group = _process_group(prefixed, CONSUMER_RANK, self.device, self.host)
        return TorchChannel(group, PRODUCER_RANK, self.device, self.store)


class TorchDistTransport(Transport):
    name = "torch"

    def consumer_offer(self, sock: socket.socket, device: torch.device) -> ConsumerOffer:
        host = _local_host(sock)  # the address the producer already reaches us at
        store = dist.TCPStore(host, 0, world_size=2, is_master=True, timeout=_TIMEOUT, wait_for_workers=False)
        fields = {"store_host": host, "store_port": store.port, "pair_id": f"pdserve-kv-{uuid.uuid4().hex}"}
        return _TorchOffer(fields, store, device, host)

    def producer_channel(self, sock: socket.socket, hello: dict, device: torch.device) -> DataChannel:
        store = dist.TCPStore(hello["store_host"], hello["store_port"], world_size=2, is_master=False, timeout=_TIMEOUT)
        prefixed = dist.PrefixStore(hello["pair_id"], store)
        group = _process_group(prefixed, PRODUCER_RANK, device, _local_host(sock))
        return TorchChannel(group, CONSUMER_RANK, device, store)
