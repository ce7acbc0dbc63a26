"""Every CUDA call of the `cuda_ipc` channel, behind one small interface (`IpcBackend`).

`TorchCudaIpcBackend` is the real one: it exports a storage the way `torch.multiprocessing` does
(`UntypedStorage._share_cuda_()`, see `torch.multiprocessing.reductions.reduce_tensor`) and opens
it the way `rebuild_cuda_tensor` does (`UntypedStorage._new_shared_cuda(...)`). PyTorch's caching
allocator hands out pieces of larger `cudaMalloc` blocks, and an IPC handle names a whole block: the
export is the block's handle plus the storage's offset in it, and the open maps the block and starts
the storage at that offset. A storage's handle fields travel as `IpcHandle.to_wire()` (base64 in
JSON, never pickle) and are checked by `IpcHandle.from_wire` before any of them reaches the driver.

Everything above this interface (the handshake, the description of the cache, its bounds checks,
the copy planning) is device-agnostic and tested on CPU with a stand-in backend.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import re
from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from kv_transfer.wire import TransferError

MAX_HANDLE_BYTES = 64 << 10           # a cudaMalloc handle is 64 bytes; expandable segments' are longer
EVENT_HANDLE_BYTES = 64               # CUDA_IPC_HANDLE_SIZE: cudaIpcEventHandle_t
REF_COUNTER_SLOTS = 10000             # torch's CUDA_IPC_REF_COUNTER_FILE_SIZE: int64 slots per file
_REF_COUNTER_NAME = re.compile(rb"/torch_\d+_\d+_\d+")  # at::NewProcessWideShmHandle()


@dataclass(frozen=True)
class IpcHandle:
    """One exported storage, as `_share_cuda_()` returns it (minus the producer's device index: the
    consumer finds the GPU by UUID). `handle`, `ref_counter` and `event` are opaque to pdserve."""

    handle: bytes            # the allocator's shareable handle of the block holding the storage
    size_bytes: int          # the storage's size
    offset_bytes: int        # where the storage starts in that block
    ref_counter: bytes       # torch's shared ref-counter file; the consumer decrements it on close
    ref_counter_offset: int
    event: bytes             # an IPC event to wait for before reading (when `event_sync`)
    event_sync: bool

    def to_wire(self) -> dict:
        text = {name: base64.b64encode(getattr(self, name)).decode("ascii")
                for name in ("handle", "ref_counter", "event")}
        return {**text, "size_bytes": self.size_bytes, "offset_bytes": self.offset_bytes,
                "ref_counter_offset": self.ref_counter_offset, "event_sync": self.event_sync}

    @classmethod
    def from_wire(cls, fields: object) -> "IpcHandle":
        """Raises TransferError for anything `_new_shared_cuda` should not be handed: bad base64,
        sizes out of range, a ref counter that is not torch's file name or slot."""
        if not isinstance(fields, dict):
            raise TransferError(f"an IPC handle must be an object, not {type(fields).__name__}")
        handle, ref_counter, event = (_bytes_field(fields, name) for name in ("handle", "ref_counter", "event"))
        size, offset = _int_field(fields, "size_bytes"), _int_field(fields, "offset_bytes")
        slot, sync = _int_field(fields, "ref_counter_offset"), fields.get("event_sync")
        if not 0 < len(handle) <= MAX_HANDLE_BYTES or size <= 0 or offset < 0:
            raise TransferError(f"IPC handle of {len(handle)} bytes for {size} bytes at {offset}: out of range")
        if not _REF_COUNTER_NAME.fullmatch(ref_counter) or not 0 <= slot < REF_COUNTER_SLOTS:
            raise TransferError(f"IPC ref counter {ref_counter[:64]!r}[{slot}] is not one of torch's")
        if not isinstance(sync, bool) or (sync and len(event) != EVENT_HANDLE_BYTES):
            raise TransferError("IPC event fields are malformed")
        return cls(handle, size, offset, ref_counter, slot, event, sync)


def _bytes_field(fields: dict, name: str) -> bytes:
    value = fields.get(name)
    if not isinstance(value, str) or len(value) > 2 * MAX_HANDLE_BYTES:
        raise TransferError(f"IPC handle field {name!r} is missing or too long")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as error:
        raise TransferError(f"IPC handle field {name!r} is not base64: {error}") from error


def _int_field(fields: dict, name: str) -> int:
    value = fields.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise TransferError(f"IPC handle field {name!r} must be an integer, not {value!r:.40}")
    return value


class IpcBackend(Protocol):
    """What the `cuda_ipc` channel needs from a GPU runtime. Streams are opaque to callers."""

    def device_uuids(self) -> tuple[str, ...]:
        """The UUIDs of the GPUs this process sees, by device index."""

    def export(self, tensor: torch.Tensor) -> IpcHandle:
        """A handle to the whole storage under `tensor` (not just the tensor's view of it)."""

    def new_token(self, device: torch.device, token: bytes) -> torch.Tensor:
        """A fresh uint8 tensor on `device` holding `token`, written before this returns."""

    def open(self, handle: IpcHandle, device_index: int) -> torch.Tensor:
        """The storage `handle` names, as a flat uint8 tensor of `handle.size_bytes`, mapped on our
        device `device_index`. It stays mapped while the tensor (or a view of it) lives."""

    def read(self, tensor: torch.Tensor) -> bytes:
        """The bytes of a small flat uint8 tensor, on the host."""

    def new_stream(self, source: torch.device, target: torch.device) -> object:
        """What `copy` and `synchronize` run on for copies from `source` into `target`."""

    def copy(self, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], stream: object) -> None:
        """Enqueues `target.copy_(source)` for every (target, source) pair, in order, on `stream`."""

    def synchronize(self, stream: object) -> None:
        """Returns once everything enqueued on `stream` is done."""


class TorchCudaIpcBackend:
    """The real backend (PyTorch on CUDA). Touches CUDA only when called, never when built."""

    def device_uuids(self) -> tuple[str, ...]:
        return tuple(str(torch.cuda.get_device_properties(index).uuid) for index in range(torch.cuda.device_count()))

    def export(self, tensor: torch.Tensor) -> IpcHandle:
        (_device, handle, size_bytes, offset_bytes, ref_counter, ref_counter_offset, event,
         event_sync) = tensor.untyped_storage()._share_cuda_()
        return IpcHandle(bytes(handle), int(size_bytes), int(offset_bytes), bytes(ref_counter),
                         int(ref_counter_offset), bytes(event or b""), bool(event_sync))

    def new_token(self, device: torch.device, token: bytes) -> torch.Tensor:
        tensor = torch.empty(len(token), dtype=torch.uint8, device=device)
        tensor.copy_(torch.frombuffer(bytearray(token), dtype=torch.uint8))
        torch.cuda.synchronize(device)
        return tensor

    def open(self, handle: IpcHandle, device_index: int) -> torch.Tensor:
        torch.cuda._lazy_init()
        storage = torch.UntypedStorage._new_shared_cuda(
            device_index, handle.handle, handle.size_bytes, handle.offset_bytes, handle.ref_counter,
            handle.ref_counter_offset, handle.event, handle.event_sync)
        return torch.empty(0, dtype=torch.uint8, device=torch.device("cuda", device_index)).set_(storage)

    def read(self, tensor: torch.Tensor) -> bytes:
        return tensor.cpu().numpy().tobytes()

    def new_stream(self, source: torch.device, target: torch.device) -> tuple:
        """One stream per device involved: a copy between two GPUs runs on the source's stream and
        fences with the target's current stream, so both are ours (not the engine's)."""
        return tuple(torch.cuda.Stream(device=device) for device in dict.fromkeys((source, target)))

    def copy(self, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], stream: object) -> None:
        with contextlib.ExitStack() as current:
            for each in stream:
                current.enter_context(torch.cuda.stream(each))
            for target, source in pairs:
                target.copy_(source, non_blocking=True)

    def synchronize(self, stream: object) -> None:
        for each in stream:
            each.synchronize()
