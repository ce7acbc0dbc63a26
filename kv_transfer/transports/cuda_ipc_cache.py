"""A producer's CUDA KV cache described as IPC handles, and a consumer's checked view of it.

The producer exports its cache once (`CudaCache.of`, when vLLM registers the cache, before any
consumer connects): one `IpcHandle` per distinct storage under the layer tensors (vLLM views many
layers into one allocation, so usually one), each layer's place in its storage (byte offset, shape,
stride, dtype), its GPU's UUID, its kernel boot id, and a token: a small tensor of random bytes
allocated for this, exported like the cache. `describe()` is the WELCOME's `cuda_ipc` field.

The consumer opens the handles (`open_cache`), checks every layer lies inside its storage as
`kv_transfer.transports.shm.remote_layout` does for a segment, and reads the token through its own
mapping: its hash (`proof`) is how the producer learns the consumer mapped the same memory.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from dataclasses import dataclass, field
from typing import Sequence

import torch

from kv_transfer.layout import KVLayout, LayoutError
from kv_transfer.shm_segment import boot_id
from kv_transfer.transports.cuda_ipc_backend import IpcBackend, IpcHandle, TorchCudaIpcBackend
from kv_transfer.wire import TransferError, require_field

logger = logging.getLogger(__name__)

TOKEN_BYTES = 32
MAX_STORAGES = 4096
MAX_DIMS = 8


def proof(token: bytes) -> str:
    """What a consumer sends back to show it read `token` through its IPC mapping."""
    return hashlib.sha256(b"pdserve-kv-cuda-ipc:" + token).hexdigest()


@dataclass(frozen=True)
class CudaCache:
    """A producer's KV cache on a GPU as vLLM allocated it: any `cudaMalloc`'d memory exports, so
    no special allocation is needed. `description` is None when the export failed (`export_error`
    says why; consumers then get NCCL under `auto`, a refusal under `shm`). The export lives as long
    as this object: the producer keeps it for the engine's life."""

    device: torch.device
    num_blocks: int
    description: dict | None
    token: bytes = b""
    device_uuid: str = ""
    export_error: str = ""
    _token_tensor: torch.Tensor | None = field(default=None, repr=False)

    @classmethod
    def of(cls, kv_caches: dict[str, torch.Tensor], num_blocks: int, backend: IpcBackend | None = None) -> "CudaCache":
        """Exports `kv_caches` now, in the calling (model-runner) thread; never raises for a cache
        the backend cannot export (a memory pool of another allocator, an old driver)."""
        backend = backend if backend is not None else TorchCudaIpcBackend()
        device = next(iter(kv_caches.values())).device
        token = secrets.token_bytes(TOKEN_BYTES)
        try:
            token_tensor = backend.new_token(device, token)
            uuid = backend.device_uuids()[device.index or 0]
            description = {"device_uuid": uuid, "boot_id": boot_id(), "num_blocks": num_blocks,
                           **_storages_and_layers(kv_caches, backend),
                           "token": backend.export(token_tensor).to_wire()}
        except (RuntimeError, ValueError, TypeError, AttributeError, IndexError) as error:
            logger.warning("the KV cache cannot be exported as CUDA IPC handles, consumers get NCCL: %s", error)
            return cls(device, num_blocks, None, export_error=f"{type(error).__name__}: {error}")
        return cls(device, num_blocks, description, token, uuid, _token_tensor=token_tensor)


def _storages_and_layers(kv_caches: dict[str, torch.Tensor], backend: IpcBackend) -> dict:
    """One exported handle per distinct storage, and each layer as (storage index, byte offset in it)."""
    index_of: dict[int, int] = {}
    storages, layers = [], []
    for name in sorted(kv_caches):
        tensor = kv_caches[name]
        base = tensor.untyped_storage().data_ptr()
        if base not in index_of:
            index_of[base] = len(storages)
            storages.append(backend.export(tensor).to_wire())
        layers.append({"name": name, "storage": index_of[base], "offset": tensor.data_ptr() - base,
                       "shape": list(tensor.shape), "stride": list(tensor.stride()),
                       "dtype": str(tensor.dtype).removeprefix("torch.")})
    return {"storages": storages, "layers": layers}


@dataclass
class OpenedCache:
    """A consumer's view of a producer's cache: `remote` aliases `storages`, which keep the IPC
    mappings open; dropping both closes them. `token` is what was read through the mapping."""

    remote: KVLayout
    storages: list[torch.Tensor]
    token: bytes


def open_cache(backend: IpcBackend, description: dict, local: KVLayout) -> OpenedCache:
    """Opens every handle of a producer's `description` on our index of its GPU, and checks it all
    before use. Raises TransferError (or the backend's RuntimeError) when something does not fit."""
    uuid = require_field(description, "device_uuid", str)
    visible = list(backend.device_uuids())
    if uuid not in visible:
        raise TransferError(f"the producer's GPU {uuid} is not visible here")
    handles = [IpcHandle.from_wire(fields) for fields in require_field(description, "storages", list)]
    if not 0 < len(handles) <= MAX_STORAGES:
        raise TransferError(f"the producer describes {len(handles)} storages")
    token_handle = IpcHandle.from_wire(require_field(description, "token", dict))
    index = visible.index(uuid)
    storages = [_open(backend, handle, index) for handle in handles]
    token = backend.read(_open(backend, token_handle, index))
    remote = remote_layout(storages, description)
    if remote.bytes_per_block != local.bytes_per_block or len(remote.layers) != len(local.layers):
        raise TransferError(f"the producer's cache has {len(remote.layers)} layers of {remote.bytes_per_block} "
                            f"bytes per block, ours {len(local.layers)} of {local.bytes_per_block}")
    return OpenedCache(remote, storages, token)


def _open(backend: IpcBackend, handle: IpcHandle, device_index: int) -> torch.Tensor:
    flat = backend.open(handle, device_index)
    if flat.dtype != torch.uint8 or flat.dim() != 1 or flat.numel() != handle.size_bytes:
        raise TransferError(f"an opened IPC handle spans {flat.numel()} bytes, not {handle.size_bytes}")
    return flat


def remote_layout(storages: Sequence[torch.Tensor], description: dict) -> KVLayout:
    """The producer's cache as a `KVLayout` over the opened storages (flat uint8), every layer
    checked to lie inside its storage."""
    tensors = {}
    for layer in require_field(description, "layers", list):
        if not isinstance(layer, dict):
            raise TransferError("a layer of the producer's description is not an object")
        name = require_field(layer, "name", str)
        tensors[name] = _layer_view(storages, layer, name)
    try:
        return KVLayout(tensors, require_field(description, "num_blocks", int))
    except LayoutError as error:
        raise TransferError(f"the producer's cache description is not a KV layout: {error}") from error


def _layer_view(storages: Sequence[torch.Tensor], layer: dict, name: str) -> torch.Tensor:
    dtype = getattr(torch, str(layer.get("dtype")), None)
    if not isinstance(dtype, torch.dtype):
        raise TransferError(f"unknown KV dtype {layer.get('dtype')!r} in the producer's description")
    index, offset = require_field(layer, "storage", int), require_field(layer, "offset", int)
    shape, stride = require_field(layer, "shape", list), require_field(layer, "stride", list)
    dims = shape + stride
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in dims) or len(shape) != len(stride):
        raise TransferError(f"layer {name}: shape and stride must be lists of integers of one length")
    element = torch.empty((), dtype=dtype).element_size()
    if not 0 <= index < len(storages) or not 0 < len(shape) <= MAX_DIMS or min(dims) < 0 or min(shape) == 0:
        raise TransferError(f"layer {name} names no valid storage, or has a degenerate shape")
    flat = storages[index]
    extent = offset + element * (1 + sum((n - 1) * s for n, s in zip(shape, stride)))
    if offset < 0 or offset % element or extent > flat.numel():
        raise TransferError(f"layer {name} lies outside the producer's storage {index}")
    typed = flat[: flat.numel() - flat.numel() % element].view(dtype)
    return torch.as_strided(typed, shape, stride, offset // element)


def plan_copies(local: KVLayout, remote: KVLayout, local_block_ids: Sequence[int],
                remote_block_ids: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(target, source) pairs that copy the producer's `remote_block_ids` into our `local_block_ids`
    (the same order): one pair per run of blocks consecutive on both sides, per layer and plane."""
    sources = remote.views(remote_block_ids, paired_with=local_block_ids)
    targets = local.views(local_block_ids, paired_with=remote_block_ids)
    if [t.numel() for t in targets] != [s.numel() for s in sources]:
        raise TransferError("the producer's and our block runs differ in size")
    return list(zip(targets, sources))
