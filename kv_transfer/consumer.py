"""The consumer's side of a pull: lives in the decode engine's worker process.

One connection per producer address, reused across pulls and serialised by a lock (a pull is one
request's blocks; concurrent pulls from different producers run in parallel on the caller's pool).
A connection that fails in any way is closed and dropped, so the next pull starts from a fresh
handshake; the failed pull raises `TransferError` and the caller applies the load-failure policy.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Sequence


from kv_transfer.layout import KVCompat, KVLayout
from kv_transfer.transports.base import DataChannel, get_transport
from kv_transfer.transports.tcp import tune_socket
from kv_transfer.wire import IncompatiblePeer, TransferError, expect, recv_message, send_message


@dataclass(frozen=True)
class PullResult:
    num_bytes: int
    num_blocks: int
    seconds: float


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise TransferError(f"bad KV transfer address {address!r}: expected host:port")
    return host.strip("[]"), int(port)


def release_transfer(address: str, transfer_id: str, timeout_s: float = 5.0) -> bool:
    """Tells the producer at `address` it may free the transfer's blocks; True if it still held them.

    Used by the consumer after a pull, and by the router (through the prefill worker) on abort."""
    with socket.create_connection(split_address(address), timeout=timeout_s) as sock:
        send_message(sock, {"op": "RELEASE", "transfer_id": transfer_id})
        return bool(expect(recv_message(sock), "RELEASED")["found"])


class _Connection:
    def __init__(self, sock: socket.socket, channel: DataChannel):
        self.sock, self.channel = sock, channel
        self.lock = threading.Lock()

    def close(self) -> None:
        self.channel.close()
        self.sock.close()


class PullClient:
    def __init__(self, layout: KVLayout, compat: KVCompat, transport: str, timeout_s: float = 30.0):
        self.layout, self.compat = layout, compat
        self.transport = get_transport(transport)
        self.timeout_s = timeout_s
        self._connections: dict[str, _Connection] = {}
        self._dialing: dict[str, threading.Lock] = {}  # address -> held while a handshake runs
        self._lock = threading.Lock()

    def pull(self, address: str, transfer_id: str, remote_block_ids: Sequence[int],
             local_block_ids: Sequence[int]) -> PullResult:
        """Copies the producer's `remote_block_ids` of `transfer_id` into our `local_block_ids`."""
        if len(remote_block_ids) != len(local_block_ids):
            raise TransferError(f"{len(remote_block_ids)} remote blocks for {len(local_block_ids)} local blocks")
        started = time.perf_counter()
        views = self.layout.views(local_block_ids, paired_with=remote_block_ids)
        connection = self._connect(address)
        with connection.lock:
            try:
                send_message(connection.sock, {"op": "PULL", "transfer_id": transfer_id,
                                               "block_ids": list(remote_block_ids),
                                               "local_block_ids": list(local_block_ids)})
                reply = recv_message(connection.sock)
                if reply["op"] == "MISSING":
                    raise TransferError(reply["error"])
                expected = self.layout.num_bytes(len(local_block_ids))
                if expect(reply, "SENDING")["num_bytes"] != expected:
                    raise TransferError(f"producer sends {reply['num_bytes']} bytes, expected {expected}")
                connection.channel.recv(views)
            except (TransferError, OSError, RuntimeError) as error:
                self._drop(address, connection)
                raise TransferError(f"pull of {transfer_id} from {address} failed: {error}") from error
        return PullResult(expected, len(local_block_ids), time.perf_counter() - started)

    def release(self, address: str, transfer_id: str) -> bool:
        return release_transfer(address, transfer_id, self.timeout_s)

    def close(self) -> None:
        with self._lock:
            connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            connection.close()

    def _connect(self, address: str) -> _Connection:
        """The open connection to `address`, or a new one. Concurrent first pulls to one producer
        wait for a single handshake (a second one would open a data channel nobody closes)."""
        with self._lock:
            dialing = self._dialing.setdefault(address, threading.Lock())
        with dialing:
            with self._lock:
                existing = self._connections.get(address)
            if existing is not None:
                return existing
            connection = self._handshake(address)
            with self._lock:
                self._connections[address] = connection
            return connection

    def _handshake(self, address: str) -> _Connection:
        sock = socket.create_connection(split_address(address), timeout=self.timeout_s)
        try:
            tune_socket(sock)
            offer = self.transport.consumer_offer(sock, self.layout.device)
            send_message(sock, {"op": "HELLO", "compat": self.compat.to_dict(),
                                "transport": self.transport.name, **offer.fields})
            reply = recv_message(sock)
            if reply["op"] == "REFUSED":
                raise IncompatiblePeer(f"producer {address} refused: {reply['error']}")
            expect(reply, "WELCOME")
            return _Connection(sock, offer.connect(sock))
        except BaseException:
            sock.close()
            raise

    def _drop(self, address: str, connection: _Connection) -> None:
        with self._lock:
            if self._connections.get(address) is connection:
                del self._connections[address]
        connection.close()


__all__ = ["PullClient", "PullResult", "release_transfer", "split_address"]
