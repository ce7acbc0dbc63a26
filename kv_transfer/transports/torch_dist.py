"""KV bytes over torch.distributed point-to-point on a private two-rank process group per
producer/consumer pair, never the engine's default group.

The backend follows the cache: NCCL when the KV cache is on CUDA (NCCL itself picks NVLink within a
node and InfiniBand/RoCE across nodes), gloo on CPU. The consumer hosts the pair's rendezvous store
(a TCPStore on a free port) and sends its address in HELLO; the producer joins it as rank 0, the
consumer as rank 1. Each transfer is one message: the views are gathered into one staging buffer
(skipped when the request's blocks form one run), which costs a device-local copy on each side and
saves a round of per-message latency for every block run.
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

    def send(self, views: Sequence[torch.Tensor]) -> None:
        payload = views[0] if len(views) == 1 else torch.cat([v for v in views])
        self._group.send([payload], self._peer, 0).wait()

    def recv(self, views: Sequence[torch.Tensor]) -> None:
        if len(views) == 1:
            self._group.recv([views[0]], self._peer, 0).wait()
            return
        staging = torch.empty(total_bytes(views), dtype=torch.uint8, device=self._device)
        self._group.recv([staging], self._peer, 0).wait()
        offset = 0
        for view in views:
            view.copy_(staging[offset : offset + view.numel()])
            offset += view.numel()

    def close(self) -> None:
        shutdown = getattr(self._group, "shutdown", None)
        if shutdown is not None:
            shutdown()


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
