"""A KV connection's bytes after the handshake, sealed with AES-256-GCM: what `kv_transfer.wire`,
the transports and `kv_transfer.sockets` send and read, in records, as an `ssl.SSLSocket` wraps a
socket.

A record on the wire:

    length   4 bytes, big endian: the ciphertext's length, tag included (at most `MAX_RECORD_BYTES` + 16)
    sealed   AES-256-GCM(key, nonce, plaintext, associated data = length), tag appended

The nonce is 4 zero bytes and a 64-bit big-endian count of the records sent in that direction, so
it never repeats under one key, and a record dropped, replayed or moved fails its tag like an
altered one. Every `REKEY_AFTER_BYTES` of plaintext a direction steps to its next key
(`kv_transfer.encryption.next_key`) and restarts its count, well inside AES-GCM's usage limits;
both ends count alike, so no message is needed.

A record's length is checked before anything is allocated for it; its ciphertext goes into one
buffer kept per connection. A record that fails its tag raises `SealBroken` and nothing of it is
kept where a control message is read; KV bytes are opened straight into the cache blocks they are
meant for (no staging copy), so a failed record leaves those blocks holding garbage: the pull fails,
and the consumer treats them as it treats any failed pull (vLLM recomputes; they are never loaded).
The connection is unusable after a `SealBroken` or a timeout inside a record; callers drop it.

Sends are whole: `sendmsg` and `sendall` return once every record is written (the kernel's send
timeout bounds each wait). Reads return what one record holds, as `recv_into` may return less than
asked: `kv_transfer.sockets` and `kv_transfer.wire` loop as they do on a plain socket. A record is
cut at every buffer a sender passes, so a receiver whose buffers are cut alike (`KVLayout`'s runs)
opens each record straight into its buffer.
"""

from __future__ import annotations

import socket
import struct
from typing import Literal, Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from kv_transfer.encryption import SessionKeys, next_key
from kv_transfer.errors import PeerClosed, TransferError
from kv_transfer.sockets import recv_into_exactly, sendmsg_all

MAX_RECORD_BYTES = 1 << 20          # plaintext per record; the reader's buffer is this plus the tag
TAG_BYTES = 16
REKEY_AFTER_BYTES = 1 << 34         # 16 GiB per key and direction (2^30 AES blocks)
_LENGTH = struct.Struct("!I")
_NONCE_PREFIX = bytes(4)
_PASSED_THROUGH = frozenset({"fileno", "close", "shutdown", "setsockopt", "getsockopt", "getpeername", "getsockname",
                             "settimeout", "gettimeout", "setblocking", "detach"})


class SealBroken(TransferError):
    """A record failed its authentication tag (altered, dropped, replayed or reordered on the way, or
    sealed with another key) or announced an impossible length."""


class _Direction:
    """One direction's key, record count and bytes under the key."""

    def __init__(self, key: bytes, rekey_after_bytes: int):
        self._aead, self._key = AESGCM(key), key
        self._count = 0
        self._bytes = 0
        self._rekey_after_bytes = rekey_after_bytes

    def nonce(self, num_bytes: int) -> tuple[AESGCM, bytes]:
        """The cipher and nonce of the next record of `num_bytes` plaintext bytes."""
        if self._bytes >= self._rekey_after_bytes:
            self._key = next_key(self._key)
            self._aead, self._count, self._bytes = AESGCM(self._key), 0, 0
        nonce = _NONCE_PREFIX + self._count.to_bytes(8, "big")
        self._count += 1
        self._bytes += num_bytes
        return self._aead, nonce


class SealedSocket:
    """`raw` (connected, after the handshake) with every byte sealed. Offers the socket calls the KV
    plane makes (`sendall`, `sendmsg`, `recv_into`, `recvmsg_into`, `recv`) and passes the others
    that carry no data through; any other data call is an AttributeError, never a bypass."""

    def __init__(self, raw: socket.socket, keys: SessionKeys, role: Literal["producer", "consumer"],
                 timeout_s: float, rekey_after_bytes: int = REKEY_AFTER_BYTES):
        send_key, receive_key = keys.for_role(role)
        self.raw = raw
        self._timeout_s = timeout_s
        self._out = _Direction(send_key, rekey_after_bytes)
        self._in = _Direction(receive_key, rekey_after_bytes)
        # Kept per connection, grown to the largest record seen (at most MAX_RECORD_BYTES + TAG_BYTES):
        self._sealed = bytearray()     # the record being sent
        self._opened = bytearray()     # a record opened but not all read yet
        self._received = bytearray()   # the record being read
        self._pending = memoryview(b"")   # the rest of `_opened`, not yet read
        self._header = b""                 # the header of the record in `_received`

    @property
    def pending_bytes(self) -> int:
        """Bytes opened and not yet read: a reader must not wait on the raw socket while there are any."""
        return len(self._pending)

    def __getattr__(self, name: str):
        if name in _PASSED_THROUGH:
            return getattr(self.raw, name)
        raise AttributeError(f"a sealed KV connection has no {name!r}: only calls that seal or open records")

    def __enter__(self) -> "SealedSocket":
        return self

    def __exit__(self, *exc) -> None:
        self.raw.close()

    # ---- sending --------------------------------------------------------------------------------
    def sendall(self, data: bytes) -> None:
        self.sendmsg([memoryview(data)])

    def send_after(self, clear: bytes, data: bytes) -> None:
        """`clear` as it is (the handshake's PROOF), then `data` sealed, in one send."""
        self._send_records([memoryview(data)], prefix=clear)

    def sendmsg(self, buffers: Sequence, ancdata=(), flags: int = 0, address=None) -> int:
        """Seals and sends every byte of `buffers`; returns their total (all of it is sent). `flags`
        do not apply (every send is whole); ancillary data cannot be sealed and is refused."""
        if ancdata:
            raise ValueError("a sealed KV connection carries no ancillary data")
        views = [memoryview(b).cast("B") for b in buffers]
        self._send_records(views)
        return sum(len(v) for v in views)

    def _send_records(self, views: list[memoryview], prefix: bytes = b"") -> None:
        first = prefix
        for view in views:
            for start in range(0, len(view), MAX_RECORD_BYTES):
                chunk = view[start:start + MAX_RECORD_BYTES]
                header = _LENGTH.pack(len(chunk) + TAG_BYTES)
                aead, nonce = self._out.nonce(len(chunk))
                self._sealed = _at_least(self._sealed, len(chunk) + TAG_BYTES)
                sealed = memoryview(self._sealed)[:len(chunk) + TAG_BYTES]
                aead.encrypt_into(nonce, chunk, header, sealed)
                sendmsg_all(self.raw, [memoryview(first + header), sealed], self._timeout_s)
                first = b""
        if first:
            self.raw.sendall(first)

    # ---- reading --------------------------------------------------------------------------------
    def recv_into(self, buffer, nbytes: int = 0, flags: int = 0) -> int:
        target = memoryview(buffer).cast("B")
        return self._read([target[:nbytes] if nbytes else target])

    def recvmsg_into(self, buffers: Sequence, ancbufsize: int = 0, flags: int = 0):
        return self._read([memoryview(b).cast("B") for b in buffers]), [], 0, None

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        if flags & socket.MSG_PEEK:   # whether anything (or EOF) waits: the raw socket knows
            return self.raw.recv(bufsize, flags)
        target = bytearray(bufsize)
        return bytes(target[:self.recv_into(target)])

    def _read(self, targets: list[memoryview]) -> int:
        """Fills `targets` in order from the record opened last, or else from the next one; the
        bytes written (0: the peer closed between records)."""
        targets = [t for t in targets if len(t)]
        if not targets:
            return 0
        if not self._pending:
            size = self._next_record_size()
            if size == 0:
                return 0
            if len(targets[0]) >= size:   # the usual KV case: the record is this buffer's next bytes
                self._open(size, targets[0][:size])
                return size
            self._opened = _at_least(self._opened, size)
            self._open(size, memoryview(self._opened)[:size])
            self._pending = memoryview(self._opened)[:size]
        written = 0
        for target in targets:
            n = min(len(target), len(self._pending))
            target[:n] = self._pending[:n]
            self._pending, written = self._pending[n:], written + n
            if not self._pending:
                break
        return written

    def _next_record_size(self) -> int:
        """Reads the next record's header and ciphertext; its plaintext size (0: a clean EOF)."""
        header = bytearray(_LENGTH.size)
        try:
            recv_into_exactly(self.raw, memoryview(header))
        except PeerClosed as closed:
            if closed.received == 0:
                return 0
            raise
        (length,) = _LENGTH.unpack(header)
        if not TAG_BYTES < length <= MAX_RECORD_BYTES + TAG_BYTES:   # a sender never seals an empty record
            raise SealBroken(f"a sealed KV record announced {length} bytes ({TAG_BYTES + 1} to "
                             f"{MAX_RECORD_BYTES + TAG_BYTES})")
        self._header = bytes(header)
        self._received = _at_least(self._received, length)
        recv_into_exactly(self.raw, memoryview(self._received)[:length])
        return length - TAG_BYTES

    def _open(self, size: int, target: memoryview) -> None:
        aead, nonce = self._in.nonce(size)
        try:
            aead.decrypt_into(nonce, memoryview(self._received)[:size + TAG_BYTES], self._header, target)
        except InvalidTag:
            raise SealBroken("a sealed KV record failed its authentication tag: altered on the way (or sealed "
                             "with another key); the connection is dropped and nothing it carried is used") from None


def _at_least(buffer: bytearray, size: int) -> bytearray:
    """`buffer`, or a larger one in its place (never resized: views of the old one stay valid)."""
    return buffer if len(buffer) >= size else bytearray(max(size, min(2 * len(buffer), MAX_RECORD_BYTES + TAG_BYTES)))


def seal(sock: socket.socket, keys: SessionKeys | None, role: Literal["producer", "consumer"],
         timeout_s: float) -> socket.socket | SealedSocket:
    """`sock` sealed with `keys`, or `sock` itself when the session is in clear (`keys` None)."""
    return sock if keys is None else SealedSocket(sock, keys, role, timeout_s)


def send_after_proof(sock: socket.socket | SealedSocket, proof: bytes, message: bytes) -> None:
    """The handshake's PROOF frame (always in clear) and the first framed `message` after it (sealed
    on a sealed session), in one send."""
    if isinstance(sock, SealedSocket):
        sock.send_after(proof, message)
    else:
        sock.sendall(proof + message)


__all__ = ["MAX_RECORD_BYTES", "REKEY_AFTER_BYTES", "SealBroken", "SealedSocket", "seal", "send_after_proof"]
