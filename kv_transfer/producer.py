"""The producer's transfer server: lives in the prefill engine's worker process, next to the cache.

One thread accepts; one thread per consumer connection runs the exchanges of `kv_transfer.wire`.
A connection waits for its next message without a timeout (a decode worker keeps its connection
for its lifetime, however long it idles; TCP keepalive notices a peer that vanished); inside an
exchange every read and write has the I/O timeout.

Block bytes are read straight from the paged cache while the engine keeps running: a pull pins its
lease from PULL to DONE (`LeaseTable.acquire`/`finish`), so the engine cannot free and reuse the
blocks while they are being sent, whatever releases or expiries happen meanwhile.

Who gets served: a connection first passes the mutual authentication of `kv_transfer.auth` (keyed
by the cluster secret in `credentials`); a failure is logged, answered REFUSED and closed, and no
lease is looked at. Until then each read is bounded to `MAX_PREAUTH_MESSAGE_BYTES` and
`auth_timeout_s`, and at most `MAX_UNAUTHENTICATED_CONNECTIONS` strangers hold a thread at once
(more are closed on accept). A transfer is bound to the first consumer identity that pulls,
copies or releases it (`LeaseTable.claim`); anyone else but this worker itself is refused
(`kv_transfer.auth.authorize`) and the lease stays as it was.

Encryption: the handshake decides whether a connection is sealed (`kv_transfer.encryption`); a
sealed one is served through a `SealedSocket` from the HELLO on, so every exchange below and the
data channel's bytes are sealed without knowing it. A transport whose bytes a seal cannot cover
(torch) is refused when either end is set to `on`.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Sequence

from kv_transfer.auth import (AUTH_TIMEOUT_S, MAX_PREAUTH_MESSAGE_BYTES, AuthFailed, Credentials, Peer,
                              authenticate_consumer, authorize, process_credentials, refuse,
                              warn_if_unauthenticated)
from kv_transfer.checksum import block_checksums, supported, warm_up
from kv_transfer.faults import FaultPlan, injector
from kv_transfer.layout import KVCompat, KVLayout, LayoutError
from kv_transfer.grants import grant_from_message, token_matches
from kv_transfer.leases import Lease, LeaseTable
from kv_transfer.sealed_socket import SealBroken, seal
from kv_transfer.sockets import DEFAULT_CONGESTION, configure, set_io_timeout, wait_readable
from kv_transfer.threads import name_this_thread
from kv_transfer.transports.base import DataChannel, byte_ranges, get_transport
from kv_transfer.wire import DONE_OK, RECOPY, TransferError, encode, expect, require_field, recv_message, send_message

logger = logging.getLogger(__name__)

MAX_UNAUTHENTICATED_CONNECTIONS = 64   # connections still in the handshake; more are closed at once


@dataclass
class ProducerStats:
    connections: int = 0      # accepted consumer connections, one-shot releases included
    transfers: int = 0
    bytes_sent: int = 0
    data_channels: int = 0    # handshakes that opened a data channel
    mapped_channels: int = 0  # of those, one-sided (shm, cuda_ipc): the consumer copies, we send no KV byte
    sealed_channels: int = 0  # of those, on a sealed connection (kv_transfer.encryption)
    refused_handshakes: int = 0
    failed_authentications: int = 0   # connections closed because the peer did not prove the secret
    refused_uses: int = 0     # PULL/COPIED/RELEASE of a transfer bound to another consumer identity
    missing_transfers: int = 0
    early_grants: int = 0     # leases granted by the scheduler half directly (kv_transfer.grants)
    recopies: int = 0         # one-round-trip pulls whose copy began before the grant: copied again
    vouched_transfers: int = 0  # of `transfers`, shm pulls the lease board vouched for that asked for release
                                # (a notice, no reply; one without release never reaches us)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **deltas: int) -> None:
        with self.lock:
            for key, value in deltas.items():
                setattr(self, key, getattr(self, key) + value)


class TransferServer:
    """Serves PULL and RELEASE for the leases in `leases`. `start()` returns the bound port.

    `transports` are the ones a consumer may ask for (a worker serves its configured one; tools
    that measure both serve both). `io_timeout_s` bounds every wait inside an exchange, including
    the data channel's; `congestion` is the connections' TCP congestion control. `shared_cache` is
    what one-sided consumers read: a `SharedCache` (CPU cache in a segment) or a `CudaCache` (CUDA
    cache exported as IPC handles), None for neither. `credentials`: this worker's identity and the
    cluster secret (default: `kv_transfer.auth.process_credentials()`); `auth_timeout_s` bounds each
    read before a peer is authenticated.

    Checksums: on a CPU cache, every lease granted from now on takes its blocks' checksums at grant
    (`LeaseTable.attach_checksums`, `kv_transfer.checksum`), off every pull's path; SENDING and
    DONE_OK carry the pulled blocks' ones, the lease board their fold. `faults`: a `FaultPlan` for
    tests and chaos runs (its producer-side faults strike at the data channels' send points)."""

    def __init__(self, layout: KVLayout, compat: KVCompat, leases: LeaseTable, host: str, port: int,
                 grant_wait_s: float = 5.0, io_timeout_s: float = 30.0, transports: Sequence[str] = ("tcp", "torch"),
                 congestion: str = DEFAULT_CONGESTION, shared_cache=None, grant_token: str = "",
                 credentials: Credentials | None = None, auth_timeout_s: float = AUTH_TIMEOUT_S,
                 faults: FaultPlan | None = None):
        self.layout, self.compat, self.leases = layout, compat, leases
        if supported(layout):
            warm_up()
            leases.attach_checksums(partial(block_checksums, layout))
        self.faults = injector(faults, "producer")
        self.credentials = credentials or process_credentials()
        warn_if_unauthenticated(self.credentials, "KV producer")
        self._strangers = threading.BoundedSemaphore(MAX_UNAUTHENTICATED_CONNECTIONS)
        self._auth_timeout_s = min(auth_timeout_s, io_timeout_s)
        self._grant_wait_s = grant_wait_s
        self._io_timeout_s = io_timeout_s
        self._congestion = congestion
        self._grant_token = grant_token   # the scheduler half's early grants (kv_transfer.grants)
        self._transports = {name: get_transport(name, io_timeout_s, cache=shared_cache, device=layout.device,
                                                faults=self.faults)
                            for name in transports}
        self._listener = socket.create_server((host, port), reuse_port=False)
        self._listener.settimeout(0.5)
        self.port = self._listener.getsockname()[1]
        self.stats = ProducerStats()
        self._stopping = threading.Event()
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, name="pdserve-kv-server", daemon=True)

    @property
    def num_held_leases(self) -> int:
        """Transfers whose blocks this producer still pins (0: nothing pending on this side)."""
        return self.leases.num_held

    def start(self) -> int:
        self._thread.start()
        return self.port

    def stop(self) -> None:
        """Stops accepting and closes every consumer connection (their threads then end)."""
        self._stopping.set()
        _shutdown(self._listener)  # wakes the accept at once (Linux) instead of at its next poll
        self._thread.join(timeout=2)
        self._listener.close()
        with self._open_lock:
            connections = list(self._open)
        for sock in connections:
            _shutdown(sock)

    def _accept_loop(self) -> None:
        name_this_thread("pdserve-kv-srv")
        while not self._stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except (socket.timeout, OSError):
                continue
            self.stats.add(connections=1)
            if not self._strangers.acquire(blocking=False):
                logger.warning("closed a KV connection from %s: %d others are still in their handshake",
                               _address(sock), MAX_UNAUTHENTICATED_CONNECTIONS)
                sock.close()
                continue
            threading.Thread(target=self._serve_connection, args=(sock,), name="pdserve-kv-conn", daemon=True).start()

    def _serve_connection(self, sock: socket.socket) -> None:
        """Owns one of `_strangers` until the peer is authenticated (or gone)."""
        name_this_thread("pdserve-kv-conn")
        with self._open_lock:
            self._open.add(sock)
        channel, stranger = None, True
        try:
            configure(sock, self._auth_timeout_s, self._congestion)
            peer = self._admit(sock, recv_message(sock, MAX_PREAUTH_MESSAGE_BYTES))
            self._strangers.release()
            stranger = False
            set_io_timeout(sock, self._io_timeout_s)
            if peer is None:
                self._serve_grants(sock)
                return
            link = seal(sock, peer.keys, "producer", self._io_timeout_s)
            channel = self._handshake(link, peer)
            while channel is not None and not self._stopping.is_set():
                wait_readable(link)  # idle: no timeout
                self._serve_one(link, channel, recv_message(link), peer)
        except SealBroken as error:   # bytes altered on the way to us: worth an operator's look
            logger.warning("closed a KV connection from %s: %s", _address(sock), error)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as error:  # TransferError included
            logger.debug("KV consumer connection closed: %s", error)
        finally:
            if stranger:
                self._strangers.release()
            if channel is not None:
                channel.close()
            with self._open_lock:
                self._open.discard(sock)
            sock.close()

    def _admit(self, sock: socket.socket, first: dict) -> Peer | None:
        """The consumer behind an AUTH, proven (`kv_transfer.auth`), or None for our own scheduler
        half's GRANT_HELLO with the right token; AuthFailed, logged, for anyone else."""
        try:
            if first["op"] == "GRANT_HELLO":
                if not token_matches(first.get("token"), self._grant_token):
                    raise AuthFailed("a GRANT_HELLO with a wrong token")
                return None
            if first["op"] != "AUTH":
                refuse(sock, "authenticate first: AUTH (an older pdserve?)")
                raise AuthFailed(f"expected AUTH, got {first['op']!r:.40}")
            return authenticate_consumer(sock, self.credentials, self.compat.model_fingerprint, first)
        except TransferError as error:   # logged, then counted: whoever sees the count finds the line
            logger.warning("refused a KV connection from %s: %s", _address(sock), error)
            self.stats.add(failed_authentications=1, refused_handshakes=1)
            raise AuthFailed(str(error)) from None

    def _handshake(self, sock: socket.socket, peer: Peer) -> DataChannel | None:
        """After authentication: HELLO and the data channel, or a one-shot RELEASE (None)."""
        hello = recv_message(sock)
        if hello["op"] == "RELEASE":  # a one-shot release (an abort) needs no data channel
            self._serve_one(sock, None, hello, peer)
            return None
        expect(hello, "HELLO")
        refusal = self._refusal(hello, peer)
        if refusal:
            self.stats.add(refused_handshakes=1)
            send_message(sock, {"op": "REFUSED", "error": refusal})
            return None
        transport = self._transports[hello["transport"]]
        welcome = {"op": "WELCOME", **transport.welcome_fields(hello)}
        send_message(sock, welcome)
        self.stats.add(data_channels=1, sealed_channels=int(peer.keys is not None))
        logger.info("KV consumer %r connected over %s (%s)", peer.identity, hello["transport"],
                    "encrypted" if peer.keys is not None else "in clear")
        channel = transport.producer_channel(sock, hello, self.layout.device, welcome)
        if channel.kind == "mapped":
            self.stats.add(mapped_channels=1)
        return channel

    def _serve_grants(self, sock: socket.socket) -> None:
        """The scheduler half's early grants (`kv_transfer.grants`), until it closes the connection
        (its GRANT_HELLO carried the engine's token: only the engine that pins the blocks grants)."""
        while not self._stopping.is_set():
            wait_readable(sock)
            grant = grant_from_message(expect(recv_message(sock), "GRANT"))
            self.leases.grant(Lease(grant.transfer_id, grant.request_id, grant.block_ids, grant.num_tokens,
                                    time.monotonic() + grant.lease_s))
            self.stats.add(early_grants=1)

    def _refusal(self, hello: dict, peer: Peer) -> str:
        """Why this consumer may not pull from us ("" if it may)."""
        problems = []
        compat = hello.get("compat")
        if isinstance(compat, dict) and compat.get("model_fingerprint") != peer.fingerprint:
            problems.append("the HELLO's model fingerprint is not the one the consumer authenticated with")
        if hello.get("transport") not in self._transports:
            problems.append(f"transport: {sorted(self._transports)} at the producer vs "
                            f"{hello.get('transport')!r} at the consumer")
        else:
            problems += [why for why in [self._transports[hello["transport"]].refusal(hello)] if why]
            if not self._transports[hello["transport"]].sealable and "on" in (peer.encryption,
                                                                              self.credentials.encryption):
                problems.append(f"kv_encryption=on, but the {hello['transport']} transport's KV bytes travel over "
                                "gloo/NCCL, which pdserve cannot encrypt: use the tcp transport")
        problems += self.compat.mismatches(compat if isinstance(compat, dict) else {})
        return "incompatible KV peer: " + "; ".join(problems) if problems else ""

    def _serve_one(self, sock: socket.socket, channel: DataChannel | None, message: dict, peer: Peer) -> None:
        op = message["op"]
        if op == "RELEASE":
            transfer_id = require_field(message, "transfer_id", str)
            if not self._may_use(transfer_id, peer, op):
                send_message(sock, {"op": "REFUSED", "error": _not_yours(transfer_id)})
                return
            send_message(sock, {"op": "RELEASED", "found": self.leases.release(transfer_id)})
        elif op == "PULL" and channel is not None:
            self._serve_pull(sock, channel, message, peer)
        elif op == "COPIED" and channel is not None and channel.one_round_trip:
            self._serve_copied(sock, channel, message, peer)
        else:
            raise TransferError(f"unexpected control message {op}")

    def _may_use(self, transfer_id: str, peer: Peer, op: str) -> bool:
        """Binds an unbound transfer to `peer` (this worker's own identity binds nothing) and says
        whether `peer` may use it; a refusal is logged and counted, the lease left as it was."""
        owner = self.credentials.identity
        bound_to = None if peer.identity == owner else self.leases.claim(transfer_id, peer.identity)
        if authorize(bound_to, peer.identity, owner):
            return True
        self.stats.add(refused_uses=1)
        logger.warning("refused %s of KV transfer %s by %r: it is bound to consumer %r", op, transfer_id,
                       peer.identity, bound_to)
        return False

    def _serve_pull(self, sock: socket.socket, channel: DataChannel, message: dict, peer: Peer) -> None:
        """SENDING + the blocks, then DONE from the consumer; the lease stays pinned throughout
        and is released at DONE when the PULL asked for it."""
        transfer_id = require_field(message, "transfer_id", str)
        wanted = require_field(message, "block_ids", list)
        local = message.get("local_block_ids")
        lease = self.leases.acquire(transfer_id, self._grant_wait_s)
        if lease is None:
            self.stats.add(missing_transfers=1)
            send_message(sock, {"op": "MISSING", "error": f"no KV held for transfer {transfer_id} "
                                "(expired, released or never prefilled here)"})
            return
        if not self._may_use(transfer_id, peer, "PULL"):
            self.leases.finish(transfer_id)
            send_message(sock, {"op": "MISSING", "error": _not_yours(transfer_id)})
            return
        finished = False
        try:
            ranges = self._ranges(lease.block_ids, wanted, local, channel)
            if isinstance(ranges, str):
                send_message(sock, {"op": "MISSING", "error": ranges})
                return
            num_bytes = self.layout.num_bytes(len(wanted))
            channel.send(encode({"op": "SENDING", "num_bytes": num_bytes, **_checksums(lease, wanted)}), ranges)
            expect(recv_message(sock), "DONE")
            self.stats.add(transfers=1, bytes_sent=num_bytes)
            # The consumer has its bytes: the send ends (and the lease, if asked) before DONE_OK, so a
            # consumer that has DONE_OK knows the release is done.
            finished = True
            self.leases.finish(transfer_id, release=message.get("release") is True)
            if channel.kind == "mapped":  # the pin held for the whole copy: say so
                sock.sendall(DONE_OK)
        finally:
            if not finished:
                self.leases.finish(transfer_id)

    def _serve_copied(self, sock: socket.socket, channel: DataChannel, message: dict, peer: Peer) -> None:
        """The one-round-trip pull (`kv_transfer.wire`): the consumer has copied already. DONE_OK if
        the lease was granted before the copy began and is held now: the blocks were final and, a
        lease being never served again once it ends, never freed during the copy. RECOPY, then
        DONE_OK after the second copy (made under the pin), if it was granted during the copy;
        MISSING if there is none. DONE_OK carries the blocks' checksums, which the consumer checks its
        copy against."""
        transfer_id = require_field(message, "transfer_id", str)
        wanted = require_field(message, "block_ids", list)
        copy_started_s = require_field(message, "copy_started_s", float)
        if message.get("vouched") is True:  # the board showed the lease held throughout: a notice, no reply
            if not self._may_use(transfer_id, peer, "COPIED"):
                return
            self.stats.add(transfers=1, vouched_transfers=1, bytes_sent=self.layout.num_bytes(len(wanted)))
            released = message.get("release") is True and self.leases.release(transfer_id)
            logger.debug("vouched pull of %s (released: %s)", transfer_id, released)
            return
        channel.begin_transfer(sock)   # a producer-side fault (tests only) strikes here
        lease = self.leases.acquire(transfer_id, self._grant_wait_s)
        finished = lease is None
        try:
            if lease is not None and not self._may_use(transfer_id, peer, "COPIED"):
                send_message(sock, {"op": "MISSING", "error": _not_yours(transfer_id)})
                return
            if lease is None or not set(wanted) <= set(lease.block_ids):
                self.stats.add(missing_transfers=1)
                send_message(sock, {"op": "MISSING", "error": f"no KV held for transfer {transfer_id} "
                                    "(expired, released or never prefilled here)" if lease is None
                                    else "requested blocks are not part of the transfer"})
                return
            if not self.leases.granted_by(transfer_id, copy_started_s):
                self.stats.add(recopies=1)
                sock.sendall(RECOPY)
                expect(recv_message(sock), "DONE")
            done_ok = encode({"op": "DONE_OK", **_checksums(lease, wanted)}) if lease.checksums else DONE_OK
            self.stats.add(transfers=1, bytes_sent=self.layout.num_bytes(len(wanted)))
            finished = True  # released (if asked) before DONE_OK, as in `_serve_pull`
            self.leases.finish(transfer_id, release=message.get("release") is True)
            sock.sendall(done_ok)
        finally:
            if not finished:
                self.leases.finish(transfer_id)

    def _ranges(self, leased: Sequence[int], wanted: list, local, channel: DataChannel) -> list | str:
        """The byte ranges of `wanted`, cut as the consumer cuts `local`; or why they cannot be sent."""
        if not set(wanted) <= set(leased):
            return "requested blocks are not part of the transfer"
        paired = local if isinstance(local, list) and len(local) == len(wanted) else None
        try:
            return byte_ranges(channel, self.layout, self.layout.runs(wanted, paired))
        except LayoutError as error:
            return f"bad PULL: {error}"


def _checksums(lease: Lease, wanted: list) -> dict:
    """The `checksums` field of the pulled blocks (none when the lease took none: a CUDA cache)."""
    checksums = lease.checksums_of(wanted)
    return {} if checksums is None else {"checksums": checksums}


def _not_yours(transfer_id: str) -> str:
    return f"KV transfer {transfer_id} is bound to another consumer"


def _address(sock: socket.socket) -> str:
    """The peer's host:port for a log line ("?" once the socket is gone)."""
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"


def _shutdown(sock: socket.socket) -> None:
    """Wakes a thread blocked on `sock`; the socket may already be closed by its thread."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError as error:
        logger.debug("KV connection already closed: %s", error)
