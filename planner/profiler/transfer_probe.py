"""Timing KV transfers with the real transports, between two paged caches in this process.

The producer side is `kv_transfer.producer.TransferServer` (what a prefill worker runs), the
consumer side `kv_transfer.consumer.PullClient` (what a decode worker runs), over loopback. The
caches have the model's real block geometry (`kv_transfer.geometry.BlockGeometry`: vLLM's CPU
layout, one tensor per layer of `[num_blocks, kv_heads, block_size, 2 * head_dim]`), so a block is
exactly the bytes a worker moves. A sample is one PULL of `num_blocks` blocks, from the request
to the last byte landing in the consumer's cache, the time a decode worker reports as
`kv_transfer_s`; the connection and its handshake are set up before timing, as a worker's
connection is reused across requests. For `shm` the producer's cache lives in a shared-memory
segment with its lease board, as a prefill worker configured for shm keeps it, and the consumer
copies the blocks out of it itself (the one-sided pull `pdserve up` runs on one host).
"""

from __future__ import annotations

import itertools
import statistics
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kv_transfer.consumer import PullClient
from kv_transfer.geometry import BlockGeometry
from kv_transfer.layout import KVLayout
from kv_transfer.lease_board import LeaseBoard
from kv_transfer.leases import Lease, LeaseTable
from kv_transfer.producer import TransferServer
from kv_transfer.shm_segment import Segment
from kv_transfer.transports.base import SERVED
from kv_transfer.transports.shm import SharedCache

# BlockGeometry lives in kv_transfer.geometry; named here too for the profiler job that builds one.
__all__ = ["BlockGeometry", "TransferMeasurement", "measure_transfers"]


@dataclass(frozen=True)
class TransferMeasurement:
    transport: str
    num_blocks: int
    kv_bytes: int
    transfer_s: float


@contextmanager
def _producer(geometry: BlockGeometry, num_blocks: int, transport: str) -> Iterator[tuple[KVLayout, LeaseTable, str]]:
    """A transfer server serving `transport`; for shm over a cache in a fresh segment, unlinked after."""
    segment = Segment(geometry.cache_bytes(num_blocks)) if transport == "shm" else None
    try:
        caches = geometry.caches(num_blocks, memory=None if segment is None else segment.tensor)
        layout, leases = KVLayout(caches, num_blocks), LeaseTable()
        shared = None
        if segment is not None:
            leases.attach_board(LeaseBoard(segment.board_area()))  # shm consumers read their grants there
            shared = SharedCache.of(segment, caches, num_blocks)
        server = TransferServer(layout, layout.compat("profile", geometry.block_size), leases, "127.0.0.1", 0,
                                transports=SERVED["shm"] if segment is not None else ("tcp", "torch"),
                                shared_cache=shared)
        port = server.start()
        try:
            yield layout, leases, f"127.0.0.1:{port}"
        finally:
            server.stop()
    finally:
        if segment is not None:
            segment.close()


def measure_transfers(geometry: BlockGeometry, transport: str, block_counts: tuple[int, ...],
                      repeats: int) -> Iterator[TransferMeasurement]:
    """Yields the median pull time of each block count (after one untimed pull of every count:
    the first touch of a buffer size costs page faults a serving worker has long paid)."""
    num_blocks = max(block_counts) * 2
    with _producer(geometry, num_blocks, transport) as (producer_layout, leases, address):
        consumer_layout = KVLayout(geometry.caches(num_blocks), num_blocks)
        client = PullClient(consumer_layout, consumer_layout.compat("profile", geometry.block_size), transport)
        try:
            for count in block_counts:  # connect, handshake, first touch of the buffers
                _pull(client, leases, address, count)
            for count in block_counts:
                samples = [_pull(client, leases, address, count) for _ in range(repeats)]
                yield TransferMeasurement(transport, count, producer_layout.num_bytes(count),
                                          statistics.median(samples))
        finally:
            client.close()


_counter = itertools.count()


def _pull(client: PullClient, leases: LeaseTable, address: str, count: int) -> float:
    """One timed pull of `count` blocks: the producer's first blocks into the consumer's last ones."""
    transfer_id = f"profile-{uuid.uuid4().hex}"
    remote = list(range(count))
    local = list(range(count, 2 * count))
    leases.grant(Lease(transfer_id, f"r{next(_counter)}", tuple(remote), count, time.monotonic() + 60))
    started = time.perf_counter()
    client.pull(address, transfer_id, remote, local)
    elapsed = time.perf_counter() - started
    client.release(address, transfer_id)
    return elapsed
