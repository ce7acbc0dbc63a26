"""The consumer's side of a pull: lives in the decode engine's worker process.

One connection per producer address, reused across pulls and serialised by a lock (a pull is one
request's blocks; concurrent pulls from different producers run in parallel on the caller's pool).
A cached connection can die while idle (the producer restarted, a middlebox dropped it): if it
turns out dead before any byte of the producer's reply arrived, the pull is retried once on a fresh
connection, which is safe because the producer only releases a lease at DONE (or COPIED). Any other failure
closes and drops the connection, so the next pull starts from a fresh handshake; the failed pull
raises `TransferError` and the caller applies the load-failure policy. A MISSING reply is a clean
outcome: the pull fails, the connection stays.

Every connection, one-shot releases included, first runs the mutual authentication of
`kv_transfer.auth` with this side's `Credentials` (cluster secret and worker identity): a producer
that cannot prove the secret is refused (`IncompatiblePeer`) before we send it anything but our
AUTH. It costs one round trip per connection; pulls on a cached connection pay nothing. When the
handshake seals the connection (`kv_transfer.encryption`: by default, one that leaves the host),
the connection's socket is a `SealedSocket` from the HELLO on: the exchanges below and the tcp
channel's bytes are AES-256-GCM records, and a record that fails its tag (`SealBroken`) fails the
pull like any broken transfer: the connection is dropped, the blocks are never reported loaded.

Before a pull returns, the checksum of every block it wrote (`kv_transfer.checksum`: taken over
the bytes received, block by block as they land, or as the shm copy wrote them) is compared with
the producer's (SENDING or DONE_OK carries them; a vouched shm pull compares their fold with the
lease board's): blocks that differ raise `ChecksumMismatch` with their local ids, a load error for
exactly those blocks. The exchange itself completed, so the connection stays.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Sequence

from kv_transfer.auth import Credentials, authenticate_to_producer, process_credentials, warn_if_unauthenticated
from kv_transfer.checksum import ReceivedSums, block_checksums, mismatched, supported, warm_up
from kv_transfer.encryption import warn_if_blocks_in_clear
from kv_transfer.errors import ChecksumMismatch
from kv_transfer.faults import FaultPlan, injector
from kv_transfer.layout import KVCompat, KVLayout
from kv_transfer.lease_board import lease_checksum
from kv_transfer.sealed_socket import seal, send_after_proof
from kv_transfer.sockets import DEFAULT_CONGESTION, connect
from kv_transfer.threads import NOTICE_THREAD_NAME, name_this_thread
from kv_transfer.transports.base import DataChannel, byte_ranges, get_transport
from kv_transfer.wire import (DONE, IncompatiblePeer, PeerClosed, TransferError, encode, expect, recv_message,
                              require_field, send_message)

logger = logging.getLogger(__name__)
MAX_ATTEMPTS = 2  # the first on the cached connection, one more on a fresh one


@dataclass(frozen=True)
class PullResult:
    num_bytes: int
    num_blocks: int
    seconds: float
    attempts: int = 1


class _StaleConnection(TransferError):
    """The cached connection was dead before the producer replied: nothing of this pull happened."""


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise TransferError(f"bad KV transfer address {address!r}: expected host:port")
    return host.strip("[]"), int(port)


def release_transfer(address: str, transfer_id: str, timeout_s: float = 5.0,
                     credentials: Credentials | None = None) -> bool:
    """Tells the producer at `address` it may free the transfer's blocks; True if it still held them.

    A one-shot, authenticated connection (`credentials`, default `process_credentials()`): the
    abort paths (the router through the prefill worker, a consumer whose pull failed) use it; a
    successful pull releases on its own connection (PULL `release`). Raises `IncompatiblePeer` when
    the producer refuses us (authentication, or a transfer bound to another consumer)."""
    credentials = credentials or process_credentials()
    with connect(*split_address(address), timeout_s) as raw:
        peer, proof = authenticate_to_producer(raw, credentials, "")
        sock = seal(raw, peer.keys, "consumer", timeout_s)
        send_after_proof(sock, proof, encode({"op": "RELEASE", "transfer_id": transfer_id}))
        reply = recv_message(sock)
        if reply["op"] == "REFUSED":
            raise IncompatiblePeer(f"the KV producer at {address} refused to release {transfer_id}: "
                                   f"{reply.get('error', '')}")
        return expect(reply, "RELEASED")["found"] is True


class _Connection:
    def __init__(self, sock, channel: DataChannel):
        self.sock, self.channel = sock, channel
        self.lock = threading.Lock()
        self.num_pulls = 0        # exchanges completed: a connection with none was just handshaken
        self.closed = False

    def close(self) -> None:
        self.closed = True
        self.channel.close()
        self.sock.close()


class PullClient:
    """Pulls from any number of producers. `timeout_s` bounds every wait of a pull; `congestion` is
    the TCP congestion control of its connections (see `kv_transfer.sockets`); `credentials` are
    this worker's identity and the cluster secret (default `kv_transfer.auth.process_credentials()`).
    `verify_checksums` (on CPU caches) checks every pulled block's checksum: off only for a
    benchmark's baseline. `faults`: a `FaultPlan` for tests and chaos runs (its consumer-side faults)."""

    def __init__(self, layout: KVLayout, compat: KVCompat, transport: str, timeout_s: float = 30.0,
                 congestion: str = DEFAULT_CONGESTION, credentials: Credentials | None = None,
                 verify_checksums: bool = True, faults: FaultPlan | None = None):
        self.layout, self.compat = layout, compat
        self.credentials = credentials or process_credentials()
        warn_if_unauthenticated(self.credentials, "KV consumer")
        self.verify = verify_checksums and supported(layout)
        if self.verify:
            warm_up()
        self.faults = injector(faults, "consumer")
        self.transport = get_transport(transport, timeout_s, local=layout, faults=self.faults)
        warn_if_blocks_in_clear(self.credentials.encryption, transport, self.transport.sealable,
                                self.credentials.authenticated)
        self.timeout_s = timeout_s
        self.congestion = congestion
        self._connections: dict[str, _Connection] = {}
        self._dialing: dict[str, threading.Lock] = {}  # address -> held while a handshake runs
        self._lock = threading.Lock()
        self._notices: queue.SimpleQueue = queue.SimpleQueue()   # (connection, message) | None: stop
        self._notice_thread: threading.Thread | None = None

    def pull(self, address: str, transfer_id: str, remote_block_ids: Sequence[int],
             local_block_ids: Sequence[int], release: bool = False) -> PullResult:
        """Copies the producer's `remote_block_ids` of `transfer_id` into our `local_block_ids`.

        With `release`, the producer frees the transfer's lease once the bytes are here (no
        separate RELEASE). Raises `IncompatiblePeer` when the producer refuses the handshake and
        `TransferError` for every other failure; after a failure the local blocks hold garbage."""
        if len(remote_block_ids) != len(local_block_ids):
            raise TransferError(f"{len(remote_block_ids)} remote blocks for {len(local_block_ids)} local blocks")
        started = time.perf_counter()
        runs = self.layout.runs(local_block_ids, remote_block_ids)  # bad ids fail here, before any message
        for attempt in range(1, MAX_ATTEMPTS + 1):
            connection = self._connect(address)
            with connection.lock:
                if connection.closed:  # dropped by another pull while we waited for it
                    continue
                try:
                    self._exchange(connection, transfer_id, remote_block_ids, local_block_ids, runs, release)
                except _StaleConnection as error:
                    self._drop(address, connection)
                    if connection.num_pulls == 0 or attempt == MAX_ATTEMPTS:
                        raise TransferError(f"pull of {transfer_id} from {address} failed: {error}") from error
                    continue
                except _Missing as missing:
                    raise TransferError(str(missing)) from None
                except ChecksumMismatch:
                    raise  # the exchange completed: the connection is fine
                except (TransferError, OSError, RuntimeError, ValueError, KeyError) as error:
                    self._drop(address, connection)
                    raise TransferError(f"pull of {transfer_id} from {address} failed: {error}") from error
            return PullResult(self.layout.num_bytes(len(local_block_ids)), len(local_block_ids),
                              time.perf_counter() - started, attempt)
        raise TransferError(f"pull of {transfer_id} from {address} failed: its connection kept closing")

    def _exchange(self, connection: _Connection, transfer_id: str, remote_block_ids: Sequence[int],
                  local_block_ids: Sequence[int], runs: list[tuple[int, int]], release: bool) -> None:
        """PULL -> SENDING + bytes -> DONE on `connection` (whose lock the caller holds); over a
        one-round-trip channel our copy, then COPIED -> DONE_OK, or COPIED alone when the producer's
        lease board vouched for the copy (`kv_transfer.wire`). The byte
        ranges are cut while the producer looks the lease up. A connection the producer closed
        while idle shows up as the reply's EOF (or a reset on the first message): `_StaleConnection`."""
        sock, channel = connection.sock, connection.channel
        pull = {"op": "PULL", "transfer_id": transfer_id, "block_ids": list(remote_block_ids),
                "local_block_ids": list(local_block_ids), "release": release}
        ranges, sums = None, None
        try:
            if channel.one_round_trip:
                copy_started_s, board = time.monotonic(), getattr(channel, "board", None)
                vouch = board.snapshot(transfer_id, time.monotonic_ns()) if board is not None else None
                sums = _block_sums(channel.copy(local_block_ids, remote_block_ids))
                if (vouch is not None and self._matches_board(vouch.checksum, sums)
                        and board.still_holds(vouch, time.monotonic_ns())):
                    # The board saw the lease held from before the copy to after it, and our copy's
                    # checksums fold to the ones it showed: the blocks are ours and intact. The
                    # producer needs only the release, a notice with no reply, sent off this pull's
                    # path; without release it needs nothing.
                    if release:
                        self._post(connection, pull | {"op": "COPIED", "copy_started_s": copy_started_s,
                                                       "vouched": True})
                    connection.num_pulls += 1
                    return
                send_message(sock, pull | {"op": "COPIED", "copy_started_s": copy_started_s})
            else:
                send_message(sock, pull)
                ranges = byte_ranges(channel, self.layout, runs)
            reply = recv_message(sock)
        except (BrokenPipeError, ConnectionResetError) as error:
            raise _StaleConnection(f"connection lost before the reply: {error}") from error
        except PeerClosed as error:
            if error.received:
                raise
            raise _StaleConnection("the producer closed the connection before replying") from error
        if reply["op"] == "MISSING":
            connection.num_pulls += 1
            raise _Missing(str(reply.get("error", "the producer holds no such transfer")))
        if channel.one_round_trip:
            if reply["op"] == "RECOPY":  # granted while we copied: the first copy may have read unfinished blocks
                sums = _block_sums(channel.copy(local_block_ids, remote_block_ids))
                send_message(sock, DONE)
                reply = recv_message(sock)
            expect(reply, "DONE_OK")
            connection.num_pulls += 1
            self._check(local_block_ids, reply, sums)
            return
        expected = self.layout.num_bytes(len(local_block_ids))
        if require_field(expect(reply, "SENDING"), "num_bytes", int) != expected:
            raise TransferError(f"producer sends {reply['num_bytes']} bytes, expected {expected}")
        if channel.kind == "mapped":  # one-sided: we copy, then the producer confirms its pin held
            sums = _block_sums(channel.copy(local_block_ids, remote_block_ids))
            send_message(sock, DONE)
            expect(recv_message(sock), "DONE_OK")
        else:
            received = ReceivedSums.of(self.layout, runs, ranges) if self.verify else None
            channel.recv(ranges, None if received is None else received.received)
            send_message(sock, DONE)
            sums = None if received is None else received.values()
        connection.num_pulls += 1
        self._check(local_block_ids, reply, sums)

    def _matches_board(self, board_checksum: int, sums: list[int] | None) -> bool:
        """Whether a vouched copy's checksums fold to the board's (always, when we do not verify).
        A board without one (0), or a pull of part of the lease's blocks, asks the producer instead."""
        if not self.verify:
            return True
        return board_checksum != 0 and sums is not None and lease_checksum(sums) == board_checksum

    def _check(self, local_block_ids: Sequence[int], reply: dict, sums: list[int] | None) -> None:
        """Raises `ChecksumMismatch` for the blocks whose bytes here differ from the producer's
        checksums in `reply` (taken over `local_block_ids` now unless the copy took them: `sums`)."""
        if not self.verify:
            return
        expected = reply.get("checksums")
        if not isinstance(expected, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in expected):
            raise TransferError(f"the producer's {reply['op']} carries no valid block checksums")
        got = sums if sums is not None else block_checksums(self.layout, local_block_ids)
        bad = mismatched(local_block_ids, expected, got)
        if bad:
            raise ChecksumMismatch(f"{len(bad)} of {len(local_block_ids)} KV blocks arrived with a wrong checksum "
                                   f"(local ids {bad[:8]}{'...' if len(bad) > 8 else ''})", bad)

    def _post(self, connection: _Connection, notice: dict) -> None:
        """Queues `notice` for the connection's producer; one thread sends the queue in order, each
        under the connection's lock (between exchanges, never inside one)."""
        with self._lock:
            if self._notice_thread is None:
                self._notice_thread = threading.Thread(target=self._send_notices, name="pdserve-kv-notice",
                                                       daemon=True)
                self._notice_thread.start()
        self._notices.put((connection, notice))

    def _send_notices(self) -> None:
        name_this_thread(NOTICE_THREAD_NAME)
        while (item := self._notices.get()) is not None:
            connection, notice = item
            with connection.lock:
                if connection.closed:
                    continue
                try:
                    send_message(connection.sock, notice)
                except (OSError, TransferError) as error:  # the lease expires on its own at the producer
                    logger.debug("KV release notice for %s not sent: %s", notice.get("transfer_id"), error)

    def release(self, address: str, transfer_id: str) -> bool:
        return release_transfer(address, transfer_id, self.timeout_s, self.credentials)

    def drop_stale(self) -> list[str]:
        """Closes idle connections whose channel went stale (a one-sided producer that is gone: our
        map of its segment, or its CUDA IPC handles, would keep the dead cache's memory); the
        addresses dropped. A busy one is left for later."""
        with self._lock:
            candidates = [(a, c) for a, c in self._connections.items() if c.channel.stale()]
        dropped = []
        for address, connection in candidates:
            if connection.lock.acquire(blocking=False):
                try:
                    self._drop(address, connection)
                    dropped.append(address)
                finally:
                    connection.lock.release()
        return dropped

    def close(self) -> None:
        """Closes every connection once its pull in flight (if any) ends, waiting up to the pull
        timeout; one still busy then keeps its map (the process is ending) and loses its socket.
        Release notices queued before are sent first."""
        with self._lock:
            notices = self._notice_thread
        if notices is not None:
            self._notices.put(None)
            notices.join(self.timeout_s)
        with self._lock:
            connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            if connection.lock.acquire(timeout=self.timeout_s):
                try:
                    connection.close()
                finally:
                    connection.lock.release()
            else:
                connection.sock.close()

    def _connect(self, address: str) -> _Connection:
        """The open connection to `address`, or a new one. Concurrent first pulls to one producer
        wait for a single handshake (a second one would open a data channel nobody closes)."""
        existing = self._connections.get(address)  # the usual case, without locks (a dict read is atomic)
        if existing is not None and not existing.closed and not existing.channel.stale():
            return existing
        with self._lock:
            dialing = self._dialing.setdefault(address, threading.Lock())
        with dialing:
            with self._lock:
                existing = self._connections.get(address)
            if existing is not None and existing.channel.stale():
                with existing.lock:  # a copy in flight on it finishes first: its map must not go under it
                    self._drop(address, existing)  # the producer there restarted: a new segment, a new map
            elif existing is not None and not existing.closed:
                return existing
            connection = self._handshake(address)
            with self._lock:
                self._connections[address] = connection
            return connection

    def _handshake(self, address: str) -> _Connection:
        try:
            sock = connect(*split_address(address), self.timeout_s, self.congestion)
        except OSError as error:
            raise TransferError(f"cannot reach the KV producer at {address}: {error}") from error
        try:
            peer, proof = authenticate_to_producer(sock, self.credentials, self.compat.model_fingerprint)
            sock = seal(sock, peer.keys, "consumer", self.timeout_s)
            offer = self.transport.consumer_offer(sock, self.layout.device)
            send_after_proof(sock, proof, encode({"op": "HELLO", "compat": self.compat.to_dict(),
                                                  "transport": self.transport.name, **offer.fields}))
            reply = recv_message(sock)
            if reply["op"] == "REFUSED":
                raise IncompatiblePeer(f"producer {address} refused: {reply.get('error', '')}")
            expect(reply, "WELCOME")
            channel = offer.connect(sock, reply)
            if hasattr(channel, "checksums"):   # a copying channel takes them as it copies
                channel.checksums = self.verify
            return _Connection(sock, channel)
        except TransferError:
            sock.close()
            raise
        except (OSError, RuntimeError) as error:  # socket or process-group setup
            sock.close()
            raise TransferError(f"handshake with the KV producer at {address} failed: {error}") from error
        except BaseException:
            sock.close()
            raise

    def _drop(self, address: str, connection: _Connection) -> None:
        with self._lock:
            if self._connections.get(address) is connection:
                del self._connections[address]
        connection.close()


def _block_sums(copied) -> list[int] | None:
    """A copy's per-block checksums (shm), or None (a channel that takes none: CUDA IPC)."""
    return copied if isinstance(copied, list) else None


class _Missing(TransferError):
    """The producer answered MISSING: this pull fails, the connection is fine."""


__all__ = ["PullClient", "PullResult", "release_transfer", "split_address"]
