"""Framed control messages between a KV consumer and a producer: 4-byte length + JSON object.

Every message is a dict with a string "op" key, at most `MAX_MESSAGE_BYTES` framed (the length is
checked before anything is allocated; a producer reads a stranger's messages with the far smaller
bound of `kv_transfer.auth`). JSON only: nothing read from the network is unpickled or evaluated.
The exchanges on one connection, after the mutual authentication of `kv_transfer.auth`
(AUTH -> CHALLENGE -> PROOF, keyed by the cluster secret; PROOF goes out with HELLO or RELEASE):

    consumer -> HELLO {compat, transport, channel...}   producer -> WELCOME {channel...} | REFUSED {error}
    consumer -> CHANNEL {kind, proof}  (shm/auto: which channel it opened; shm and cuda_ipc prove
                                        the memory they mapped; kind torch brings the NCCL store)
                                                        producer -> CHANNEL_OK {kind}  (the one it accepted)
    consumer -> PULL {transfer_id, block_ids, local_block_ids, release}
                                                        producer -> SENDING {num_bytes, checksums} + data | MISSING {error}
    consumer -> READY {}       (torch transport: its receives are posted; the producer then sends)
    consumer -> DONE {}        (after the last byte landed; only after SENDING)
                                                        producer -> DONE_OK {}  (mapped: the pin held throughout)

`checksums` (SENDING, and DONE_OK after COPIED) are the pulled blocks' `kv_transfer.checksum`s in
`block_ids` order, taken when the lease was granted (absent for a CUDA cache, which the handshake's
`checksum` field says). The consumer verifies its bytes against them after the exchange: a mismatch
fails exactly those blocks (`ChecksumMismatch`), the connection stays in step.
    consumer -> RELEASE {transfer_id}                   producer -> RELEASED {found}

One round trip over shared memory (WELCOME offered `one_round_trip`): the consumer copies without
asking, then asks whether the copy is good.

    consumer -> (its copy) COPIED {transfer_id, block_ids, local_block_ids, release, copy_started_s}
                                                        producer -> DONE_OK | MISSING {error} | RECOPY {}
    after RECOPY (the lease was granted after the copy began; it is pinned now): the consumer
    copies again -> DONE                                producer -> DONE_OK

When the producer's lease board (`kv_transfer.lease_board`) showed the lease held from before the
copy to after it, COPIED carries `vouched: true` and gets no reply: the consumer has its blocks,
and the producer only releases the lease (if asked); the board's slot also shows the fold of the
lease's block checksums, which the copy's must match (else the consumer asks). Otherwise:

`copy_started_s` is the consumer's `time.monotonic()` before the copy: shared memory means one
kernel boot, so both sides read the same clock. The producer answers DONE_OK only when its lease
was granted by then and is held now (`LeaseTable.granted_by`): the blocks were final when the copy
began, and a lease that ended is never served again, so they were not freed during it.

The producer keeps a transfer's blocks pinned from PULL until DONE (or until the exchange fails),
and releases the lease at DONE when the PULL asked for it (`release`): the usual pull costs no
separate RELEASE round trip. A RELEASE right after the PROOF (instead of HELLO) is a one-shot
release (abort paths) that needs no data channel. PULL, COPIED and RELEASE name a transfer the
producer binds to the first consumer identity that uses it: another identity's PULL is answered
MISSING and its RELEASE REFUSED, the lease untouched (`kv_transfer.auth.authorize`). Bulk bytes never go through this framing: they move over
the connection's data channel (see `kv_transfer.transports`).
"""

from __future__ import annotations

import json
import socket
import struct

from kv_transfer.errors import IncompatiblePeer, PeerClosed, TransferError, TransferTimeout
from kv_transfer.sockets import recv_into_exactly

_HEADER = struct.Struct("!I")
MAX_MESSAGE_BYTES = 16 << 20


def encode(message: dict) -> bytes:
    """The framed bytes of `message`, for callers that send them together with other data."""
    body = json.dumps(message, separators=(",", ":")).encode()
    return _HEADER.pack(len(body)) + body


def send_message(sock: socket.socket, message: dict | bytes) -> None:
    """Sends `message` (or its pre-`encode`d frame, e.g. `DONE`) on `sock`."""
    try:
        sock.sendall(message if isinstance(message, bytes) else encode(message))
    except BlockingIOError as error:
        raise TransferTimeout("peer did not read a control message for the socket timeout") from error


# The fixed messages of every pull, framed once (a pull's control path runs with cold caches).
DONE = encode({"op": "DONE"})
READY = encode({"op": "READY"})
DONE_OK = encode({"op": "DONE_OK"})
RECOPY = encode({"op": "RECOPY"})


def recv_message(sock: socket.socket, max_bytes: int = MAX_MESSAGE_BYTES) -> dict:
    """The next message, at most `max_bytes` long (checked before its buffer is allocated: a longer
    one is a `TransferError`, and the caller drops the connection). `PeerClosed.received == 0`
    means the peer closed before sending any of it."""
    header = bytearray(_HEADER.size)
    recv_into_exactly(sock, memoryview(header))
    (length,) = _HEADER.unpack(header)
    if length > max_bytes:
        raise TransferError(f"control message of {length} bytes exceeds {max_bytes}")
    body = bytearray(length)
    try:
        recv_into_exactly(sock, memoryview(body))
    except PeerClosed as error:
        raise PeerClosed(str(error), _HEADER.size + error.received) from error
    try:
        message = json.loads(body)
    except (ValueError, RecursionError) as error:  # RecursionError: nested deeper than the parser goes
        raise TransferError(f"control message is not JSON: {error!s:.200}") from None
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise TransferError(f"malformed control message: {message!r:.200}")
    return message


def expect(message: dict, op: str) -> dict:
    if message["op"] != op:
        raise TransferError(f"expected {op}, got {message['op']}: {message.get('error', '')}")
    return message


def require_field(message: dict, name: str, kind: type):
    """`message[name]`, checked to be a `kind`: a malformed message is a `TransferError`, not a crash."""
    value = message.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise TransferError(f"{message.get('op')} message has no valid {name!r}: {value!r:.100}")
    return value


__all__ = ["DONE", "DONE_OK", "READY", "RECOPY", "IncompatiblePeer", "PeerClosed", "TransferError", "TransferTimeout", "encode",
           "expect", "require_field", "recv_message", "send_message"]
