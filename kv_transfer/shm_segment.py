"""A producer's paged KV cache in a named shared-memory segment, and a consumer's read-only map of it.

The `shm` transport is one-sided: a consumer on the same host copies a transfer's blocks straight
out of the producer's cache, and the producer's CPU only keeps the lease (PULL pins the blocks,
DONE unpins them). For that the producer's cache must *be* shared memory from the start: vLLM
allocates the whole cache as one int8 buffer (`vllm.v1.worker.utils.allocate_kv_cache`), inside
the allocation context the connector returns from `get_mem_pool_context`; `SegmentAllocation` is
that context, and it hands vLLM a tensor over the segment instead of fresh memory.

A segment is `/dev/shm/pdserve-kv-<uid>-<random>`: created 0600 and exclusively, owned by the
engine's model-runner process, which holds an exclusive `flock` on it while it lives. The first
page is a header (magic, version, a random token, the data size, this boot's id); the cache
follows. The owner unlinks it when the engine shuts down; a segment whose owner died without that
(SIGKILL) has no lock holder, and `sweep_stale` removes it at the next start of any producer.

A consumer maps a segment read-only (`map_segment`): it checks the file is a regular file of its
own uid, mode 0600 and the advertised size, and proves to the producer that it reached the same
memory by hashing the token it read there (`proof`), so a path that names another segment (another
container's /dev/shm on the same kernel) falls back instead of reading the wrong bytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import mmap
import os
import secrets
import stat
import struct
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SEGMENT_DIR = Path("/dev/shm")
PREFIX = "pdserve-kv-"
NEW_PREFIX = "pdserve-kv-new-"   # a segment being made, before its owner's lock is held
UNFINISHED_AGE_S = 60.0          # an unfinished one this old lost its maker mid-way
HEADER_BYTES = 4096
MAGIC = b"PDSERVEKV\x01"
_HEADER = struct.Struct("<10s32sQ36s")   # magic, token, data bytes, boot id


class SegmentError(RuntimeError):
    """A segment could not be created, found or trusted; the caller falls back or fails cleanly."""


def boot_id() -> str:
    """This kernel's boot id: equal on two processes only if they run on one host (one boot)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def proof(token: bytes) -> str:
    """What a consumer sends back to show it read `token` through the mapping."""
    return hashlib.sha256(b"pdserve-kv-segment:" + token).hexdigest()


class Segment:
    """The producer's segment. `tensor` is the cache's backing buffer (int8, `size` bytes, zeros)."""

    def __init__(self, size: int, folder: Path = SEGMENT_DIR):
        if size <= 0:
            raise SegmentError(f"a KV segment needs a positive size, not {size}")
        self.size = size
        self.token = secrets.token_bytes(32)
        name = f"{os.getuid()}-{secrets.token_hex(8)}"
        self.path = Path(folder) / f"{PREFIX}{name}"
        # Made under a name the sweep never looks at, locked, then renamed: a segment is never
        # visible to another producer's sweep before its lock is held.
        self._path_being_made = Path(folder) / f"{NEW_PREFIX}{name}"
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            self._fd = os.open(self._path_being_made, flags, 0o600)
        except OSError as error:
            raise SegmentError(f"cannot create {self._path_being_made}: {error}") from error
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held while this process lives
            os.rename(self._path_being_made, self.path)
            os.ftruncate(self._fd, HEADER_BYTES + size)
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(self._fd, 0, HEADER_BYTES + size)  # ENOSPC now, not SIGBUS later
            self._map = mmap.mmap(self._fd, HEADER_BYTES + size, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as error:
            self._close_fd_and_unlink()
            raise SegmentError(f"cannot size {self.path} to {HEADER_BYTES + size} bytes (is /dev/shm large "
                               f"enough? containers: --shm-size or a Memory emptyDir): {error}") from error
        self._map[:_HEADER.size] = _HEADER.pack(MAGIC, self.token, size, boot_id().encode().ljust(36)[:36])
        self._data = memoryview(self._map)[HEADER_BYTES:HEADER_BYTES + size]
        self.tensor = torch.frombuffer(self._data, dtype=torch.int8)
        self.closed = False

    @property
    def base_address(self) -> int:
        return self.tensor.data_ptr()

    def board_area(self) -> memoryview:
        """The header page's unused end, where the producer publishes its leases
        (`kv_transfer.lease_board`), writable."""
        from kv_transfer.lease_board import BOARD_OFFSET

        return memoryview(self._map)[BOARD_OFFSET:HEADER_BYTES]

    def close(self) -> None:
        """Unlinks the segment. Mappings stay valid until their holders drop them (the consumers'
        maps, and the engine's cache until the process ends), so this is safe at any time."""
        if self.closed:
            return
        self.closed = True
        self._close_fd_and_unlink()

    def _close_fd_and_unlink(self) -> None:
        for path in (self.path, self._path_being_made):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        with contextlib.suppress(OSError):
            os.close(self._fd)


@dataclass
class MappedSegment:
    """A consumer's read-only map of a producer's segment. `data` spans the cache bytes."""

    path: str
    size: int
    token: bytes
    data: memoryview
    _map: mmap.mmap
    _board: memoryview | None = None

    def board_area(self) -> memoryview:
        """The producer's lease board (`kv_transfer.lease_board`), read-only; released by `close`."""
        from kv_transfer.lease_board import BOARD_OFFSET

        if self._board is None:
            self._board = memoryview(self._map)[BOARD_OFFSET:HEADER_BYTES]
        return self._board

    def tensor(self, dtype: torch.dtype) -> torch.Tensor:
        """The cache bytes as a flat tensor of `dtype`. Read-only memory: writing through it kills
        the process (SIGSEGV); only ever copy out of it."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "The given buffer is not writable"
            return torch.frombuffer(self.data, dtype=dtype)

    def close(self) -> None:
        """Unmaps. The caller must hold no view in use: a tensor made by `tensor()` keeps only a
        reference to `data`, not the mapping, and reading it after this faults (the consumer closes
        a channel only under its connection's lock, never during a copy)."""
        self.data.release()
        if self._board is not None:
            self._board.release()
        with contextlib.suppress(BufferError):  # a memoryview of it is still exported: unmapped at its GC
            self._map.close()


def map_segment(path: str, size: int) -> MappedSegment:
    """Maps the producer's segment at `path` read-only after checking it is ours to read: a regular
    file (no symlink), owned by this uid, mode 0600, `HEADER_BYTES + size` long, with pdserve's
    header. Raises SegmentError saying which check failed."""
    if not Path(path).name.startswith(PREFIX) or Path(path).parent != SEGMENT_DIR:
        raise SegmentError(f"{path} is not a pdserve KV segment path")
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as error:
        raise SegmentError(f"cannot open {path}: {error}") from error
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) != 0o600:
            raise SegmentError(f"{path} is not a 0600 file of uid {os.getuid()}")
        if info.st_size != HEADER_BYTES + size:
            raise SegmentError(f"{path} holds {info.st_size} bytes, not {HEADER_BYTES + size}")
        mapping = mmap.mmap(fd, HEADER_BYTES + size, mmap.MAP_SHARED, mmap.PROT_READ)
    except OSError as error:
        raise SegmentError(f"cannot map {path}: {error}") from error
    finally:
        os.close(fd)
    magic, token, data_size, _ = _HEADER.unpack(mapping[:_HEADER.size])
    if magic != MAGIC or data_size != size:
        mapping.close()
        raise SegmentError(f"{path} has no pdserve KV header for {size} bytes")
    return MappedSegment(path, size, token, memoryview(mapping)[HEADER_BYTES:HEADER_BYTES + size], mapping)


def sweep_stale(folder: Path = SEGMENT_DIR) -> list[str]:
    """Removes this uid's segments whose owner is gone (nobody holds their lock), and unfinished
    ones a crash left behind; their names."""
    removed = []
    for path in Path(folder).glob(f"{NEW_PREFIX}{os.getuid()}-*"):
        with contextlib.suppress(OSError):
            if os.stat(path).st_mtime < time.time() - UNFINISHED_AGE_S:
                os.unlink(path)
                removed.append(path.name)
    for path in Path(folder).glob(f"{PREFIX}{os.getuid()}-*"):
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its engine is alive
        finally:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed.append(path.name)
    if removed:
        logger.info("removed %d KV segments of engines that died: %s", len(removed), removed)
    return removed


class SegmentAllocation(torch.overrides.TorchFunctionMode):
    """The allocation context for vLLM's KV cache (`KVConnectorBase_V1.get_mem_pool_context`): the
    one `torch.zeros(size, dtype=int8)` on the CPU of exactly the cache's size is answered with a
    segment of that size (fresh shared memory is zeros). Anything else runs as usual. `segment` is
    None until the cache was allocated, and stays None if vLLM allocated otherwise or the segment
    could not be made (too small a /dev/shm: the cache then goes to private memory, as without us)."""

    def __init__(self, size: int, folder: Path = SEGMENT_DIR):
        super().__init__()
        self.size, self.folder = size, folder
        self.segment: Segment | None = None
        self.tried = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.zeros and not self.tried and self._is_the_cache(args, kwargs):
            self.tried = True
            sweep_stale(self.folder)
            try:
                self.segment = Segment(self.size, self.folder)
            except SegmentError as error:  # e.g. a container's small /dev/shm: private memory, tcp
                logger.warning("the KV cache stays in private memory, consumers read it over tcp: %s", error)
                return func(*args, **kwargs)
            logger.info("the KV cache lives in %s (%d MiB, one-sided reads by same-host consumers)",
                        self.segment.path, self.size >> 20)
            return self.segment.tensor
        return func(*args, **kwargs)

    def _is_the_cache(self, args, kwargs) -> bool:
        shape = args[0] if len(args) == 1 and not isinstance(args[0], int) else args
        numel = shape[0] if isinstance(shape, (tuple, list, torch.Size)) and len(shape) == 1 else None
        device = torch.device(kwargs.get("device") or "cpu")
        return numel == self.size and kwargs.get("dtype") == torch.int8 and device.type == "cpu"
