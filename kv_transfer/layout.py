"""Where a request's KV blocks live in a worker's paged cache, as byte ranges.

vLLM hands the connector one tensor per attention layer. Layouts seen so far:
- CPU attention: `[num_blocks, kv_heads, block_size, 2 * head_dim]` (one plane; a block is contiguous);
- CUDA flash-attention: `[2, num_blocks, block_size, kv_heads, head_dim]` (K and V planes).
A block is copied as opaque bytes (the CPU backend packs its contents), so both sides only need to
agree on the order of the byte ranges, which this module fixes:

    for layer in sorted layer names: for plane in planes: for block in the request's block ids

Consecutive block ids are coalesced into one range, so a freshly allocated request usually moves
as one range per layer and plane. Producer and consumer may coalesce differently: the byte stream
is the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


class LayoutError(ValueError):
    """The KV cache tensors do not have a layout this connector knows how to move."""


@dataclass(frozen=True)
class LayerLayout:
    name: str
    block_dim: int          # 0: [num_blocks, ...]; 1: [planes, num_blocks, ...]
    num_planes: int
    bytes_per_block_plane: int


@dataclass(frozen=True)
class KVCompat:
    """What a producer and a consumer must share for a block's bytes to mean the same thing."""

    model: str
    dtype: str
    block_size: int
    num_layers: int
    block_shape: tuple[int, ...]   # one block of one layer, all planes
    bytes_per_block: int           # all layers, all planes

    def mismatches(self, other: "KVCompat") -> list[str]:
        """Human-readable differences, empty when compatible."""
        mine, theirs = self.to_dict(), other.to_dict()
        return [f"{key}: {mine[key]!r} here vs {theirs[key]!r} at the peer" for key in mine if mine[key] != theirs[key]]

    def to_dict(self) -> dict:
        return {**self.__dict__, "block_shape": list(self.block_shape)}

    @classmethod
    def from_dict(cls, data: dict) -> "KVCompat":
        return cls(**{**data, "block_shape": tuple(data["block_shape"])})


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
        return LayerLayout(name, block_dim, planes, one_block.numel() * one_block.element_size())

    def compat(self, model: str, block_size: int) -> KVCompat:
        layer = self.layers[0]
        tensor = self._tensors[layer.name]
        block_shape = tuple(tensor.shape[1:]) if layer.block_dim == 0 else (2, *tensor.shape[2:])
        return KVCompat(
            model=model,
            dtype=str(self.dtype).removeprefix("torch."),
            block_size=block_size,
            num_layers=len(self.layers),
            block_shape=block_shape,
            bytes_per_block=self.bytes_per_block,
        )

    def views(self, block_ids: Sequence[int], paired_with: Sequence[int] | None = None) -> list[torch.Tensor]:
        """Flat uint8 views of `block_ids` in the canonical order, consecutive ids coalesced.

        With `paired_with` (the peer's ids for the same blocks, in the same order), a run is also cut
        where the peer's ids stop being consecutive, so both sides cut the bytes at the same places
        and a transport may move view i to view i without staging. The views alias the cache:
        writing into them writes the cache.
        """
        self._check_ids(block_ids)
        runs = coalesce(block_ids) if paired_with is None else coalesce_paired(block_ids, paired_with)
        views = []
        for layer in self.layers:
            tensor = self._tensors[layer.name]
            for plane in range(layer.num_planes):
                base = tensor if layer.block_dim == 0 else tensor[plane]
                for start, stop in runs:
                    views.append(base[start:stop].reshape(-1).view(torch.uint8))
        return views

    def num_bytes(self, num_block_ids: int) -> int:
        return num_block_ids * self.bytes_per_block

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
