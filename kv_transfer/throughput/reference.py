"""The raw ways of moving the same bytes pdserve moves: the references its transports are held to.

Each way is a request followed by the bytes. The producer's side serves requests until its peer
goes away (sockets) or asks for 0 bytes (gloo); the consumer's side times one request from the
request to the last byte written. Both sides move slices of one payload buffer: one contiguous
piece, or `parts` equal pieces spread over the buffer as a prompt's layers are over a cache
(`split`), so the parts of a request land where they came from.
"""

from __future__ import annotations

import ctypes
import logging
import socket
import struct
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from kv_transfer.sockets import recv_into_exactly, recvmsg_into_all, sendmsg_all, tune_bulk
from kv_transfer.wire import TransferError

logger = logging.getLogger(__name__)

PAYLOAD_SEED = 3
_REQUEST = struct.Struct("!QQ")  # (nbytes, parts)
_TIMEOUT = timedelta(seconds=60)


def payload(max_bytes: int) -> torch.Tensor:
    """The bytes the raw ways move (and memcpy copies): the same in every process."""
    generator = torch.Generator().manual_seed(PAYLOAD_SEED)
    return torch.empty(max_bytes, dtype=torch.uint8).random_(0, 256, generator=generator)


def split(buffer: torch.Tensor, nbytes: int, parts: int) -> list[torch.Tensor]:
    """`parts` equal parts of `nbytes`, spread over `buffer` as layers are over a cache."""
    part, stride = nbytes // parts, buffer.numel() // parts
    return [buffer[i * stride: i * stride + part] for i in range(parts)]


def tune_raw(sock: socket.socket, tuned: bool) -> socket.socket:
    """Tuned: the settings pdserve gives its own sockets (`kv_transfer.sockets.tune_bulk`: no Nagle,
    congestion control), so the raw way differs only in having no protocol around the bytes.
    Otherwise the host's defaults, with TCP_NODELAY."""
    if tuned:
        tune_bulk(sock)
    else:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def gloo_group(store: dist.Store, rank: int) -> dist.ProcessGroup:
    """A two-rank ProcessGroupGloo on loopback; rank 0 is the producer."""
    options = dist.ProcessGroupGloo._Options()
    options._timeout = _TIMEOUT
    options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return dist.ProcessGroupGloo(dist.PrefixStore("raw", store), rank, 2, options)


# ---- producer side ----------------------------------------------------------------------------
def serve_raw_socket(listener: socket.socket, source: torch.Tensor, tuned: bool) -> None:
    """Accepts one peer and answers its requests until it goes away: one sendall of the first
    `nbytes` (parts 1), or one sendmsg of `parts` spread parts."""
    sock, _ = listener.accept()
    tune_raw(sock, tuned)
    contiguous = memoryview(source.numpy()).cast("B")
    header = bytearray(_REQUEST.size)
    with sock:
        while True:
            try:
                recv_into_exactly(sock, memoryview(header))
            except (TransferError, OSError):
                return  # the consumer is done
            nbytes, parts = _REQUEST.unpack(header)
            if parts == 1:
                sock.sendall(contiguous[:nbytes])
            else:
                sendmsg_all(sock, [memoryview(p.numpy()) for p in split(source, nbytes, parts)], 60.0)


def serve_raw_gloo(store: dist.Store, source: torch.Tensor) -> None:
    """Answers (nbytes, messages) requests with `messages` sends splitting nbytes, posted at once,
    until a request for 0 bytes, or until none came for the group's timeout (a run whose methods
    include no raw gloo way: `stop_raw_gloo` then finds nobody, which it tolerates)."""
    group = gloo_group(store, rank=0)
    request = torch.zeros(2, dtype=torch.int64)
    while True:
        try:
            group.recv([request], 1, 0).wait()
        except RuntimeError:   # gloo's timeout: nobody asked for that long
            return
        nbytes, messages = (int(v) for v in request)
        if nbytes == 0:
            return
        for work in [group.send([part], 1, 1 + tag) for tag, part in enumerate(split(source, nbytes, messages))]:
            work.wait()


# ---- consumer side: each returns the seconds from the request to the last byte -----------------
def receive_raw_socket(sock: socket.socket, target: torch.Tensor, nbytes: int, parts: int) -> float:
    started = time.perf_counter()
    sock.sendall(_REQUEST.pack(nbytes, parts))
    if parts == 1:
        recv_into_exactly(sock, memoryview(target.numpy()).cast("B")[:nbytes])
    else:
        recvmsg_into_all(sock, [memoryview(p.numpy()) for p in split(target, nbytes, parts)])
    return time.perf_counter() - started


def receive_raw_gloo(group: dist.ProcessGroup, target: torch.Tensor, nbytes: int, messages: int) -> float:
    """All receives posted at once, then waited for in order: the naive way with gloo."""
    started = time.perf_counter()
    group.send([torch.tensor([nbytes, messages], dtype=torch.int64)], 0, 0).wait()
    for work in [group.recv([part], 0, 1 + tag) for tag, part in enumerate(split(target, nbytes, messages))]:
        work.wait()
    return time.perf_counter() - started


def stop_raw_gloo(group: dist.ProcessGroup) -> None:
    """Ends `serve_raw_gloo`, unless it ended on its own (then its side of the pair is closed)."""
    try:
        group.send([torch.zeros(2, dtype=torch.int64)], 0, 0).wait()
    except RuntimeError as error:
        logger.info("the raw gloo server had stopped already: %s", str(error)[:200])


def memcpy(target: torch.Tensor, source: torch.Tensor, nbytes: int) -> float:
    """ctypes.memmove inside one process: the shared-memory bound."""
    started = time.perf_counter()
    ctypes.memmove(target.data_ptr(), source.data_ptr(), nbytes)
    return time.perf_counter() - started
