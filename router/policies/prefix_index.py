"""Which worker holds which prompt prefix: the router's block-hash prefix index. Pure, in memory.

A prompt is cut into full blocks of `block_size` tokens; block i's hash chains its parent's, as in
vLLM and nano-vllm (`hash_block(parent_hash, tokens)`), so a hash names the whole prefix up to and
including its block, and a partial last block is never indexed. `record` says a worker computed
(and so caches) a prompt; `longest_prefix_tokens` walks the chain and stops at the first block the
worker lacks, so evicting a block makes every descendant unmatchable.

Each worker's blocks are an LRU of its capacity: `capacity_blocks_per_worker`, or what
`set_capacity` gave that worker (its engine's KV blocks: the index then forgets about when the
engine would). Touching a chain touches its blocks last to
first, so the root is the most recent and a chain is evicted from its tail, as vLLM frees blocks.
This is a hint: a wrong entry costs a worse placement, never a wrong answer. The default hash is
Python's (process-local, 64-bit); pass `hash_block` to match the engine's KV event hashes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence

HashBlock = Callable[[Hashable, tuple[int, ...]], Hashable]


def python_hash_block(parent: Hashable, tokens: tuple[int, ...]) -> Hashable:
    """The default: Python's tuple hash (the first block's parent is None, hashed as 0 so the
    value does not depend on where None lives in memory)."""
    return hash((0 if parent is None else parent, tokens))


def block_hashes(token_ids: Sequence[int], block_size: int, hash_block: HashBlock = python_hash_block,
                 salt: str = "") -> list:
    """The chained hashes of every full block of `token_ids`, first block first. The first
    block's parent is the prompt's cache salt, or None without one: as in vLLM, which folds the
    salt into the first block's hash, a salted prompt shares no block with another salt's."""
    hashes: list = []
    parent: Hashable = salt or None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, tuple(token_ids[start:start + block_size]))
        hashes.append(parent)
    return hashes


class PrefixIndex:
    def __init__(self, block_size: int, capacity_blocks_per_worker: int, hash_block: HashBlock = python_hash_block):
        if block_size < 1 or capacity_blocks_per_worker < 1:
            raise ValueError(f"need block_size >= 1 and capacity_blocks_per_worker >= 1, got {block_size} and "
                             f"{capacity_blocks_per_worker}")
        self.block_size = block_size
        self.capacity_blocks_per_worker = capacity_blocks_per_worker
        self.hash_block = hash_block
        self._blocks: dict[str, OrderedDict[Hashable, None]] = {}   # worker -> LRU, oldest first
        self._capacity: dict[str, int] = {}   # worker -> its own capacity, when known

    def blocks_of(self, worker_id: str) -> int:
        return len(self._blocks.get(worker_id, ()))

    def workers(self) -> list[str]:
        """The workers the index holds blocks for."""
        return list(self._blocks)

    def capacity_of(self, worker_id: str) -> int:
        return self._capacity.get(worker_id, self.capacity_blocks_per_worker)

    def set_capacity(self, worker_id: str, blocks: int) -> None:
        """`worker_id` caches at most `blocks` blocks (its engine's KV cache); its least recently
        used blocks beyond that go now."""
        if blocks < 1:
            raise ValueError(f"a worker's capacity is >= 1 block, got {blocks}")
        self._capacity[worker_id] = blocks
        self._trim(worker_id)

    def record(self, worker_id: str, token_ids: Sequence[int], salt: str = "") -> None:
        """`worker_id` now caches every full block of `token_ids` (under the prompt's cache `salt`);
        over capacity, its least recently used blocks go (possibly some of this prompt's own tail
        when it alone exceeds capacity)."""
        lru = self._blocks.setdefault(worker_id, OrderedDict())
        for block in reversed(block_hashes(token_ids, self.block_size, self.hash_block, salt)):
            lru[block] = None
            lru.move_to_end(block)
        self._trim(worker_id)

    def _trim(self, worker_id: str) -> None:
        lru, capacity = self._blocks.get(worker_id), self.capacity_of(worker_id)
        while lru is not None and len(lru) > capacity:
            lru.popitem(last=False)

    def longest_prefix_tokens(self, worker_id: str, token_ids: Sequence[int], salt: str = "") -> int:
        """Tokens (a multiple of block_size) of the longest prefix of `token_ids` whose blocks the
        worker holds, in chain order. Touches the matched blocks (a match is a use)."""
        lru = self._blocks.get(worker_id)
        if not lru:
            return 0
        matched = self._match(lru, block_hashes(token_ids, self.block_size, self.hash_block, salt))
        for block in reversed(matched):
            lru.move_to_end(block)
        return len(matched) * self.block_size

    def match_all(self, token_ids: Sequence[int], salt: str = "") -> dict[str, int]:
        """Matched tokens per worker, for the workers with a match (> 0). Hashes once; touches
        nothing (a placement query; `record` touches the worker the request goes to)."""
        hashes = block_hashes(token_ids, self.block_size, self.hash_block, salt)
        matches = {worker: len(self._match(lru, hashes)) * self.block_size for worker, lru in self._blocks.items()}
        return {worker: tokens for worker, tokens in sorted(matches.items()) if tokens}

    def forget_worker(self, worker_id: str) -> None:
        """Drops everything about a worker (gone, restarted, or its cache reset)."""
        self._blocks.pop(worker_id, None)
        self._capacity.pop(worker_id, None)

    def evict_blocks(self, worker_id: str, hashes: Iterable[Hashable]) -> int:
        """The engine evicted these blocks (KV events): drops them; returns how many were known."""
        lru = self._blocks.get(worker_id, OrderedDict())
        removed = 0
        for block in hashes:
            if block in lru:
                del lru[block]
                removed += 1
        return removed

    @staticmethod
    def _match(lru: OrderedDict[Hashable, None], hashes: list) -> list:
        matched = []
        for block in hashes:
            if block not in lru:
                break
            matched.append(block)
        return matched
