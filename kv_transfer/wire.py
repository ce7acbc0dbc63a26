"""Framed control messages between a KV consumer and a producer: 4-byte length + JSON object.

Every message is a dict with an "op" key. The exchange on one connection:

    consumer -> HELLO {compat, transport, channel...}      producer -> WELCOME {} | REFUSED {error}
    consumer -> PULL {transfer_id, block_ids}              producer -> SENDING {num_bytes} + data | MISSING {error}
    consumer -> RELEASE {transfer_id}                      producer -> RELEASED {found}

Bulk bytes never go through this framing: they move over the connection's data channel.
"""

from __future__ import annotations

import json
import socket
import struct

_HEADER = struct.Struct("!I")
MAX_MESSAGE_BYTES = 16 << 20


class TransferError(RuntimeError):
    """A KV transfer failed: the peer refused, vanished or sent something unexpected."""


class IncompatiblePeer(TransferError):
    """The producer and the consumer disagree on model, dtype, block size or layout."""


def send_message(sock: socket.socket, message: dict) -> None:
    body = json.dumps(message, separators=(",", ":")).encode()
    sock.sendall(_HEADER.pack(len(body)) + body)


def recv_message(sock: socket.socket) -> dict:
    (length,) = _HEADER.unpack(recv_exactly(sock, _HEADER.size))
    if length > MAX_MESSAGE_BYTES:
        raise TransferError(f"control message of {length} bytes exceeds {MAX_MESSAGE_BYTES}")
    message = json.loads(recv_exactly(sock, length))
    if not isinstance(message, dict) or "op" not in message:
        raise TransferError(f"malformed control message: {message!r:.200}")
    return message


def expect(message: dict, op: str) -> dict:
    if message["op"] != op:
        raise TransferError(f"expected {op}, got {message['op']}: {message.get('error', '')}")
    return message


def recv_exactly(sock: socket.socket, num_bytes: int) -> bytes:
    buffer = bytearray(num_bytes)
    recv_into_exactly(sock, memoryview(buffer))
    return bytes(buffer)


def recv_into_exactly(sock: socket.socket, target: memoryview) -> None:
    received = 0
    while received < len(target):
        n = sock.recv_into(target[received:])
        if n == 0:
            raise TransferError("peer closed the connection")
        received += n
