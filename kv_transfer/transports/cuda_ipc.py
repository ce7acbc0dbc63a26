"""One-sided KV reads between GPUs of one node through CUDA IPC: what `shm` and `auto` mean when
the KV cache is on CUDA (`get_transport` picks this transport by the cache's device).

The discipline is `shm`'s. The producer's WELCOME describes its cache as IPC handles
(`kv_transfer.transports.cuda_ipc_cache`: base64 in JSON, no pickle). The consumer opens them once
per connection, proves with CHANNEL that it mapped the same memory (the hash of a token it read
through its own mapping), and from then on copies each transfer's blocks itself, device to device,
on a stream of its own that it synchronizes before it says DONE (`CudaIpcConsumerChannel.copy`).
The producer sends no KV byte: SENDING, then DONE_OK after DONE, as with shm (channel kind
"mapped"); its lease pins the blocks from PULL to DONE, so the engine cannot reuse them during the
copy. The blocks' contents are complete on the device before PULL can find the lease: vLLM only
finishes a request (and we only grant its lease) after the step that wrote its KV reached the CPU.

Which channel a connection gets is decided at handshake (`choose_channel`): CUDA IPC needs the
same kernel boot on both sides, a cache whose handles were exported, and the producer's GPU among
the consumer's visible devices (HELLO carries their UUIDs). `auto` takes the torch transport (NCCL)
when any of that fails, or when the consumer cannot open the handles or proves the wrong memory;
`shm` refuses instead, with the reason. For the NCCL fallback the consumer sends its rendezvous
store in a second CHANNEL message, so a connection that gets CUDA IPC never starts a store.

Lifetime: a consumer keeps the opened handles as long as its connection; they close when the
connection is dropped, which happens when it fails, when the client closes, and when the producer
is gone (`stale`: the producer closed the control connection, e.g. its engine stopped; a mapping
of a dead producer's cache would keep that GPU memory allocated).
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from kv_transfer.faults import FaultInjector
from kv_transfer.layout import KVLayout
from kv_transfer.shm_segment import boot_id
from kv_transfer.sockets import peer_closed
from kv_transfer.transports import faulty
from kv_transfer.transports.base import ConsumerOffer, DataChannel, Transport
from kv_transfer.transports.choice import CUDA_NOT_EXPORTED, ChannelChoice, choose_channel, same_boot
from kv_transfer.transports.cuda_ipc_backend import IpcBackend, TorchCudaIpcBackend
from kv_transfer.transports.cuda_ipc_cache import CudaCache, OpenedCache, open_cache, plan_copies, proof
from kv_transfer.transports.shm import ShmProducerChannel
from kv_transfer.transports.torch_dist import TorchDistTransport
from kv_transfer.wire import TransferError, expect, recv_message, require_field, send_message

logger = logging.getLogger(__name__)

# What opening a producer's handles can fail with, besides TransferError: the driver (RuntimeError),
# and a description that is well-formed JSON but not what we expect.
_OPEN_ERRORS = (RuntimeError, ValueError, KeyError, TypeError, IndexError)


class CudaIpcConsumerChannel(DataChannel):
    """The consumer's end: copies blocks out of the producer's opened cache into its own."""

    kind = "mapped"

    def __init__(self, sock: socket.socket, opened: OpenedCache, local: KVLayout, backend: IpcBackend,
                 faults: FaultInjector | None = None):
        self._sock, self._opened, self._local, self._backend = sock, opened, local, backend
        self._stream = backend.new_stream(opened.remote.device, local.device)
        self.faults = faults   # tests and chaos runs only (kv_transfer.faults)

    @property
    def proof(self) -> str:
        return proof(self._opened.token)

    def send(self, header: bytes, ranges: Sequence) -> None:
        raise TransferError("a consumer's CUDA IPC channel sends nothing")

    def recv(self, ranges: Sequence, on_received=None) -> None:
        raise TransferError("a CUDA IPC channel copies by block ids: call copy()")

    def copy(self, local_block_ids: Sequence[int], remote_block_ids: Sequence[int]) -> int:
        """Copies the producer's `remote_block_ids` into our `local_block_ids` (the same order), one
        copy per run of blocks consecutive on both sides, per layer and plane. Returns the bytes
        copied, once they are all on our device (also when enqueueing failed half-way)."""
        if self._opened is None:
            raise TransferError("the CUDA IPC channel is closed")
        pairs = plan_copies(self._local, self._opened.remote, local_block_ids, remote_block_ids)
        fault = self.faults.next_fault() if self.faults is not None else None
        if fault is not None and fault.kind == "stall_reader":
            cut = max(1, int(len(pairs) * fault.fraction))
            self._copy(pairs[:cut])
            logger.warning("fault injected: the KV consumer stops copying for %.1f s", fault.stall_s)
            time.sleep(fault.stall_s)
            self._copy(pairs[cut:])
        else:
            self._copy(pairs)
            if fault is not None and fault.kind == "flip_bytes":   # before the caller's checksum
                faulty.flip_tensors([target for target, _ in pairs], fault.fraction)
        return sum(target.numel() for target, _ in pairs)

    def _copy(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        try:
            self._backend.copy(pairs, self._stream)
        finally:
            self._backend.synchronize(self._stream)  # nothing in flight may outlive the pin

    def stale(self) -> bool:
        """True once the producer closed the control connection (it stopped or died)."""
        return peer_closed(self._sock)

    def close(self) -> None:
        """Closes the IPC mappings (the caller holds no copy in flight: the connection's lock)."""
        self._opened = None


@dataclass
class _CudaIpcOffer:
    """The consumer's half of the handshake."""

    transport: "CudaIpcTransport"
    device: torch.device
    fields: dict

    def connect(self, sock: socket.socket, welcome: dict) -> DataChannel:
        """Opens the channel WELCOME offers, or NCCL under `auto`; CHANNEL says which (with the proof
        for CUDA IPC) and the producer's CHANNEL_OK says which it accepted."""
        transport, channel = self.transport, None
        if welcome.get("channel") == "cuda_ipc":
            try:
                channel = transport.open_channel(sock, welcome)
            except _OPEN_ERRORS as error:  # TransferError included
                if not transport.fallback_torch:
                    send_message(sock, {"op": "CHANNEL", "kind": "none"})
                    raise TransferError(f"cannot open the producer's CUDA IPC handles: {error}") from error
                logger.info("KV over torch (NCCL): the producer's CUDA IPC handles cannot be opened here (%s)", error)
        elif not (transport.fallback_torch and welcome.get("channel") == "torch"):
            raise TransferError(f"the producer offers no CUDA IPC channel ({welcome.get('channel')!r})")
        if channel is not None:
            send_message(sock, {"op": "CHANNEL", "kind": "cuda_ipc", "proof": channel.proof})
            accepted = expect(recv_message(sock), "CHANNEL_OK").get("kind")
            if accepted == "cuda_ipc":
                return channel
            channel.close()
            if accepted != "torch" or not transport.fallback_torch:
                raise TransferError(f"the producer accepted no usable channel ({accepted!r})")
            logger.info("KV over torch (NCCL): the producer did not accept our view of its cache")
        return self._torch_channel(sock, welcome)

    def _torch_channel(self, sock: socket.socket, welcome: dict) -> DataChannel:
        """The NCCL fallback: our rendezvous store goes in CHANNEL, then both sides join the group."""
        offer = self.transport.torch.consumer_offer(sock, self.device)
        send_message(sock, {"op": "CHANNEL", "kind": "torch", **offer.fields})
        accepted = expect(recv_message(sock), "CHANNEL_OK").get("kind")
        if accepted != "torch":
            raise TransferError(f"the producer accepted no usable channel ({accepted!r})")
        return offer.connect(sock, welcome)


class CudaIpcTransport(Transport):
    """`shm` (or with `fallback_torch`, `auto`) for CUDA caches. A producer passes its `CudaCache`
    (None: not exported, its transport is neither shm nor auto); a consumer its own `local` layout
    to copy into. `backend` is every CUDA call (default: PyTorch's)."""

    def __init__(self, timeout_s: float = 30.0, cache: CudaCache | None = None, local: KVLayout | None = None,
                 fallback_torch: bool = False, backend: IpcBackend | None = None,
                 faults: FaultInjector | None = None):
        super().__init__(timeout_s, faults)
        self.cache, self.local, self.fallback_torch = cache, local, fallback_torch
        self.name = "auto" if fallback_torch else "shm"
        self.sealable = not fallback_torch   # its fallback moves KV bytes over NCCL, in clear
        self.backend = backend if backend is not None else TorchCudaIpcBackend()
        self.torch = TorchDistTransport(timeout_s, faults)

    # ---- consumer ----
    def consumer_offer(self, sock: socket.socket, device: torch.device) -> ConsumerOffer:
        return _CudaIpcOffer(self, device, {"boot_id": boot_id(), "gpu_uuids": list(self.backend.device_uuids())})

    def open_channel(self, sock: socket.socket, welcome: dict) -> CudaIpcConsumerChannel:
        if self.local is None:
            raise TransferError("no local KV layout to copy into")
        opened = open_cache(self.backend, require_field(welcome, "cuda_ipc", dict), self.local)
        return CudaIpcConsumerChannel(sock, opened, self.local, self.backend, self.faults)

    # ---- producer ----
    def choice(self, hello: dict) -> ChannelChoice:
        """The channel this consumer gets (see `kv_transfer.transports.choice`)."""
        cache = self.cache
        exported = cache is not None and cache.description is not None
        uuids = hello.get("gpu_uuids")
        visible = exported and isinstance(uuids, list) and cache.device_uuid in uuids
        choice = choose_channel("cuda", self.name, same_boot=same_boot(hello, boot_id()), peer_gpu_visible=visible,
                                cache_shared=exported)
        if choice.reason == CUDA_NOT_EXPORTED and cache is not None and cache.export_error:
            return ChannelChoice(choice.channel, f"{choice.reason}: {cache.export_error}")
        return choice

    def refusal(self, hello: dict) -> str:
        choice = self.choice(hello)
        return choice.reason if choice.channel is None else ""

    def welcome_fields(self, hello: dict) -> dict:
        choice = self.choice(hello)
        if choice.channel == "cuda_ipc":
            return {"channel": "cuda_ipc", "cuda_ipc": self.cache.description}
        logger.info("KV over torch (NCCL) for this consumer: %s", choice.reason)
        return {"channel": "torch"}

    def producer_channel(self, sock: socket.socket, hello: dict, device: torch.device,
                         welcome: dict | None = None) -> DataChannel:
        """CUDA IPC when the consumer proves it opened our cache; under `auto` NCCL otherwise (a
        wrong proof gets CHANNEL_OK "torch", and the consumer's next CHANNEL brings its store)."""
        reply = expect(recv_message(sock), "CHANNEL")
        if reply.get("kind") == "cuda_ipc":
            if (welcome or {}).get("channel") == "cuda_ipc" and reply.get("proof") == proof(self.cache.token):
                send_message(sock, {"op": "CHANNEL_OK", "kind": "cuda_ipc"})
                return ShmProducerChannel(sock, self.timeout_s, self.faults)
            if not self.fallback_torch:
                send_message(sock, {"op": "CHANNEL_OK", "kind": "none"})
                raise TransferError("the consumer's CUDA IPC proof does not match our cache: it opened other memory")
            send_message(sock, {"op": "CHANNEL_OK", "kind": "torch"})  # it opened other memory: NCCL instead
            reply = expect(recv_message(sock), "CHANNEL")
        if reply.get("kind") == "torch" and self.fallback_torch:
            send_message(sock, {"op": "CHANNEL_OK", "kind": "torch"})
            return self.torch.producer_channel(sock, {**hello, **reply}, device)
        send_message(sock, {"op": "CHANNEL_OK", "kind": "none"})
        raise TransferError(f"the consumer could not open a {self.name} channel ({reply.get('kind')!r})")
