"""The shape of a model's paged KV cache, and caches of that shape for tools that move blocks
without an engine (the planner's transfer probe, the throughput benchmark).

The caches use vLLM-CPU's layout: one tensor per attention layer of
`[num_blocks, num_kv_heads, block_size, 2 * head_dim]` (K and V side by side, one plane), so a
block of a layer is one contiguous piece of memory and `KVLayout` moves a run of blocks as one
range per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class BlockGeometry:
    """One KV block: its shape in every layer, and so the bytes a transfer moves per block."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: str

    def __post_init__(self) -> None:
        if self.dtype not in TORCH_DTYPES:
            raise ValueError(f"KV dtype {self.dtype!r} cannot be profiled; use one of {sorted(TORCH_DTYPES)}")
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} is {getattr(self, name)}; a KV block needs at least 1")

    @property
    def torch_dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.dtype]

    @property
    def block_shape(self) -> tuple[int, int, int]:
        """One block of one layer: `[num_kv_heads, block_size, 2 * head_dim]`."""
        return self.num_kv_heads, self.block_size, 2 * self.head_dim

    @property
    def bytes_per_block_layer(self) -> int:
        heads, tokens, width = self.block_shape
        return heads * tokens * width * self.torch_dtype.itemsize

    @property
    def bytes_per_block(self) -> int:
        """All layers, K and V: what a transfer moves per block (`KVLayout.bytes_per_block`)."""
        return self.num_layers * self.bytes_per_block_layer

    def cache_bytes(self, num_blocks: int) -> int:
        return num_blocks * self.bytes_per_block

    def caches(self, num_blocks: int, seed: int | None = None, memory: torch.Tensor | None = None
               ) -> dict[str, torch.Tensor]:
        """Per-layer views, named as vLLM names its attention layers, of one buffer: zeros, or
        random bytes drawn from `seed` (the same seed gives the same bytes in any process).
        `memory` (flat, `cache_bytes(num_blocks)` bytes, e.g. a shared-memory segment's) is used
        as the buffer instead of a fresh one."""
        shape = (num_blocks, *self.block_shape)
        per_layer = torch.Size(shape).numel()
        if memory is None:
            buffer = torch.zeros(self.num_layers * per_layer, dtype=self.torch_dtype)
        elif memory.numel() * memory.element_size() != self.cache_bytes(num_blocks):
            raise ValueError(f"{memory.numel() * memory.element_size()} bytes of memory for a cache of "
                             f"{self.cache_bytes(num_blocks)}")
        else:
            buffer = memory.view(self.torch_dtype)
        if seed is not None:
            buffer.view(torch.uint8).random_(0, 256, generator=torch.Generator().manual_seed(seed))
        return {f"model.layers.{i}.self_attn.attn": buffer[i * per_layer:(i + 1) * per_layer].view(shape)
                for i in range(self.num_layers)}
