"""One-sided KV reads through shared memory (`shm`), and `auto`: shm on one host, tcp otherwise.

The producer's paged cache lives in a segment (`kv_transfer.shm_segment`); the WELCOME of a
handshake describes it (`SharedCache.describe`: path, size, and each layer's place in it). The
consumer maps it once per connection, read-only, proves with CHANNEL that it reads the same memory,
and from then on copies each transfer's blocks itself, cache to cache (`ShmConsumerChannel.copy`).
The producer's CPU sends only control messages; its lease pins the blocks from PULL to DONE as on
every transport, and its DONE_OK after DONE tells the consumer the pin held for the whole copy (a
producer that gave up waiting closed the connection instead, and the pull fails: recompute).
The consumer does not wait for the producer before copying (one round trip per pull, see
`kv_transfer.wire`): the producer's DONE_OK then also says the lease was granted before the copy
began; RECOPY says copy once more, now that the blocks are pinned. Where the producer's lease
board (`kv_transfer.lease_board`, in the segment's header page) vouches for the copy, the consumer
does not even wait for that: it sends COPIED as a notice and goes on.

Which channel a connection gets is decided at handshake, never from addresses alone: `shm` needs
the same kernel boot on both sides (HELLO carries the consumer's boot id), a producer whose cache
is in a segment, and a consumer that can open that segment and read its token. `auto` takes tcp
when any of that fails; `shm` refuses instead (an operator asked for it); the decision itself is
`kv_transfer.transports.choice.choose_channel`. CUDA caches take the same names to CUDA IPC within
a node and NCCL otherwise (`kv_transfer.transports.cuda_ipc`, chosen by `get_transport`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from kv_transfer.checksum import block_checksums, copy_with_checksums
from kv_transfer.faults import FaultInjector
from kv_transfer.layout import KVLayout, paired_runs
from kv_transfer.lease_board import BoardReader
from kv_transfer.shm_segment import MappedSegment, Segment, SegmentError, boot_id, map_segment, proof
from kv_transfer.transports import faulty
from kv_transfer.transports.base import ConsumerOffer, DataChannel, Transport
from kv_transfer.transports.choice import choose_channel, same_boot
from kv_transfer.transports.tcp import TcpChannel
from kv_transfer.wire import TransferError, expect, recv_message, require_field, send_message

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SharedCache:
    """A producer's cache as a consumer needs to find it in the segment."""

    segment: Segment
    num_blocks: int
    layers: tuple[dict, ...]   # name, offset (bytes from the data start), shape, stride, dtype

    @classmethod
    def of(cls, segment: Segment, kv_caches: dict[str, torch.Tensor], num_blocks: int) -> "SharedCache":
        """Raises SegmentError unless every cache tensor lies in `segment` (vLLM allocated the cache
        through `SegmentAllocation`)."""
        layers = []
        for name in sorted(kv_caches):
            tensor = kv_caches[name]
            if tensor.untyped_storage().data_ptr() != segment.base_address:
                raise SegmentError(f"layer {name}'s KV cache is not in the shared segment")
            layers.append({"name": name, "offset": tensor.data_ptr() - segment.base_address,
                           "shape": list(tensor.shape), "stride": list(tensor.stride()),
                           "dtype": str(tensor.dtype).removeprefix("torch.")})
        return cls(segment, num_blocks, tuple(layers))

    def describe(self) -> dict:
        return {"path": str(self.segment.path), "size": self.segment.size, "num_blocks": self.num_blocks,
                "layers": list(self.layers)}


def remote_layout(mapped: MappedSegment, description: dict) -> KVLayout:
    """The producer's cache as a `KVLayout` over a read-only map, every layer checked to lie inside."""
    tensors = {}
    for layer in require_field(description, "layers", list):
        dtype = getattr(torch, str(layer["dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise TransferError(f"unknown KV dtype {layer['dtype']!r} in the producer's description")
        element = torch.empty((), dtype=dtype).element_size()
        offset, shape, stride = int(layer["offset"]), [int(s) for s in layer["shape"]], [int(s) for s in layer["stride"]]
        extent = offset + element * (1 + sum((n - 1) * s for n, s in zip(shape, stride)))
        if offset < 0 or offset % element or extent > mapped.size or min(shape + stride, default=0) < 0:
            raise TransferError(f"layer {layer['name']} lies outside the producer's segment")
        flat = mapped.tensor(dtype)
        tensors[str(layer["name"])] = torch.as_strided(flat, shape, stride, offset // element)
    return KVLayout(tensors, int(require_field(description, "num_blocks", int)))


class ShmProducerChannel(DataChannel):
    """The producer's end: no bytes, only the SENDING header (the consumer copies), or nothing
    before the consumer's DONE in the one-round-trip exchange it offers."""

    kind = "mapped"
    one_round_trip = True

    def __init__(self, sock: socket.socket, timeout_s: float = 30.0, faults: FaultInjector | None = None):
        self._sock, self._timeout_s = sock, timeout_s
        self.faults = faults

    def send(self, header: bytes, ranges: Sequence) -> None:
        self.begin_transfer(self._sock)
        self._sock.sendall(header)

    def begin_transfer(self, sock: socket.socket) -> None:
        fault = self.faults.next_fault() if self.faults is not None else None
        if fault is not None:
            faulty.producer_answer(sock, b"", fault, self._timeout_s)

    def recv(self, ranges: Sequence, on_received=None) -> None:
        raise TransferError("a producer's shm channel receives nothing")


class ShmConsumerChannel(DataChannel):
    """The consumer's end: copies blocks from the producer's mapped cache into its own, taking the
    checksum of every block as it copies it (`kv_transfer.checksum`: one pass over the bytes)."""

    kind = "mapped"

    def __init__(self, mapped: MappedSegment, remote: KVLayout, local: KVLayout, faults: FaultInjector | None = None):
        self._mapped, self._remote, self._local = mapped, remote, local
        self.faults = faults
        self.checksums = True   # take each block's checksum as it is copied (the consumer verifies them)
        self.board = BoardReader.open(mapped.board_area())   # None: ask the producer after each copy
        # By address when both caches are CPU planes of adjacent blocks of the same sizes (the usual
        # case): a pull then makes no tensor, one memmove per plane and run.
        remote_planes, local_planes = remote.plane_addresses(), local.plane_addresses()
        same = (remote_planes is not None and local_planes is not None and len(remote_planes) == len(local_planes)
                and all(r[1] == l[1] for r, l in zip(remote_planes, local_planes)))
        self._planes = list(zip(local_planes, remote_planes)) if same else None
        self._arrays = (list(zip(local.plane_arrays(), remote.plane_arrays(), local.plane_block_bytes()))
                        if same else None)

    def send(self, header: bytes, ranges: Sequence) -> None:
        raise TransferError("a consumer's shm channel sends nothing")

    def recv(self, ranges: Sequence, on_received=None) -> None:
        raise TransferError("an shm channel copies by block ids: call copy()")

    def copy(self, local_block_ids: Sequence[int], remote_block_ids: Sequence[int]) -> list[int] | None:
        """Copies the producer's `remote_block_ids` into our `local_block_ids` (the same order), run
        by run, with the GIL released (numba or ctypes). Returns the checksum of each block as
        copied (`kv_transfer.checksum`), or None when `checksums` is off (a benchmark's baseline)."""
        fault = self.faults.next_fault() if self.faults is not None else None
        if fault is not None:
            return self._copy_with_fault(local_block_ids, remote_block_ids, fault)
        if not self.checksums:
            self._copy_bytes(local_block_ids, remote_block_ids)
            return None
        if self._arrays is None:
            self._copy_bytes(local_block_ids, remote_block_ids)
            return block_checksums(self._local, local_block_ids)
        targets, sources, sizes, firsts = self._pieces(local_block_ids, remote_block_ids)
        return copy_with_checksums(targets, sources, sizes, firsts, len(local_block_ids))

    def _pieces(self, local_block_ids: Sequence[int], remote_block_ids: Sequence[int]):
        """The (target, source) slices of every plane and run, plane by plane (the canonical order)."""
        self._remote.check_ids(remote_block_ids)
        self._local.check_ids(local_block_ids)
        runs, firsts, position = paired_runs(local_block_ids, remote_block_ids), [], 0
        for _, _, count in runs:
            firsts.append(position)
            position += count
        targets, sources, sizes, starts = [], [], [], []
        for local_plane, remote_plane, size in self._arrays:
            for (local_start, remote_start, count), first in zip(runs, firsts):
                targets.append(local_plane[local_start * size: (local_start + count) * size])
                sources.append(remote_plane[remote_start * size: (remote_start + count) * size])
                sizes.append(size)
                starts.append(first)
        return targets, sources, sizes, starts

    def _copy_with_fault(self, local_block_ids, remote_block_ids, fault) -> list[int]:
        """The consumer's side of an injected fault: a stall halfway through the copy, or a byte of
        the copy flipped before its checksum is taken. Always the slow path (tests only)."""
        if fault.kind == "stall_reader":
            half = max(1, int(len(local_block_ids) * fault.fraction))
            self._copy_bytes(local_block_ids[:half], remote_block_ids[:half])
            logger.warning("fault injected: the KV consumer stops copying for %.1f s", fault.stall_s)
            time.sleep(fault.stall_s)
            self._copy_bytes(local_block_ids[half:], remote_block_ids[half:])
        else:
            self._copy_bytes(local_block_ids, remote_block_ids)
            if fault.kind == "flip_bytes":
                faulty.flip(self._local.buffers(local_block_ids), fault.fraction)
        return block_checksums(self._local, local_block_ids)

    def _copy_bytes(self, local_block_ids: Sequence[int], remote_block_ids: Sequence[int]) -> int:
        """The copy alone (no checksum). Returns the bytes copied."""
        if not local_block_ids:
            return 0
        if self._planes is not None:
            self._remote.check_ids(remote_block_ids)
            self._local.check_ids(local_block_ids)
            moved, runs = 0, paired_runs(local_block_ids, remote_block_ids)
            for (local_base, size), (remote_base, _) in self._planes:
                for local_start, remote_start, count in runs:
                    ctypes.memmove(local_base + local_start * size, remote_base + remote_start * size, count * size)
                    moved += count * size
            return moved
        sources = self._remote.views(remote_block_ids, paired_with=local_block_ids)
        targets = self._local.views(local_block_ids, paired_with=remote_block_ids)
        if [t.numel() for t in targets] != [s.numel() for s in sources]:
            raise TransferError("the producer's and our block runs differ in size")
        for target, source in zip(targets, sources):
            ctypes.memmove(target.data_ptr(), source.data_ptr(), target.numel())
        return sum(t.numel() for t in targets)

    def stale(self) -> bool:
        """True once the producer's segment is unlinked (its engine stopped, or died and was swept):
        the map then only keeps dead memory alive, and the connection should be dropped."""
        return not os.path.exists(self._mapped.path)

    def close(self) -> None:
        self._planes = self._arrays = None  # addresses inside the map: never used after it is gone
        self.board = None
        self._remote = None  # the views over the map go first, then the map
        self._mapped.close()


@dataclass
class _ShmOffer:
    """The consumer's half of the handshake. `fallback_tcp`: `auto` (tcp when shm cannot be had)."""

    local: KVLayout | None
    timeout_s: float
    fallback_tcp: bool
    fields: dict
    faults: FaultInjector | None = None

    def connect(self, sock: socket.socket, welcome: dict) -> DataChannel:
        """Opens the channel WELCOME offers, or tcp under `auto`; CHANNEL says which (with the
        proof for shm) and the producer's CHANNEL_OK says which it accepted."""
        channel: ShmConsumerChannel | None = None
        if welcome.get("channel") == "shm":
            try:
                channel = self._map(welcome)
            except (SegmentError, TransferError, ValueError, KeyError, TypeError) as error:
                if not self.fallback_tcp:
                    send_message(sock, {"op": "CHANNEL", "kind": "none"})
                    raise TransferError(f"cannot read the producer's KV segment: {error}") from error
                logger.info("KV over tcp: the producer's segment cannot be read here (%s)", error)
        elif not self.fallback_tcp:
            raise TransferError("the producer offers no shared-memory channel")
        if channel is not None:
            send_message(sock, {"op": "CHANNEL", "kind": "shm", "proof": proof(channel._mapped.token)})
        else:
            send_message(sock, {"op": "CHANNEL", "kind": "tcp"})
        accepted = expect(recv_message(sock), "CHANNEL_OK").get("kind")
        if accepted == "shm" and channel is not None:
            channel.one_round_trip = welcome.get("one_round_trip") is True  # an older producer: two
            return channel
        if channel is not None:
            channel.close()
        if accepted == "tcp" and self.fallback_tcp:
            logger.info("KV over tcp: the producer did not accept our map of its segment")
            return TcpChannel(sock, self.timeout_s, self.faults)
        raise TransferError(f"the producer accepted no usable channel ({accepted!r})")

    def _map(self, welcome: dict) -> ShmConsumerChannel:
        if self.local is None:
            raise TransferError("no local KV layout to copy into")
        description = require_field(welcome, "segment", dict)
        mapped = map_segment(require_field(description, "path", str), require_field(description, "size", int))
        try:
            return ShmConsumerChannel(mapped, remote_layout(mapped, description), self.local, self.faults)
        except BaseException:
            mapped.close()
            raise


class ShmTransport(Transport):
    """`shm`, or with `fallback_tcp` `auto`. A producer passes its `SharedCache` (None: its cache is
    not in shared memory); a consumer passes its own `local` layout to copy into."""

    def __init__(self, timeout_s: float = 30.0, cache: SharedCache | None = None, local: KVLayout | None = None,
                 fallback_tcp: bool = False, faults: FaultInjector | None = None):
        super().__init__(timeout_s, faults)
        self.cache, self.local, self.fallback_tcp = cache, local, fallback_tcp
        self.name = "auto" if fallback_tcp else "shm"

    # ---- consumer ----
    def consumer_offer(self, sock: socket.socket, device: torch.device) -> ConsumerOffer:
        _require_cpu(device)
        return _ShmOffer(self.local, self.timeout_s, self.fallback_tcp, {"boot_id": boot_id()}, self.faults)

    # ---- producer ----
    def refusal(self, hello: dict) -> str:
        if self.fallback_tcp:
            return ""
        return self._why_not_shm(hello)

    def welcome_fields(self, hello: dict) -> dict:
        if self._why_not_shm(hello):  # only `auto` gets here then: tcp
            return {"channel": "tcp"}
        return {"channel": "shm", "segment": self.cache.describe(), "one_round_trip": True}

    def producer_channel(self, sock: socket.socket, hello: dict, device: torch.device,
                         welcome: dict | None = None) -> DataChannel:
        _require_cpu(device)
        reply = expect(recv_message(sock), "CHANNEL")
        kind = reply.get("kind")
        offered_shm = (welcome or {}).get("channel") == "shm"
        if kind == "shm" and offered_shm and reply.get("proof") == proof(self.cache.segment.token):
            send_message(sock, {"op": "CHANNEL_OK", "kind": "shm"})
            return ShmProducerChannel(sock, self.timeout_s, self.faults)
        if self.fallback_tcp and kind in ("shm", "tcp"):  # a wrong proof: it mapped something else
            send_message(sock, {"op": "CHANNEL_OK", "kind": "tcp"})
            return TcpChannel(sock, self.timeout_s, self.faults)
        send_message(sock, {"op": "CHANNEL_OK", "kind": "none"})
        raise TransferError(f"the consumer could not open a {self.name} channel ({kind}; "
                            f"{'proof mismatch' if kind == 'shm' else 'no segment'})")

    def _why_not_shm(self, hello: dict) -> str:
        """Why this consumer cannot get shm ("": it can); the same reason whether `auto` or `shm`."""
        choice = choose_channel("cpu", "shm", same_boot=same_boot(hello, boot_id()), peer_gpu_visible=False,
                                cache_shared=self.cache is not None and not self.cache.segment.closed)
        return choice.reason if choice.channel is None else ""


def _require_cpu(device: torch.device) -> None:
    if device.type != "cpu":
        raise ValueError("the shm transport moves CPU KV caches; for a CUDA cache get_transport picks "
                         "kv_transfer.transports.cuda_ipc (CUDA IPC within a node, NCCL otherwise)")
