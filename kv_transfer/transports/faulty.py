"""How the transports act out an injected fault (`kv_transfer.faults`) at their send and receive
points. Only reached when a test or a chaos run switched a `FaultPlan` on; each function ends the
way the real failure would, within the transport's timeout.
"""

from __future__ import annotations

import logging
import select
import socket
import time
from typing import Sequence

import torch

from kv_transfer.faults import Fault
from kv_transfer.sockets import recvmsg_into_all, sendmsg_all
from kv_transfer.wire import TransferError

logger = logging.getLogger(__name__)


def split_at(buffers: Sequence[memoryview], fraction: float) -> tuple[list[memoryview], list[memoryview]]:
    """`buffers` cut at `fraction` of their bytes (at least one byte in each half when there are
    two or more bytes): the bytes before and after, in order."""
    total = sum(len(b) for b in buffers)
    cut = min(max(int(total * fraction), 1), max(total - 1, 1))
    before, after, seen = [], [], 0
    for buffer in buffers:
        if seen + len(buffer) <= cut:
            before.append(buffer)
        elif seen >= cut:
            after.append(buffer)
        else:
            before.append(buffer[: cut - seen])
            after.append(buffer[cut - seen:])
        seen += len(buffer)
    return before, after


def producer_send(sock: socket.socket, header: bytes, ranges: Sequence[memoryview], fault: Fault,
                  timeout_s: float) -> None:
    """The producer's side of `fault` while sending a transfer; always raises `TransferError`."""
    if fault.kind == "drop_connection_mid_block":
        before, _ = split_at(list(ranges), fault.fraction) if ranges else ([], [])
        sendmsg_all(sock, [memoryview(header), *before], timeout_s)
        drop(sock)
        raise TransferError(f"fault injected: connection dropped after {sum(len(b) for b in before)} bytes")
    producer_answer(sock, header, fault, timeout_s)


def producer_answer(sock: socket.socket, reply: bytes, fault: Fault, timeout_s: float) -> None:
    """The producer's side of `fault` where it would answer (`reply`); always raises `TransferError`.
    A drop closes at once; a silent producer waits up to `timeout_s` for the consumer to give up."""
    if fault.kind == "drop_connection_mid_block":
        drop(sock)
        raise TransferError("fault injected: connection dropped instead of the reply")
    if fault.kind == "producer_silent":
        wait_for_peer_to_close(sock, timeout_s)
        raise TransferError("fault injected: the producer never answered")
    if reply:
        sock.sendall(reply)  # a consumer-side fault has nothing to do here


def consumer_recv(sock: socket.socket, ranges: Sequence[memoryview], fault: Fault) -> None:
    """The consumer's side of `fault` while receiving into `ranges`: a stall halfway, or the bytes
    received and then one of them flipped (before any checksum is taken over them)."""
    if fault.kind == "stall_reader":
        before, after = split_at(list(ranges), fault.fraction)
        recvmsg_into_all(sock, before)
        logger.warning("fault injected: the KV consumer stops reading for %.1f s", fault.stall_s)
        time.sleep(fault.stall_s)
        recvmsg_into_all(sock, after)
        return
    recvmsg_into_all(sock, list(ranges))
    if fault.kind == "flip_bytes":
        flip(ranges, fault.fraction)


def flip(buffers: Sequence[memoryview], fraction: float) -> None:
    """Inverts one byte of `buffers`, at `fraction` of their bytes."""
    _, after = split_at(list(buffers), fraction)
    if after:
        after[0][0] ^= 0xFF
        logger.warning("fault injected: flipped a received KV byte")


def flip_tensors(tensors: Sequence[torch.Tensor], fraction: float) -> None:
    """Inverts one byte of `tensors` (byte views, on any device), at `fraction` of their bytes."""
    total = sum(tensor.numel() for tensor in tensors)
    at = min(int(total * fraction), total - 1)
    for tensor in tensors:
        if at < tensor.numel():
            tensor.view(-1)[at:at + 1].bitwise_xor_(0xFF)   # a view: the byte flips in place
            logger.warning("fault injected: flipped a received KV byte")
            return
        at -= tensor.numel()


def drop(sock: socket.socket) -> None:
    """Closes the connection under whoever uses it (reset, not an orderly close)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.shutdown(socket.SHUT_RDWR)
    except OSError as error:
        logger.debug("dropping an already closed KV connection: %s", error)


def wait_for_peer_to_close(sock: socket.socket, timeout_s: float) -> None:
    """Reads and discards until the peer closes, or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while (remaining := deadline - time.monotonic()) > 0:
        if not select.select([sock], [], [], remaining)[0]:
            return
        try:
            if not sock.recv(65536):
                return
        except OSError:
            return
