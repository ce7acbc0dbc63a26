"""Per-block checksums of KV bytes: computed by the producer when a lease is granted, checked by the
consumer on what it received or copied, before the blocks are reported loaded.

The checksum ("oddweight64") of one block in one plane (a layer's K/V plane, see `kv_transfer.layout`)
is a position-weighted sum of its bytes as little-endian 64-bit words w0 .. wn-1, modulo 2**64, with
odd weights:

    plane checksum = MIX * sum((2 * (n - i) + 1) * wi)          (MIX = 0x9E3779B97F4A7C15, odd)

which is Fletcher's pair folded without loss of oddness: with a = sum(wi) and b = sum of the running
a = sum((n - i) * wi), it is MIX * (a + 2 * b). A block's checksum folds its planes in the layout's
canonical order (`acc * FOLD + plane`, FOLD odd), so both sides get the same number whatever runs
they cut. What it detects, always: any change confined to one 64-bit word of a block (every single
bit flip; a word's change d moves the sum by d times an odd number, never 0 modulo 2**64), and any
one plane's such change through the fold; two swapped words i < j unless their difference has at
least 63 - t trailing zero bits, t those of j - i (so equal words in their low 52 bits, in a
4096-word plane block); a block copied into another's place (each block is compared with its own). Not
always: several changes that cancel, e.g. the top bit flipped in two words of one block
(2**63 + 2**63 = 0). "fletcher64", the sum before, took a XOR (b * MIX) and missed a flip of bit 63
in every word where n - i is odd, and flips of the next bits by chance. Not a cryptographic hash:
it detects corruption (bytes flipped, a block reused while read, a truncated or misplaced copy),
not an adversary, who cannot get on the authenticated KV plane in the first place (`kv_transfer.auth`).

Why this sum and not zlib's crc32, blake3 (both here) or xxhash (not in the lock): it runs near
memory speed and fuses with the shm copy. The kernels (`kv_transfer.checksum_kernels`) compute
sum(wi) and sum(i * wi), sums without a dependency from word to word, which LLVM vectorizes (the
serial `a += w; b += a` does one word per cycle); the summing kernel takes one multiply per 8 words
(how: that module). On this host, 256 KiB in L2 sums in 3.3-8.3 us (a plain sum of the
words 2.6 us); 12 MiB from memory in 0.44-0.55 ms, and 0.9 ms copy and sum in one pass (memmove
alone 0.9-1.0); crc32 takes 4.9-5.7 ms, blake3 1.7. They are numba-compiled (numba ships with vLLM;
`cache=True`, warmed at startup by `warm_up`); `reference_sums` is the same function in numpy,
written from the weights, used where numba is missing and by the tests to pin the kernels down.
Block sizes that are not a multiple of 8 bytes (no vLLM cache has one) use zlib's crc32 per block
on both sides alike.

CPU caches only: a CUDA cache's blocks are not checksummed (its transports, NCCL and CUDA IPC, do
not pass through host memory), and `supported(layout)` says so.
"""

from __future__ import annotations

import zlib
from typing import Sequence

import numpy as np

from kv_transfer.checksum_kernels import compile_kernels
from kv_transfer.layout import CHECKSUM_ALGORITHM, KVLayout
from kv_transfer.lease_board import lease_checksum

ALGORITHM = CHECKSUM_ALGORITHM
_MIX = np.uint64(0x9E3779B97F4A7C15)
_FOLD = np.uint64(0x100000001B3)


def reference_sums(words: np.ndarray, block_words: int) -> np.ndarray:
    """The plane checksums of consecutive blocks of `block_words` words, in numpy (no numba)."""
    blocks = words.reshape(-1, block_words)
    weights = (2 * np.arange(block_words, 0, -1, dtype=np.uint64) + 1).astype(np.uint64)
    with np.errstate(over="ignore"):
        return (blocks * weights).sum(axis=1, dtype=np.uint64) * _MIX


_sums_kernel, _copy_sums_kernel = compile_kernels()


def supported(layout: KVLayout) -> bool:
    """Whether `layout`'s blocks are checksummed: CPU caches."""
    return layout.device.type == "cpu"


def warm_up() -> None:
    """Compiles (or loads from numba's cache) every kernel signature a pull uses, so the first pull
    does not pay it."""
    words = np.zeros(4, dtype=np.uint64)
    readonly = words.copy()
    readonly.flags.writeable = False
    _plane_sums(words, 2)
    _plane_copy_sums(np.zeros(4, dtype=np.uint64), words, 2)
    _plane_copy_sums(np.zeros(4, dtype=np.uint64), readonly, 2)


def _plane_sums(words: np.ndarray, block_words: int) -> np.ndarray:
    if _sums_kernel is None:
        return reference_sums(words, block_words)
    out = np.empty(words.shape[0] // block_words, dtype=np.uint64)
    _sums_kernel(words, block_words, 0, out.shape[0], out)
    return out


def _plane_copy_sums(target: np.ndarray, source: np.ndarray, block_words: int) -> np.ndarray:
    if _copy_sums_kernel is None:
        target[:] = source
        return reference_sums(target, block_words)
    out = np.empty(source.shape[0] // block_words, dtype=np.uint64)
    _copy_sums_kernel(target, source, block_words, out)
    return out


def _bytes_sums(data: np.ndarray, block_bytes: int) -> np.ndarray:
    """Blocks whose size is no multiple of 8: crc32 each (both sides take this path alike)."""
    return np.array([zlib.crc32(data[i: i + block_bytes]) for i in range(0, data.shape[0], block_bytes)],
                    dtype=np.uint64)


class BlockSums:
    """Accumulates per-block checksums plane by plane, in the canonical order (`kv_transfer.layout`)."""

    def __init__(self, num_blocks: int):
        self.values = np.zeros(num_blocks, dtype=np.uint64)

    def add(self, first: int, plane_sums: np.ndarray) -> None:
        """`plane_sums` are the checksums of blocks `first, first+1, ...` of the next plane."""
        # In place, arrays only: numpy wraps uint64 arrays modulo 2**64 without a warning (an
        # `np.errstate` here cost 4 us a call, 12 calls a pull).
        values = self.values[first: first + plane_sums.shape[0]]
        np.multiply(values, _FOLD, out=values)
        np.add(values, plane_sums, out=values)

    def as_list(self) -> list[int]:
        return self.values.tolist()


def block_checksums(layout: KVLayout, block_ids: Sequence[int]) -> list[int]:
    """The checksum of each of `block_ids` (in their order) as the cache holds them now."""
    sums = BlockSums(len(block_ids))
    for first, arrays in _plane_pieces(layout, block_ids):
        for array, block_bytes in arrays:
            sums.add(first, _array_sums(array, block_bytes))
    return sums.as_list()


def _array_sums(array: np.ndarray, block_bytes: int) -> np.ndarray:
    if block_bytes % 8:
        return _bytes_sums(array, block_bytes)
    return _plane_sums(array.view(np.uint64), block_bytes // 8)


def copy_with_checksums(targets: Sequence[np.ndarray], sources: Sequence[np.ndarray], block_bytes: Sequence[int],
                        first_blocks: Sequence[int], num_blocks: int) -> list[int]:
    """Copies each `sources[i]` (uint8, whole blocks of `block_bytes[i]`) into `targets[i]` and returns
    the per-block checksums of what was written, in one pass over the bytes. Piece `i` holds blocks
    `first_blocks[i], ...` of the pull; pieces come plane by plane in the canonical order."""
    sums = BlockSums(num_blocks)
    for target, source, size, first in zip(targets, sources, block_bytes, first_blocks):
        if size % 8:
            target[:] = source
            sums.add(first, _bytes_sums(target, size))
        else:
            sums.add(first, _plane_copy_sums(target.view(np.uint64), source.view(np.uint64), size // 8))
    return sums.as_list()


class ReceivedSums:
    """The per-block checksums of a pull's byte ranges, taken as the bytes land: `received(n)` after
    the first `n` bytes of the ranges (in their order) are written sums every block completed since
    the last call, while its bytes are still in this core's cache; `values()` sums the rest and
    returns them. The ranges come plane by plane in the canonical order, as `KVLayout.buffers_of`
    and `views_of` cut them, so the fold is the one `block_checksums` takes. `of` returns None when
    a range is no contiguous piece of whole blocks (the caller then sums after the transfer)."""

    def __init__(self, pieces: list[tuple[np.ndarray, int, int]], num_blocks: int):
        # Per piece: its bytes (as words when whole words), bytes per block, first block, its sums.
        # Kept ready so that a `received` call is one kernel call per piece it finishes blocks of.
        self._pieces = [(array.view(np.uint64) if size % 8 == 0 else array, size, first,
                         np.zeros(array.shape[0] // size, dtype=np.uint64)) for array, size, first in pieces]
        self._num_blocks = num_blocks
        self._total_bytes = sum(array.shape[0] for array, _, _ in pieces)
        self._piece, self._piece_start, self._summed = 0, 0, 0   # current piece, its offset, its blocks done

    @classmethod
    def of(cls, layout: KVLayout, runs: list[tuple[int, int]], ranges: Sequence) -> "ReceivedSums | None":
        sizes = layout.plane_block_bytes()
        if not runs or len(ranges) != len(sizes) * len(runs):
            return None
        firsts, position = [], 0
        for start, stop in runs:
            firsts.append(position)
            position += stop - start
        pieces = []
        for index, piece in enumerate(ranges):
            array = _as_bytes(piece)
            plane, run = divmod(index, len(runs))
            start, stop = runs[run]
            if array is None or array.shape[0] != (stop - start) * sizes[plane]:
                return None
            pieces.append((array, sizes[plane], firsts[run]))
        return cls(pieces, position)

    def received(self, num_bytes: int) -> None:
        while self._piece < len(self._pieces):
            data, size, _, out = self._pieces[self._piece]
            complete = min(out.shape[0], (num_bytes - self._piece_start) // size)
            if complete > self._summed:
                _sums_into(data, size, self._summed, complete, out)
                self._summed = complete
            if complete < out.shape[0]:
                return
            self._piece, self._piece_start, self._summed = self._piece + 1, self._piece_start + size * out.shape[0], 0

    def values(self) -> list[int]:
        self.received(self._total_bytes)
        sums = BlockSums(self._num_blocks)
        for _, _, first, out in self._pieces:
            sums.add(first, out)
        return sums.as_list()


def _sums_into(data: np.ndarray, block_bytes: int, start: int, stop: int, out: np.ndarray) -> None:
    """Plane checksums of blocks `start` to `stop` of `data` (words, or bytes when blocks are not
    whole words) into `out[start:stop]`."""
    if block_bytes % 8:
        out[start:stop] = _bytes_sums(data[start * block_bytes: stop * block_bytes], block_bytes)
        return
    words = block_bytes // 8
    if _sums_kernel is None:
        out[start:stop] = reference_sums(data[start * words: stop * words], words)
    else:
        _sums_kernel(data, words, start, stop, out)


def _as_bytes(piece) -> np.ndarray | None:
    """A range (memoryview or uint8 tensor) as a flat uint8 array over the same memory, or None."""
    if isinstance(piece, memoryview):
        return np.frombuffer(piece, dtype=np.uint8) if piece.contiguous else None
    if piece.dim() != 1 or not piece.is_contiguous() or piece.device.type != "cpu":
        return None
    return piece.numpy()


def _plane_pieces(layout: KVLayout, block_ids: Sequence[int]):
    """(index of the run's first block in `block_ids`, [(uint8 array, bytes per block) per plane])
    for each run of `block_ids`, planes in the canonical order within a run. Runs are cut anywhere
    the ids stop being one piece of memory; per-block sums do not depend on where."""
    runs = layout.runs(block_ids)
    views = layout.views_of(runs)
    num_planes = len(views) // len(runs) if runs else 0
    sizes = layout.plane_block_bytes()
    firsts, position = [], 0
    for start, stop in runs:
        firsts.append(position)
        position += stop - start
    # views_of orders by plane, then run: regroup per plane.
    for plane in range(num_planes):
        for index, first in enumerate(firsts):
            view = views[plane * len(runs) + index]
            yield first, [(view.numpy(), sizes[plane])]


def mismatched(block_ids: Sequence[int], expected: Sequence[int], got: Sequence[int]) -> list[int]:
    """The ids of `block_ids` whose checksum in `got` differs from `expected` (all of them when the
    lengths differ: the producer's list does not describe these blocks)."""
    if len(expected) != len(block_ids) or len(got) != len(block_ids):
        return list(block_ids)
    return [block_id for block_id, e, g in zip(block_ids, expected, got) if int(e) != int(g)]


__all__ = ["ALGORITHM", "BlockSums", "ReceivedSums", "block_checksums", "copy_with_checksums", "lease_checksum", "mismatched",
           "reference_sums", "supported", "warm_up"]
