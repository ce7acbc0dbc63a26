"""The vectorized checksum kernels against the serial Fletcher they replace, and the checksums taken
as bytes land (`ReceivedSums`, `recvmsg_into_all`'s `on_received`) against the ones taken after."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest
import torch

from kv_transfer.checksum import ReceivedSums, block_checksums, copy_with_checksums, mismatched, reference_sums
from kv_transfer.geometry import BlockGeometry
from kv_transfer.layout import KVLayout
from kv_transfer.sockets import recvmsg_into_all

MIX = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1


def definition(words: list[int]) -> int:
    """The definition in `kv_transfer.checksum`'s docstring, word by word: Fletcher's running sums a
    and b, folded as MIX * (a + 2b)."""
    a = b = 0
    for word in words:
        a = (a + word) & MASK
        b = (b + a) & MASK
    return (MIX * (a + 2 * b)) & MASK


@pytest.mark.parametrize("block_words", [1, 3, 7, 64, 513, 4096])
def test_the_vectorized_kernels_and_the_numpy_reference_give_the_definition_bit_for_bit(block_words):
    words = np.random.default_rng(block_words).integers(0, 2**64, size=block_words * 5, dtype=np.uint64)
    serial = [definition([int(w) for w in words[k * block_words:(k + 1) * block_words]]) for k in range(5)]
    assert [int(v) for v in reference_sums(words, block_words)] == serial
    target = np.zeros(words.shape[0] * 8, dtype=np.uint8)
    assert copy_with_checksums([target], [words.view(np.uint8)], [block_words * 8], [0], 5) == serial
    assert np.array_equal(target.view(np.uint64), words)
    received = ReceivedSums([(words.view(np.uint8), block_words * 8, 0)], 5)
    assert received.values() == serial


def test_a_flip_of_any_bit_top_bits_included_and_a_swap_of_two_words_name_exactly_their_block():
    words = np.random.default_rng(1).integers(0, 2**64, size=4096, dtype=np.uint64)
    target = np.zeros(4096 * 8, dtype=np.uint8)
    clean = copy_with_checksums([target], [words.view(np.uint8)], [4096], [0], 8)
    for word, bit in [(0, 0), (510, 63), (511, 63), (511, 62), (1000, 31), (4094, 61), (4095, 63)]:
        flipped = words.copy()
        flipped[word] ^= np.uint64(1 << bit)
        got = copy_with_checksums([target], [flipped.view(np.uint8)], [4096], [0], 8)
        assert [k for k in range(8) if got[k] != clean[k]] == [word // 512]
    swapped = words.copy()
    swapped[[600, 1023]] = swapped[[1023, 600]]   # the same block, words of any distance
    got = copy_with_checksums([target], [swapped.view(np.uint8)], [4096], [0], 8)
    assert [k for k in range(8) if got[k] != clean[k]] == [1]


def _layout(num_blocks: int = 12) -> tuple[dict[str, torch.Tensor], KVLayout]:
    geometry = BlockGeometry(num_layers=3, num_kv_heads=2, head_dim=32, block_size=32, dtype="bfloat16")
    caches = geometry.caches(num_blocks, seed=4)
    return caches, KVLayout(caches, num_blocks)


@pytest.mark.parametrize("step", [1000, 8192, 1 << 30])
def test_sums_taken_as_bytes_land_equal_the_ones_taken_after_in_any_steps(step):
    _, layout = _layout()
    local_ids, remote_ids = [2, 3, 4, 9, 10], [5, 6, 1, 7, 8]
    runs = layout.runs(local_ids, remote_ids)
    for ranges in (layout.buffers_of(runs), layout.views_of(runs)):
        received = ReceivedSums.of(layout, runs, ranges)
        total = sum(len(r) if isinstance(r, memoryview) else r.numel() for r in ranges)
        for landed in range(step, total, step):
            received.received(landed)
        assert received.values() == block_checksums(layout, local_ids)


def test_a_block_whose_bytes_land_changed_is_named_even_after_earlier_blocks_were_summed():
    caches, layout = _layout()
    ids = [2, 3]
    runs = layout.runs(ids)
    ranges = layout.buffers_of(runs)
    clean = block_checksums(layout, ids)
    received = ReceivedSums.of(layout, runs, ranges)
    plane_bytes = len(ranges[0])
    received.received(plane_bytes // 2)            # block 2 of the first plane summed, block 3 not
    ranges[0][plane_bytes - 1] ^= 0xFF             # block 3, first plane: lands changed
    assert layout.plane_block_bytes()[0] == plane_bytes // 2
    assert mismatched(ids, clean, received.values()) == [3]


def test_ranges_that_are_not_whole_contiguous_blocks_are_summed_after_the_transfer():
    _, layout = _layout()
    runs = layout.runs([2, 3])
    ranges = layout.buffers_of(runs)
    assert ReceivedSums.of(layout, runs, ranges[:-1]) is None
    assert ReceivedSums.of(layout, runs, [*ranges[:-1], ranges[-1][:-8]]) is None


def test_recvmsg_into_all_reports_each_read_of_at_most_chunk_bytes_until_every_byte_is_in():
    payload = np.random.default_rng(3).integers(0, 256, size=300_000, dtype=np.uint8).tobytes()
    target = bytearray(len(payload))
    view = memoryview(target)
    buffers = [view[:1000], view[1000:200_000], view[200_000:]]
    reports: list[int] = []
    left, right = socket.socketpair()
    with left, right:
        sender = threading.Thread(target=left.sendall, args=(payload,))
        sender.start()
        right.settimeout(5)
        recvmsg_into_all(right, buffers, on_received=reports.append, chunk_bytes=65536)
        sender.join()
    assert bytes(target) == payload
    assert reports[-1] == len(payload) and reports == sorted(set(reports))
    assert max(b - a for a, b in zip([0, *reports], reports)) <= 65536


def test_every_single_bit_flip_of_a_block_changes_its_checksum():
    words = np.random.default_rng(2).integers(0, 2**64, size=64, dtype=np.uint64)
    clean = int(reference_sums(words, 64)[0])
    flipped = np.repeat(words[None, :], 64 * 64, axis=0)
    for word in range(64):
        for bit in range(64):
            flipped[word * 64 + bit, word] ^= np.uint64(1 << bit)
    assert clean not in {int(v) for v in reference_sums(flipped.reshape(-1), 64)}


def test_a_peer_still_on_fletcher64_differs_at_handshake_so_it_is_refused():
    _, layout = _layout()
    compat = layout.compat("m", 32)
    older = compat.to_dict() | {"checksum": "fletcher64"}
    assert compat.mismatches(older) == ["checksum: 'oddweight64' at the producer vs 'fletcher64' at the consumer"]


@pytest.mark.parametrize("block_words", [4096, 4101])   # whole segments of 8, and a tail of 5 words
def test_every_kernel_names_the_block_of_any_single_bit_flip_at_any_bit_of_any_word_position(block_words):
    words = np.random.default_rng(5).integers(0, 2**64, size=block_words * 3, dtype=np.uint64)
    clean = [int(v) for v in reference_sums(words, block_words)]
    target = np.zeros(words.shape[0], dtype=np.uint64)
    positions = sorted({0, 1, 7, 511, 512, 4088, block_words - 1, *range(block_words // 8 - 1, block_words, block_words // 8)})
    for word in positions:
        for bit in range(64):
            flipped = words.copy()
            flipped[block_words + word] ^= np.uint64(1 << bit)       # block 1
            summed = ReceivedSums([(flipped.view(np.uint8), block_words * 8, 0)], 3)
            summed.received(block_words * 8 + (word * 8 // 2))      # block 0 summed while block 1 lands
            copied = copy_with_checksums([target.view(np.uint8)], [flipped.view(np.uint8)], [block_words * 8], [0], 3)
            for got in (summed.values(), copied):
                assert [k for k in range(3) if got[k] != clean[k]] == [1], (word, bit)


def test_two_blocks_swapped_in_place_are_both_named():
    caches, layout = _layout()
    ids = [2, 3, 4]
    clean = block_checksums(layout, ids)
    for cache in caches.values():
        cache[[2, 3]] = cache[[3, 2]]     # the bytes of blocks 2 and 3 trade places in every layer
    assert mismatched(ids, clean, block_checksums(layout, ids)) == [2, 3]
