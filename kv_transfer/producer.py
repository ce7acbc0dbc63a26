"""The producer's transfer server: lives in the prefill engine's worker process, next to the cache.

One thread accepts; one thread per consumer connection runs the exchange of `kv_transfer.wire`.
Block bytes are read straight from the paged cache while the engine keeps running: the blocks of a
leased transfer belong to a finished request, so nothing writes them until the lease is released.
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass, field

from kv_transfer.layout import KVCompat, KVLayout
from kv_transfer.leases import LeaseTable
from kv_transfer.transports.base import DataChannel, get_transport
from kv_transfer.transports.tcp import tune_socket
from kv_transfer.wire import TransferError, expect, recv_message, send_message

logger = logging.getLogger(__name__)


@dataclass
class ProducerStats:
    transfers: int = 0
    bytes_sent: int = 0
    data_channels: int = 0    # handshakes that opened a data channel
    refused_handshakes: int = 0
    missing_transfers: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **deltas: int) -> None:
        with self.lock:
            for key, value in deltas.items():
                setattr(self, key, getattr(self, key) + value)


class TransferServer:
    """Serves PULL and RELEASE for the leases in `leases`. `start()` returns the bound port."""

    def __init__(self, layout: KVLayout, compat: KVCompat, leases: LeaseTable, host: str, port: int,
                 grant_wait_s: float = 5.0, io_timeout_s: float = 30.0):
        self.layout, self.compat, self.leases = layout, compat, leases
        self._grant_wait_s = grant_wait_s
        self._io_timeout_s = io_timeout_s
        self._listener = socket.create_server((host, port), reuse_port=False)
        self._listener.settimeout(0.5)
        self.port = self._listener.getsockname()[1]
        self.stats = ProducerStats()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="pdserve-kv-server", daemon=True)

    def start(self) -> int:
        self._thread.start()
        return self.port

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=2)
        self._listener.close()

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except (socket.timeout, OSError):
                continue
            threading.Thread(target=self._serve_connection, args=(sock,), name="pdserve-kv-conn", daemon=True).start()

    def _serve_connection(self, sock: socket.socket) -> None:
        tune_socket(sock)
        sock.settimeout(self._io_timeout_s)
        channel = None
        try:
            channel = self._handshake(sock)
            while channel is not None and not self._stopping.is_set():
                self._serve_one(sock, channel, recv_message(sock))
        except (TransferError, OSError, ValueError) as error:
            logger.debug("KV consumer connection closed: %s", error)
        finally:
            if channel is not None:
                channel.close()
            sock.close()

    def _handshake(self, sock: socket.socket) -> DataChannel | None:
        hello = recv_message(sock)
        if hello["op"] == "RELEASE":  # a one-shot release (an abort) needs no data channel
            self._serve_one(sock, None, hello)
            return None
        expect(hello, "HELLO")
        mismatches = self.compat.mismatches(KVCompat.from_dict(hello["compat"]))
        if mismatches:
            self.stats.add(refused_handshakes=1)
            send_message(sock, {"op": "REFUSED", "error": "incompatible KV peer: " + "; ".join(mismatches)})
            return None
        transport = get_transport(hello["transport"])
        send_message(sock, {"op": "WELCOME"})
        self.stats.add(data_channels=1)
        return transport.producer_channel(sock, hello, self.layout.device)

    def _serve_one(self, sock: socket.socket, channel: DataChannel | None, message: dict) -> None:
        op = message["op"]
        if op == "RELEASE":
            found = self.leases.release(message["transfer_id"])
            send_message(sock, {"op": "RELEASED", "found": found})
        elif op == "PULL" and channel is not None:
            self._serve_pull(sock, channel, message)
        else:
            raise TransferError(f"unexpected control message {op}")

    def _serve_pull(self, sock: socket.socket, channel: DataChannel, message: dict) -> None:
        lease = self.leases.wait(message["transfer_id"], self._grant_wait_s)
        if lease is None:
            self.stats.add(missing_transfers=1)
            send_message(sock, {"op": "MISSING", "error": f"no KV held for transfer {message['transfer_id']} "
                                "(expired, released or never prefilled here)"})
            return
        wanted = list(message["block_ids"])
        if not set(wanted) <= set(lease.block_ids):
            send_message(sock, {"op": "MISSING", "error": "requested blocks are not part of the transfer"})
            return
        local = message.get("local_block_ids")  # the consumer's cut: both sides then cut alike
        views = self.layout.views(wanted, paired_with=local if local and len(local) == len(wanted) else None)
        num_bytes = self.layout.num_bytes(len(wanted))
        send_message(sock, {"op": "SENDING", "num_bytes": num_bytes})
        channel.send(views)
        self.stats.add(transfers=1, bytes_sent=num_bytes)
