"""Where a request's KV blocks live in a worker's paged cache, as byte ranges.

vLLM hands the connector one tensor per attention layer. Layouts seen so far:
- CPU attention: `[num_blocks, kv_heads, block_size, 2 * head_dim]` (one plane; a block is contiguous);
- CUDA flash-attention: `[2, num_blocks, block_size, kv_heads, head_dim]` (K and V planes).
A block is copied as opaque bytes (the CPU backend packs its contents), so both sides only need to
agree on the order of the byte ranges, which this module fixes:

    for layer in sorted layer names: for plane in planes: for block in the request's block ids

Consecutive block ids are coalesced into one range when the cache stores consecutive blocks next to
each other (`blocks_adjacent`; a range is then one contiguous piece of memory), so a freshly
allocated request usually moves as one range per layer and plane.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Sequence

import torch


CHECKSUM_ALGORITHM = "oddweight64"   # kv_transfer.checksum's; compared at handshake like the layout


class LayoutError(ValueError):
    """The KV cache tensors do not have a layout this connector knows how to move."""


@dataclass(frozen=True)
class LayerLayout:
    name: str
    block_dim: int          # 0: [num_blocks, ...]; 1: [planes, num_blocks, ...]
    num_planes: int
    bytes_per_block_plane: int
    blocks_adjacent: bool   # block b+1 starts where block b ends, in every plane


@dataclass(frozen=True)
class KVCompat:
    """What a producer and a consumer must share for a block's bytes to mean the same thing.

    Every field but `model_name` is compared at handshake. `model_fingerprint` identifies the
    checkpoint's contents (`kv_transfer.fingerprint`), so the same weights at two paths match and
    two checkpoints that share a directory name do not; `model_name` only makes messages readable.
    """

    model_fingerprint: str
    dtype: str
    block_size: int
    num_layers: int
    num_kv_heads: int              # 0: not known (tools that build caches by hand)
    head_dim: int                  # 0: not known
    layout: str                    # how a block sits in a layer tensor, e.g. "blocks-first/1-plane/adjacent"
    block_shape: tuple[int, ...]   # one block of one layer, all planes
    bytes_per_block: int           # all layers, all planes
    model_name: str = ""
    checksum: str = ""             # the per-block checksum both sides take (kv_transfer.checksum); "": none (CUDA)

    def mismatches(self, peer: "KVCompat | dict", here: str = "producer", there: str = "consumer") -> list[str]:
        """Human-readable differences with a peer (its `to_dict()` off the wire), empty when
        compatible. A field the peer did not send (an older pdserve) is a difference too."""
        peer = peer.to_dict() if isinstance(peer, KVCompat) else peer
        mine = self.to_dict()
        found = []
        for key in (f.name for f in fields(self) if f.name != "model_name"):
            theirs = peer.get(key, "<not sent>")
            if mine[key] != theirs:
                found.append(f"{key}: {mine[key]!r} at the {here} vs {theirs!r} at the {there}")
        if any(key.startswith("model_fingerprint") for key in found):
            found.append(f"(model {self.model_name!r} at the {here}, {peer.get('model_name', '')!r} at the {there}: "
                         "different checkpoints; both sides must serve the same weights)")
        return found

    def to_dict(self) -> dict:
        return {**self.__dict__, "block_shape": list(self.block_shape)}


class KVLayout:
    """Byte views of a set of blocks in the registered KV cache tensors."""

    def __init__(self, kv_caches: dict[str, torch.Tensor], num_blocks: int):
        if not kv_caches:
            raise LayoutError("no KV cache tensors were registered")
        self.num_blocks = num_blocks
        self._tensors = {name: kv_caches[name] for name in sorted(kv_caches)}
        self.layers = [self._describe(name, t) for name, t in self._tensors.items()]
        first = next(iter(self._tensors.values()))
        self.device = first.device
        self.dtype = first.dtype
        self.bytes_per_block = sum(l.num_planes * l.bytes_per_block_plane for l in self.layers)
        self.blocks_adjacent = all(l.blocks_adjacent for l in self.layers)
        planes = [(layer, plane) for layer in self.layers for plane in range(layer.num_planes)]
        self._planes = [self._plane_bytes(layer, plane) for layer, plane in planes]
        self._plane_block_bytes = [layer.bytes_per_block_plane for layer, _ in planes]
        self._plane_buffers = ([memoryview(p.numpy()).cast("B") for p in self._planes]
                               if self.device.type == "cpu" and self.blocks_adjacent else None)

    def _describe(self, name: str, tensor: torch.Tensor) -> LayerLayout:
        if tensor.dim() >= 2 and tensor.shape[0] == self.num_blocks:
            block_dim, planes = 0, 1
        elif tensor.dim() >= 3 and tensor.shape[0] == 2 and tensor.shape[1] == self.num_blocks:
            block_dim, planes = 1, 2
        else:
            raise LayoutError(
                f"layer {name}: KV cache shape {tuple(tensor.shape)} has no block dimension of size "
                f"{self.num_blocks} at position 0 or 1"
            )
        one_block = tensor[0] if block_dim == 0 else tensor[0, 0]
        if not one_block.is_contiguous():
            raise LayoutError(f"layer {name}: one block is not contiguous (shape {tuple(tensor.shape)})")
        block_bytes = one_block.numel() * one_block.element_size()
        adjacent = tensor.stride(block_dim) * tensor.element_size() == block_bytes
        return LayerLayout(name, block_dim, planes, block_bytes, adjacent)

    def _plane_bytes(self, layer: LayerLayout, plane: int) -> torch.Tensor:
        """One plane of a layer, aliasing the cache: a flat uint8 tensor when the whole plane is one
        piece of memory, else the `[num_blocks, ...]` tensor (see `_strided_block`). Never a copy."""
        tensor = self._tensors[layer.name]
        base = tensor if layer.block_dim == 0 else tensor[plane]
        if not self.blocks_adjacent:
            return base
        return base.view(self.num_blocks, -1).view(torch.uint8).view(-1)

    def compat(self, model: str, block_size: int, *, fingerprint: str = "", num_kv_heads: int = 0,
               head_dim: int = 0) -> KVCompat:
        layer = self.layers[0]
        tensor = self._tensors[layer.name]
        block_shape = tuple(tensor.shape[1:]) if layer.block_dim == 0 else (2, *tensor.shape[2:])
        arrangement = "blocks-first" if layer.block_dim == 0 else "planes-first"
        return KVCompat(
            model_fingerprint=fingerprint,
            dtype=str(self.dtype).removeprefix("torch."),
            block_size=block_size,
            num_layers=len(self.layers),
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            layout=f"{arrangement}/{layer.num_planes}-plane/{'adjacent' if self.blocks_adjacent else 'strided'}",
            block_shape=block_shape,
            bytes_per_block=self.bytes_per_block,
            model_name=model,
            checksum=CHECKSUM_ALGORITHM if self.device.type == "cpu" else "",
        )

    def runs(self, block_ids: Sequence[int], paired_with: Sequence[int] | None = None) -> list[tuple[int, int]]:
        """Half-open runs of `block_ids` that are one piece of memory here, in order.

        With `paired_with` (the peer's ids for the same blocks, in the same order), a run is also cut
        where the peer's ids stop being consecutive, so both sides cut the bytes at the same places
        and a transport may move run i to run i without staging."""
        self._check_ids(block_ids)
        if not self.blocks_adjacent:
            return [(b, b + 1) for b in block_ids]
        return coalesce(block_ids) if paired_with is None else coalesce_paired(block_ids, paired_with)

    def views(self, block_ids: Sequence[int], paired_with: Sequence[int] | None = None) -> list[torch.Tensor]:
        """Flat uint8 tensors of `block_ids` in the canonical order (see `runs`). They alias the
        cache: writing into them writes the cache."""
        return self.views_of(self.runs(block_ids, paired_with))

    def buffers(self, block_ids: Sequence[int], paired_with: Sequence[int] | None = None) -> list[memoryview]:
        """The same byte ranges as `views`, as memoryviews (CPU caches): for socket I/O, no tensor ops."""
        return self.buffers_of(self.runs(block_ids, paired_with))

    def views_of(self, runs: list[tuple[int, int]]) -> list[torch.Tensor]:
        """`views` for runs already cut by `runs()`."""
        if not self.blocks_adjacent:
            return [self._strided_block(index, b) for index in range(len(self._planes)) for b, _ in runs]
        return [plane[start * size: stop * size]
                for plane, size in zip(self._planes, self._plane_block_bytes) for start, stop in runs]

    def buffers_of(self, runs: list[tuple[int, int]]) -> list[memoryview]:
        """`buffers` for runs already cut by `runs()`."""
        if self._plane_buffers is None:
            return [memoryview(view.numpy()).cast("B") for view in self.views_of(runs)]
        return [plane[start * size: stop * size]
                for plane, size in zip(self._plane_buffers, self._plane_block_bytes) for start, stop in runs]

    def plane_addresses(self) -> list[tuple[int, int]] | None:
        """(address of block 0, bytes per block) of every plane, in the canonical order, for code
        that moves runs by address (a one-sided copy); None unless the cache is on the CPU and its
        blocks are adjacent (a run is then one piece of memory per plane)."""
        if self.device.type != "cpu" or not self.blocks_adjacent:
            return None
        return [(plane.data_ptr(), size) for plane, size in zip(self._planes, self._plane_block_bytes)]

    def plane_block_bytes(self) -> list[int]:
        """Bytes of one block in each plane, in the canonical order."""
        return list(self._plane_block_bytes)

    def plane_arrays(self) -> list | None:
        """Each plane as a flat uint8 numpy array over the cache (no copy), in the canonical order,
        for code that moves runs by slicing (`kv_transfer.checksum`); None unless the cache is on
        the CPU and its blocks are adjacent."""
        if self.device.type != "cpu" or not self.blocks_adjacent:
            return None
        return [plane.numpy() for plane in self._planes]

    def check_ids(self, block_ids: Sequence[int]) -> None:
        """Raises LayoutError for an id outside the cache."""
        self._check_ids(block_ids)

    def num_bytes(self, num_block_ids: int) -> int:
        return num_block_ids * self.bytes_per_block

    def _strided_block(self, plane_index: int, block_id: int) -> torch.Tensor:
        return self._planes[plane_index][block_id].reshape(-1).view(torch.uint8)

    def _check_ids(self, block_ids: Sequence[int]) -> None:
        for block_id in block_ids:
            if not 0 <= block_id < self.num_blocks:
                raise LayoutError(f"block id {block_id} outside the cache's {self.num_blocks} blocks")


def coalesce(block_ids: Sequence[int]) -> list[tuple[int, int]]:
    """[3, 4, 5, 9, 10, 2] -> [(3, 6), (9, 11), (2, 3)]: half-open runs of consecutive ids, in order."""
    runs: list[tuple[int, int]] = []
    for block_id in block_ids:
        if runs and runs[-1][1] == block_id:
            runs[-1] = (runs[-1][0], block_id + 1)
        else:
            runs.append((block_id, block_id + 1))
    return runs


def paired_runs(block_ids: Sequence[int], other_ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """(start here, start there, blocks) of the runs consecutive on both sides, in order:
    ([1, 2, 3], [7, 8, 20]) -> [(1, 7, 2), (3, 20, 1)]."""
    if len(block_ids) != len(other_ids):
        raise LayoutError(f"{len(block_ids)} block ids paired with {len(other_ids)}")
    runs: list[tuple[int, int, int]] = []
    for index, block_id in enumerate(block_ids):
        if index and block_ids[index - 1] + 1 == block_id and other_ids[index - 1] + 1 == other_ids[index]:
            start, other_start, count = runs[-1]
            runs[-1] = (start, other_start, count + 1)
        else:
            runs.append((block_id, other_ids[index], 1))
    return runs


def coalesce_paired(block_ids: Sequence[int], other_ids: Sequence[int]) -> list[tuple[int, int]]:
    """Runs of `block_ids` that are consecutive on both sides: ([1, 2, 3], [7, 8, 20]) -> [(1, 3), (3, 4)].

    Symmetric in the sense that matters: the run lengths are the same when the sides swap."""
    if len(block_ids) != len(other_ids):
        raise LayoutError(f"{len(block_ids)} block ids paired with {len(other_ids)}")
    runs: list[tuple[int, int]] = []
    for index, block_id in enumerate(block_ids):
        if runs and runs[-1][1] == block_id and other_ids[index - 1] + 1 == other_ids[index]:
            runs[-1] = (runs[-1][0], block_id + 1)
        else:
            runs.append((block_id, block_id + 1))
    return runs
