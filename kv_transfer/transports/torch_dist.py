"""KV bytes over torch.distributed point-to-point on a private two-rank process group per
producer/consumer pair, never the engine's default group.

The backend follows the cache: NCCL when the KV cache is on CUDA (NCCL itself picks NVLink within a
node and InfiniBand/RoCE across nodes), gloo on CPU. The consumer hosts the pair's rendezvous store
(a TCPStore on a free port) and sends its address in HELLO; the producer joins it as rank 0, the
consumer as rank 1. The group's timeout, and the store's, is the transport's timeout (the pull
timeout on the consumer, the I/O timeout on the producer).

Both sides cut a transfer's bytes at the same places (runs of blocks consecutive on both sides). A
few large ranges (the usual case: one run per layer) go one message each, straight from cache to
cache; many small ones (a fragmented cache) are gathered into one staging buffer, which costs a
device-local copy on each side and saves the per-message latency of every run. The staging buffer
is kept per channel and grows to the largest transfer seen.

Two things keep several messages per pull as fast as one (measured with gloo on 2 CPU cores, see
BENCHMARKS.md): the consumer posts all its receives before the producer posts any send (READY on
the control socket), so every send finds its receive and goes out at once from the calling thread
(a send posted first waits for the receiver's notification and is finished by gloo's I/O thread,
in contention with the caller); and each side waits for its last message first, so it wakes once
per pull rather than once per message.
"""

from __future__ import annotations

import logging
import socket
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from kv_transfer.faults import Fault, FaultInjector
from kv_transfer.transports import faulty
from kv_transfer.transports.base import ConsumerOffer, DataChannel, Transport, total_bytes
from kv_transfer.wire import READY, TransferError, expect, recv_message, send_message

logger = logging.getLogger(__name__)

PRODUCER_RANK, CONSUMER_RANK = 0, 1
MAX_MESSAGES_PER_TRANSFER = 256
MIN_BYTES_PER_MESSAGE = 256 << 10  # below this on average, per-message latency beats a staging copy


def _local_host(sock: socket.socket) -> str:
    return sock.getsockname()[0]


def _process_group(store: dist.Store, rank: int, device: torch.device, host: str, timeout: timedelta):
    if device.type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, 2, options)
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    return dist.ProcessGroupGloo(store, rank, 2, options)


class TorchChannel(DataChannel):
    """Point-to-point on a two-rank group; `peer` is the other rank."""

    kind = "tensors"

    def __init__(self, sock: socket.socket, group, peer: int, device: torch.device, store: dist.Store,
                 timeout_s: float = 30.0, faults: FaultInjector | None = None):
        self._sock = sock
        self._group = group
        self._peer = peer
        self._device = device
        self._store = store  # keeps the rendezvous alive as long as the group
        self._staging = torch.empty(0, dtype=torch.uint8, device=device)
        self._timeout_s = timeout_s
        self.faults = faults   # tests and chaos runs only (kv_transfer.faults)

    def send(self, header: bytes, ranges: Sequence[torch.Tensor]) -> None:
        """SENDING, then (once the consumer says its receives are posted) one send per message."""
        fault = self.faults.next_fault() if self.faults is not None else None
        if fault is not None and fault.kind == "producer_silent":
            faulty.producer_answer(self._sock, header, fault, self._timeout_s)   # raises
        self._sock.sendall(header)
        if _one_message_per_range(ranges):
            messages = list(ranges)
        else:  # the staging copy overlaps with the consumer posting its receive
            messages = [self._staging_for(total_bytes(ranges))]
            torch.cat(list(ranges), out=messages[0])
        expect(recv_message(self._sock), "READY")
        if fault is not None:   # drop_connection_mid_block: the messages before `fraction`, then gone
            self._drop_after(messages[:int(len(messages) * fault.fraction)], len(messages))
        self._wait_all([self._group.send([message], self._peer, tag) for tag, message in enumerate(messages)])

    def _drop_after(self, messages: list[torch.Tensor], of: int) -> None:
        """A producer dying mid-transfer: sends `messages` (of `of`), closes the control socket and
        the pair's group under the consumer, raises TransferError."""
        self._wait_all([self._group.send([message], self._peer, tag) for tag, message in enumerate(messages)])
        faulty.drop(self._sock)
        self.close()
        raise TransferError(f"fault injected: connection dropped after {len(messages)} of {of} messages")

    def recv(self, ranges: Sequence[torch.Tensor], on_received: Callable[[int], None] | None = None) -> None:
        """Posts every receive, says READY on the control socket, waits, unstages if staged. With
        `on_received` (and one message per range), waits for the messages in order and reports
        each as it lands, so the caller sums it while gloo receives the next."""
        fault = self.faults.next_fault() if self.faults is not None else None
        staged = not _one_message_per_range(ranges)
        messages = [self._staging_for(total_bytes(ranges))] if staged else list(ranges)
        if fault is not None:   # the caller sums what landed once recv returns
            self._recv_faulty(messages, fault)
        else:
            works = [self._group.recv([message], self._peer, tag) for tag, message in enumerate(messages)]
            send_message(self._sock, READY)
            if on_received is None or staged:
                self._wait_all(works)
            else:
                landed = 0
                for work, message in zip(works, messages):
                    work.wait()
                    landed += message.numel()
                    on_received(landed)
        if staged:
            offset = 0
            for view in ranges:
                view.copy_(messages[0][offset: offset + view.numel()])
                offset += view.numel()

    def _recv_faulty(self, messages: list[torch.Tensor], fault: Fault) -> None:
        """The consumer's side of `fault`: a reader that posts the receives after `fraction` of the
        messages only `stall_s` later (the producer's sends to them wait, then time out), or the
        bytes received and one flipped (before any checksum is taken over them)."""
        cut = int(len(messages) * fault.fraction) if fault.kind == "stall_reader" else len(messages)
        works = [self._group.recv([message], self._peer, tag) for tag, message in enumerate(messages[:cut])]
        send_message(self._sock, READY)
        self._wait_all(works)
        if fault.kind == "stall_reader":
            logger.warning("fault injected: the KV consumer stops reading for %.1f s", fault.stall_s)
            time.sleep(fault.stall_s)
            self._wait_all([self._group.recv([message], self._peer, tag)
                            for tag, message in enumerate(messages[cut:], start=cut)])
        elif fault.kind == "flip_bytes":
            faulty.flip_tensors(messages, fault.fraction)

    @staticmethod
    def _wait_all(works: list) -> None:
        """Waits for every work, the last one first. One pair delivers a transfer's messages in
        order, so the earlier ones are done by then: the caller wakes once per transfer instead of
        once per message (a wake-up per 1 MiB message cost more than the bytes on a busy core)."""
        for work in reversed(works):
            work.wait()

    def _staging_for(self, num_bytes: int) -> torch.Tensor:
        """A staging buffer kept across transfers: a fresh one per transfer cost a page fault per
        4 KiB on CPU (for an 8k-token prompt of the bench model, more than the copy itself)."""
        if self._staging.numel() < num_bytes:
            self._staging = torch.empty(num_bytes, dtype=torch.uint8, device=self._device)
        return self._staging[:num_bytes]

    def close(self) -> None:
        """Tears the pair's group down; never raises (a group whose peer died may fail to)."""
        try:
            self._group.shutdown()
        except RuntimeError as error:
            logger.debug("KV process group shutdown: %s", error)


def _one_message_per_range(ranges: Sequence[torch.Tensor]) -> bool:
    """Few, large ranges go as they are (no staging copy); many small ones as one staged message.

    Both sides decide on their own ranges, which the wire protocol cuts alike (`KVLayout.views`
    with `paired_with`), so they always agree."""
    return len(ranges) <= MAX_MESSAGES_PER_TRANSFER and total_bytes(ranges) >= MIN_BYTES_PER_MESSAGE * len(ranges)


@dataclass
class _TorchOffer:
    fields: dict
    store: dist.TCPStore
    device: torch.device
    host: str
    timeout: timedelta
    faults: FaultInjector | None = None

    def connect(self, sock: socket.socket, welcome: dict | None = None) -> DataChannel:
        prefixed = dist.PrefixStore(self.fields["pair_id"], self.store)
        group = _process_group(prefixed, CONSUMER_RANK, self.device, self.host, self.timeout)
        return TorchChannel(sock, group, PRODUCER_RANK, self.device, self.store, self.timeout.total_seconds(),
                            self.faults)


class TorchDistTransport(Transport):
    name = "torch"
    sealable = False   # gloo/NCCL carry the KV bytes, in clear

    @property
    def _timeout(self) -> timedelta:
        return timedelta(seconds=self.timeout_s)

    def consumer_offer(self, sock: socket.socket, device: torch.device) -> ConsumerOffer:
        host = _local_host(sock)  # the address the producer already reaches us at
        store = dist.TCPStore(host, 0, world_size=2, is_master=True, timeout=self._timeout, wait_for_workers=False)
        fields = {"store_host": host, "store_port": store.port, "pair_id": f"pdserve-kv-{uuid.uuid4().hex}"}
        return _TorchOffer(fields, store, device, host, self._timeout, self.faults)

    def producer_channel(self, sock: socket.socket, hello: dict, device: torch.device,
                         welcome: dict | None = None) -> DataChannel:
        store = dist.TCPStore(hello["store_host"], hello["store_port"], world_size=2, is_master=False,
                              timeout=self._timeout)
        prefixed = dist.PrefixStore(hello["pair_id"], store)
        group = _process_group(prefixed, PRODUCER_RANK, device, _local_host(sock), self._timeout)
        return TorchChannel(sock, group, CONSUMER_RANK, device, store, self.timeout_s, self.faults)
