"""The compiled kernels of `kv_transfer.checksum`: the plane checksums of consecutive blocks, alone
or fused with their copy (shm). The definition (in that module's docstring) is, for a block of
n words,

    MIX * ((2n + 1) * sum(wi) - 2 * sum(i * wi))                    (mod 2**64)

How the summing kernel computes sum(i * wi) without a multiply per word: a block is read as 8
segments of Q = n // 8 words (then a tail of n % 8 words, summed word by word), word i = t * Q + q
of segment t:

    sum(i * wi) = sum_q q * col_q + Q * sum_q (u1 + ... + u7)_q
                  col_q = w[q] + w[Q + q] + ... + w[7Q + q],  u_t = w[tQ + q] + ... + w[7Q + q]

so t * w[tQ + q] summed over t is the sum of the suffix sums u1..u7, adds only, and one 64-bit
multiply serves 8 words. The loop over q reads 8 contiguous streams and LLVM vectorizes it. The
multiply-per-word kernel before was bound by the multiply (AVX-512 `vpmullq`, 3 uops): from L2 on
the 2-vCPU AMX Xeon, 256 KiB in 6.1 us against 3.3 us for this one in the same run (5.6-11.8 and
3.3-8.3 us over runs on a shared host; a plain sum of the same words: 2.6 us). The arithmetic is
exact modulo 2**64, so the value is the definition's bit for bit
(`tests/unit/kv_transfer/test_kv_checksum_streaming.py` pins every kernel to it).

Compiled with numba (it ships with vLLM) with `nogil=True`, so a pull's other threads run while a
kernel does; `compile_kernels()` returns None for each when numba is missing (the caller then uses
numpy).
"""

from __future__ import annotations

import logging

import numpy as np

logger = logging.getLogger(__name__)


def _sums_python(words, block_words, start, stop, out):  # pragma: no cover - compiled by numba
    """out[k] = the plane checksum of block k of `words` (`block_words` words each), start <= k < stop."""
    n = np.uint64(block_words)
    seg = block_words // 8
    for k in range(start, stop):
        base = k * block_words
        s0 = words[base: base + seg]
        s1 = words[base + seg: base + 2 * seg]
        s2 = words[base + 2 * seg: base + 3 * seg]
        s3 = words[base + 3 * seg: base + 4 * seg]
        s4 = words[base + 4 * seg: base + 5 * seg]
        s5 = words[base + 5 * seg: base + 6 * seg]
        s6 = words[base + 6 * seg: base + 7 * seg]
        s7 = words[base + 7 * seg: base + 8 * seg]
        total = np.uint64(0)
        by_q = np.uint64(0)
        by_t = np.uint64(0)
        for q in range(seg):
            u7 = s7[q]
            u6 = s6[q] + u7
            u5 = s5[q] + u6
            u4 = s4[q] + u5
            u3 = s3[q] + u4
            u2 = s2[q] + u3
            u1 = s1[q] + u2
            column = s0[q] + u1
            total += column
            by_q += np.uint64(q) * column
            by_t += ((u1 + u2) + (u3 + u4)) + ((u5 + u6) + u7)
        weighted = by_q + np.uint64(seg) * by_t
        for i in range(8 * seg, block_words):
            word = words[base + i]
            total += word
            weighted += np.uint64(i) * word
        out[k] = ((np.uint64(2) * n + np.uint64(1)) * total - np.uint64(2) * weighted) * np.uint64(0x9E3779B97F4A7C15)


def _copy_sums_python(target, source, block_words, out):  # pragma: no cover - compiled by numba
    """Copies `source` into `target` and sets out[k] to the plane checksum of block k, in one pass.
    Word by word, one multiply each: 8 segments copied at once (16 streams) were slower here, 256 KiB
    in 18 us against 8.3 us, as fast as `memmove` of the same bytes."""
    n = np.uint64(block_words)
    for k in range(out.shape[0]):
        block = source[k * block_words:(k + 1) * block_words]
        copied = target[k * block_words:(k + 1) * block_words]
        total = np.uint64(0)
        weighted = np.uint64(0)
        for i in range(block_words):
            word = block[i]
            copied[i] = word
            total += word
            weighted += np.uint64(i) * word
        out[k] = ((np.uint64(2) * n + np.uint64(1)) * total - np.uint64(2) * weighted) * np.uint64(0x9E3779B97F4A7C15)


def compile_kernels():
    """(sums, copy_sums) compiled with numba (from its cache when it can), or (None, None)."""
    try:
        from numba import njit
    except ImportError:  # pragma: no cover - numba comes with vLLM
        logger.warning("numba is missing: KV checksums run in numpy, several times slower")
        return None, None
    try:
        return (njit(nogil=True, cache=True, boundscheck=False)(_sums_python),
                njit(nogil=True, cache=True, boundscheck=False)(_copy_sums_python))
    except (RuntimeError, OSError) as error:  # pragma: no cover - no cache directory to write
        logger.info("KV checksum kernels not cached (%s)", error)
        return njit(nogil=True, boundscheck=False)(_sums_python), njit(nogil=True, boundscheck=False)(_copy_sums_python)
