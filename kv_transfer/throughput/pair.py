"""A synthetic prefill/decode pair: a producer process holding a paged cache behind a real
`TransferServer` and the raw reference servers, and a consumer (the calling process) that can
receive the same blocks every way there is, each way a callable returning seconds.

The producer runs two transfer servers sharing one lease table, as two producers configured
differently would: one over a cache in ordinary memory serving `tcp` and `torch`, and one over a
cache in a shared-memory `Segment` serving `SERVED["shm"]` (the consumer copies blocks out of it
itself). Both caches hold `geometry.caches(num_blocks, seed=PRODUCER_SEED)` and the raw ways serve
`reference.payload(max_bytes)`, so a test can rebuild what every way must deliver. The segment is
unlinked when the producer returns or raises, and by `open_pair` once the producer is gone (a
producer killed before it reported its segment leaves it to `shm_segment.sweep_stale`).
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from kv_transfer.auth import Credentials, process_credentials
from kv_transfer.consumer import PullClient
from kv_transfer.geometry import BlockGeometry
from kv_transfer.layout import KVLayout
from kv_transfer.leases import Lease, LeaseTable
from kv_transfer.producer import TransferServer
from kv_transfer.lease_board import LeaseBoard
from kv_transfer.shm_segment import Segment
from kv_transfer.throughput import reference
from kv_transfer.transports.base import SERVED
from kv_transfer.transports.shm import SharedCache

PRODUCER_SEED, CONSUMER_SEED = 1, 2
LEASE_S = 3600.0  # the pulls never release a lease: one serves every repeat
_RAW_LISTENERS = {"raw": True, "raw_default": False}  # name -> tuned
_STARTUP_S = 120.0
_PULLED = ("tcp", "torch", "shm")  # the pdserve transports, each a "pdserve <name>" method


UNCHECKED = ", checksums off"   # the suffix of a pdserve method that does not verify block checksums
# The security variants of `pdserve tcp` (`secured`), pulled from a producer with a cluster secret:
# method -> (the consumer's kv_encryption, or None for no secret; a new connection for every pull).
SECURED: dict[str, tuple[str | None, bool]] = {
    "pdserve tcp, authenticated": ("auto", False), "pdserve tcp, encrypted": ("on", False),
    "pdserve tcp, new connection": (None, True), "pdserve tcp, authenticated, new connection": ("auto", True),
    "pdserve tcp, encrypted, new connection": ("on", True)}


def method_names(geometry: BlockGeometry, unchecked: bool = False, secured: bool = False) -> tuple[str, ...]:
    """Every way the consumer receives blocks, in the order they run in a round. With `unchecked`,
    each pdserve transport also runs without verifying block checksums (`PullClient`'s
    `verify_checksums=False`), right after its checked run: the checksums' cost, side by side.
    With `secured`, the `SECURED` variants of `pdserve tcp` follow the pdserve transports."""
    layers = geometry.num_layers
    pulled = [f"pdserve {name}{suffix}" for name in _PULLED for suffix in (("", UNCHECKED) if unchecked else ("",))]
    return (*pulled, *(SECURED if secured else ()), "raw socket", f"raw socket x{layers}",
            "raw socket, host defaults", "raw gloo", f"raw gloo x{layers}", "memcpy")


def pin(core: int | None) -> None:
    """Runs this process on `core` (when the host lets it) with one torch thread."""
    if core is not None and hasattr(os, "sched_setaffinity") and core in os.sched_getaffinity(0):
        os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)


@contextmanager
def pinned(core: int | None) -> Iterator[None]:
    """`pin` for the duration; the caller's affinity and torch threads are restored after."""
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    threads = torch.get_num_threads()
    pin(core)
    try:
        yield
    finally:
        if affinity is not None:
            os.sched_setaffinity(0, affinity)
        torch.set_num_threads(threads)


def transfer_server(geometry: BlockGeometry, num_blocks: int, leases: LeaseTable,
                    segment: Segment | None = None, credentials: Credentials | None = None) -> TransferServer:
    """A server over a fresh seeded cache: in ordinary memory serving `tcp` and `torch`, or in
    `segment` (`geometry.cache_bytes(num_blocks)` bytes) serving what a producer configured for
    `shm` serves. `credentials`: with a cluster secret (default: the process's, none)."""
    memory = None if segment is None else segment.tensor
    caches = geometry.caches(num_blocks, seed=PRODUCER_SEED, memory=memory)
    layout = KVLayout(caches, num_blocks)
    shared = None if segment is None else SharedCache.of(segment, caches, num_blocks)
    transports = ("tcp", "torch") if segment is None else SERVED["shm"]
    return TransferServer(layout, layout.compat("throughput", geometry.block_size), leases, "127.0.0.1", 0,
                          transports=transports, shared_cache=shared, credentials=credentials)


def secured_credentials(secret: bytes, encryption: str = "auto") -> Credentials:
    """The secured ways' credentials: this process's identity (the lease table binds every transfer
    to the one identity that pulls it first, so all the ways pull as one consumer), the secret."""
    return Credentials(process_credentials().identity, secret, encryption)


def producer_main(geometry: BlockGeometry, num_blocks: int, max_bytes: int, conn, core: int | None,
                  secret: bytes = b"") -> None:
    """The producer process: sends its endpoints, grants a lease per `(transfer_id, num_blocks)`
    received, and returns after `None` and the consumer's gloo stop request. Its segment is
    unlinked when this returns or raises."""
    pin(core)
    segment = Segment(geometry.cache_bytes(num_blocks))
    try:
        _produce(geometry, num_blocks, max_bytes, conn, segment, secret)
    finally:
        segment.close()


def _produce(geometry: BlockGeometry, num_blocks: int, max_bytes: int, conn, segment: Segment, secret: bytes) -> None:
    leases = LeaseTable()
    leases.attach_board(LeaseBoard(segment.board_area()))   # as a prefill worker's: shm consumers read it
    server = transfer_server(geometry, num_blocks, leases)
    shm_server = transfer_server(geometry, num_blocks, leases, segment)
    secured = [transfer_server(geometry, num_blocks, leases, credentials=secured_credentials(secret))] if secret else []
    source = reference.payload(max_bytes)
    listeners = {name: socket.create_server(("127.0.0.1", 0)) for name in _RAW_LISTENERS}
    for name, listener in listeners.items():
        threading.Thread(target=reference.serve_raw_socket, args=(listener, source, _RAW_LISTENERS[name]),
                         daemon=True).start()
    store = dist.TCPStore("127.0.0.1", 0, world_size=2, is_master=True, timeout=timedelta(seconds=60),
                          wait_for_workers=False)
    gloo = threading.Thread(target=reference.serve_raw_gloo, args=(store, source))
    gloo.start()
    conn.send({"kv": f"127.0.0.1:{server.start()}", "kv_shm": f"127.0.0.1:{shm_server.start()}",
               **{"kv_secured": f"127.0.0.1:{one.start()}" for one in secured},
               "segment": str(segment.path), "store": store.port,
               **{name: listener.getsockname()[1] for name, listener in listeners.items()}})
    for transfer_id, count in iter(conn.recv, None):
        leases.grant(Lease(transfer_id, transfer_id, tuple(range(count)), count * geometry.block_size,
                           time.monotonic() + LEASE_S))
        conn.send("granted")
    gloo.join()
    for one in (server, shm_server, *secured):
        one.stop()


class Consumer:
    """Every way of receiving a prompt's blocks from the producer. A pdserve pull writes blocks
    `[n, 2n)` of `layout` (other ids than the producer's `[0, n)`, as in life); the raw ways and
    memcpy write `raw_target`."""

    def __init__(self, geometry: BlockGeometry, num_blocks: int, max_bytes: int, endpoints: dict, control,
                 eviction_bytes: int, unchecked: bool = False, secret: bytes = b""):
        self.geometry, self.unchecked, self.secured = geometry, unchecked, bool(secret)
        self._control = control
        self.layout = KVLayout(geometry.caches(num_blocks, seed=CONSUMER_SEED), num_blocks)
        compat = self.layout.compat("throughput", geometry.block_size)
        self.kv_addresses = {"tcp": endpoints["kv"], "torch": endpoints["kv"], "shm": endpoints["kv_shm"]}
        self.pull_clients = {name: PullClient(self.layout, compat, name) for name in _PULLED}
        if unchecked:
            self.pull_clients |= {name + UNCHECKED: PullClient(self.layout, compat, name, verify_checksums=False)
                                  for name in _PULLED}
        for method, (encryption, _) in SECURED.items() if secret else ():
            self.kv_addresses[method] = endpoints["kv_secured" if encryption else "kv"]
            self.pull_clients[method] = PullClient(self.layout, compat, "tcp", credentials=None if encryption is None
                                                   else secured_credentials(secret, encryption))
        self.raw_socks = {tuned: reference.tune_raw(socket.create_connection(("127.0.0.1", endpoints[name])), tuned)
                          for name, tuned in _RAW_LISTENERS.items()}
        self.raw_target = torch.zeros(max_bytes, dtype=torch.uint8)
        store = dist.TCPStore("127.0.0.1", endpoints["store"], world_size=2, is_master=False,
                              timeout=timedelta(seconds=60))
        self.gloo = reference.gloo_group(store, rank=1)
        self.memcpy_source = reference.payload(max_bytes)
        self._scratch = torch.zeros(eviction_bytes, dtype=torch.uint8)

    def grant(self, transfer_id: str, num_blocks: int) -> None:
        """Has the producer lease its blocks `[0, num_blocks)` under `transfer_id`."""
        self._control.send((transfer_id, num_blocks))
        self._control.recv()

    def evict_caches(self) -> None:
        """Writes a buffer larger than this host's last-level cache, so no method starts with its
        bytes cache-hot because the method before it touched the same memory (the raw ways share
        their buffers; a prefill engine's KV is never hot in the decode engine's cache either)."""
        self._scratch.add_(1)

    def methods(self, transfer_id: str, num_blocks: int) -> dict[str, Callable[[], float]]:
        """`method_names(geometry)` -> a callable moving `num_blocks` blocks' bytes, returning seconds."""
        remote, local = list(range(num_blocks)), list(range(num_blocks, 2 * num_blocks))
        nbytes, layers = num_blocks * self.geometry.bytes_per_block, self.geometry.num_layers
        pulled = [name + suffix for name in _PULLED for suffix in (("", UNCHECKED) if self.unchecked else ("",))]
        pulled += list(SECURED) if self.secured else []
        ways = [*(lambda name=name: self._pull(name, transfer_id, remote, local) for name in pulled),
                lambda: reference.receive_raw_socket(self.raw_socks[True], self.raw_target, nbytes, 1),
                lambda: reference.receive_raw_socket(self.raw_socks[True], self.raw_target, nbytes, layers),
                lambda: reference.receive_raw_socket(self.raw_socks[False], self.raw_target, nbytes, 1),
                lambda: reference.receive_raw_gloo(self.gloo, self.raw_target, nbytes, 1),
                lambda: reference.receive_raw_gloo(self.gloo, self.raw_target, nbytes, layers),
                lambda: reference.memcpy(self.raw_target, self.memcpy_source, nbytes)]
        return dict(zip(method_names(self.geometry, self.unchecked, self.secured), ways, strict=True))

    def _pull(self, method: str, transfer_id: str, remote: list[int], local: list[int]) -> float:
        """One pull as a decode worker runs it, minus the release (the lease serves every repeat); a
        "new connection" way closes its connection first, so the pull opens one (handshake timed)."""
        if SECURED.get(method, (None, False))[1]:
            self.pull_clients[method].close()
        address = self.kv_addresses[method.removesuffix(UNCHECKED)]
        return self.pull_clients[method].pull(address, transfer_id, remote, local).seconds

    def close(self) -> None:
        reference.stop_raw_gloo(self.gloo)
        for client in self.pull_clients.values():
            client.close()
        for sock in self.raw_socks.values():
            sock.close()


def _wait_started(control, producer: mp.process.BaseProcess) -> None:
    if not mp.connection.wait([control, producer.sentinel], _STARTUP_S):
        raise RuntimeError(f"the producer process did not start within {_STARTUP_S:.0f} s")
    if not control.poll():
        producer.join(timeout=5)
        raise RuntimeError(f"the producer process exited with code {producer.exitcode} before it started "
                           "(its traceback is above)")


@contextmanager
def open_pair(geometry: BlockGeometry, num_blocks: int, max_bytes: int, *, eviction_bytes: int,
              cores: tuple[int, int] | None, unchecked: bool = False, secured: bool = False) -> Iterator[Consumer]:
    """Starts the producer process (on `cores[0]`), connects a consumer in this process (pinned to
    `cores[1]` while the pair is open; None: no pinning), and stops both on exit, also on error;
    the producer's segment is gone after (it unlinks it; this makes sure once it is stopped).
    `secured`: the producer also runs a server with a fresh cluster secret for the `SECURED` ways."""
    context = mp.get_context("spawn")
    control, child = context.Pipe()
    producer_core, consumer_core = cores if cores is not None else (None, None)
    secret = secrets.token_bytes(32) if secured else b""
    producer = context.Process(target=producer_main, daemon=True,
                               args=(geometry, num_blocks, max_bytes, child, producer_core, secret))
    producer.start()
    endpoints: dict = {}
    try:
        with pinned(consumer_core):
            _wait_started(control, producer)
            endpoints = control.recv()
            consumer = Consumer(geometry, num_blocks, max_bytes, endpoints, control, eviction_bytes, unchecked, secret)
            try:
                yield consumer
            finally:
                consumer.close()
    finally:
        if producer.is_alive():
            control.send(None)
        producer.join(timeout=30)
        if producer.is_alive():
            producer.terminate()
            producer.join()
        if "segment" in endpoints:  # a terminated producer had no chance to unlink it
            Path(endpoints["segment"]).unlink(missing_ok=True)
