"""The producer's held leases, published in its shared-memory segment for consumers to read.

With `shm`, a consumer copies a transfer's blocks out of the producer's cache itself; what it
must know is that the copy read final blocks that nobody freed meanwhile. The producer's lease
table says so, and the COPIED round trip asks it (`kv_transfer.wire`). The board lets the consumer
read it instead, one-sided like an RDMA read of a remote validity word, so a pull costs the copy
and one message the consumer does not wait for.

Where: the unused end of the segment's header page (`BOARD_OFFSET` to `HEADER_BYTES`), which older
consumers never read. Layout, little-endian: a magic and the slot count, then `num_slots` slots of
40 bytes: `seq` (u32), pad, `key` (u64: the transfer id's hash, 0 = empty), `granted_ns` and
`expires_ns` (u64, `time.monotonic_ns()`: shared memory means one boot, one clock), and `checksum`
(u64: `kv_transfer.checksum.lease_checksum` of the lease's blocks, 0 = none taken).

Writer (the producer's `LeaseTable`, under its lock: one writer): `publish` when a lease is granted,
`retract` the moment it ends (released or expired), which is before its blocks are reported free.
Each write is a seqlock: `seq` odd while the slot changes, even and one higher after. A transfer
whose home slots (`PROBE` of them from its hash) are all taken is not published: its consumer asks
over the connection instead.

Reader (the consumer): `snapshot` before the copy, `still_holds` after it. The copy is good when the
slot held this transfer, granted no later than the copy began, unchanged (`seq` equal and even)
from before the copy to after it, and not past its deadline at the end: the lease was held, so the
blocks were final and pinned, throughout; and the checksum of what it copied equals the slot's
(read under the same seqlock, so it is this lease's), so the bytes are the ones granted. A reader never waits: anything else (a slot being
written, a retraction, a collision) is "ask the producer". The reads rely on loads not being
reordered with loads nor stores with stores (x86-64's memory model); `board_readable()` is False
elsewhere, and consumers there always ask.
"""

from __future__ import annotations

import hashlib
import platform
import struct
from dataclasses import dataclass

BOARD_OFFSET = 1024          # in the segment's header page; the header proper ends far before
BOARD_MAGIC = b"PDBOARD2"   # 2: slots carry the lease checksum; a PDBOARD1 reader asks instead
_BOARD_HEAD = struct.Struct("<8sI4x")
_SLOT = struct.Struct("<I4xQQQQ")   # seq, key, granted_ns, expires_ns, checksum
_SEQ = struct.Struct("<I")
PROBE = 4                    # slots a transfer may live in, from its hash on


def board_readable(machine: str | None = None) -> bool:
    """Whether this CPU's memory model makes the seqlock reads sound without fences (x86-64)."""
    return (machine or platform.machine()).lower() in ("x86_64", "amd64")


def transfer_key(transfer_id: str) -> int:
    """A transfer id's 64-bit key on the board (never 0, which marks an empty slot)."""
    return int.from_bytes(hashlib.blake2b(transfer_id.encode(), digest_size=8).digest(), "little") or 1


def lease_checksum(checksums) -> int:
    """One number for a lease's per-block checksums (`kv_transfer.checksum`) in their order, as a
    slot shows it; never 0, which on the board means "no checksum"."""
    value = 0xCBF29CE484222325
    for checksum in checksums:
        value = (value * 0x100000001B3 + int(checksum)) & 0xFFFFFFFFFFFFFFFF
    return value or 1


def num_slots(area_bytes: int) -> int:
    return (area_bytes - _BOARD_HEAD.size) // _SLOT.size


@dataclass(frozen=True)
class Vouch:
    """What a reader saw before its copy: where the lease was and its seqlock count then."""

    slot: int
    seq: int
    key: int
    checksum: int = 0   # the lease's checksum as the slot showed it (0: none; the consumer then asks)


class LeaseBoard:
    """The writer's side over `area` (a writable memoryview of the board's bytes)."""

    def __init__(self, area: memoryview):
        self._area = area
        self.num_slots = num_slots(len(area))
        if self.num_slots < PROBE:
            raise ValueError(f"a lease board needs room for {PROBE} slots, got {len(area)} bytes")
        _BOARD_HEAD.pack_into(area, 0, BOARD_MAGIC, self.num_slots)
        self._where: dict[str, int] = {}   # transfer id -> its slot, while published

    def publish(self, transfer_id: str, granted_ns: int, expires_ns: int, checksum: int = 0) -> bool:
        """Shows `transfer_id` held from `granted_ns` to `expires_ns`; False if its home slots are
        all taken (its consumer then asks the producer) or it is already shown."""
        if transfer_id in self._where:
            return False
        key = transfer_key(transfer_id)
        for slot in _home_slots(key, self.num_slots):
            seq, held, _, _, _ = _SLOT.unpack_from(self._area, self._offset(slot))
            if held == 0:
                self._write(slot, seq, key, granted_ns, expires_ns, checksum)
                self._where[transfer_id] = slot
                return True
        return False

    def retract(self, transfer_id: str) -> None:
        """`transfer_id` is held no more (call before its blocks can be freed); no-op if not shown."""
        slot = self._where.pop(transfer_id, None)
        if slot is not None:
            seq = _SEQ.unpack_from(self._area, self._offset(slot))[0]
            self._write(slot, seq, 0, 0, 0, 0)

    def _write(self, slot: int, seq: int, key: int, granted_ns: int, expires_ns: int, checksum: int) -> None:
        offset = self._offset(slot)
        _SEQ.pack_into(self._area, offset, (seq + 1) & 0xFFFFFFFF)              # odd: being written
        _SLOT.pack_into(self._area, offset, (seq + 1) & 0xFFFFFFFF, key, granted_ns, expires_ns, checksum)
        _SEQ.pack_into(self._area, offset, (seq + 2) & 0xFFFFFFFF)              # even: done

    def _offset(self, slot: int) -> int:
        return _BOARD_HEAD.size + slot * _SLOT.size


class BoardReader:
    """The consumer's side over `area` (a read-only memoryview of the producer's board); None from
    `open` when the area holds no board (an older producer) or this CPU cannot read it soundly."""

    def __init__(self, area: memoryview, slots: int):
        self._area, self.num_slots = area, slots

    @classmethod
    def open(cls, area: memoryview) -> BoardReader | None:
        if not board_readable() or len(area) < _BOARD_HEAD.size:
            return None
        magic, slots = _BOARD_HEAD.unpack_from(area, 0)
        if magic != BOARD_MAGIC or slots < PROBE or num_slots(len(area)) < slots:
            return None
        return cls(area, slots)

    def snapshot(self, transfer_id: str, copy_started_ns: int) -> Vouch | None:
        """Before the copy: the slot holding `transfer_id`, granted by `copy_started_ns`; None if
        the board cannot vouch (not shown, granted later, a slot being written)."""
        key = transfer_key(transfer_id)
        for slot in _home_slots(key, self.num_slots):
            seq, held, granted_ns, _, checksum = _SLOT.unpack_from(self._area, self._offset(slot))
            if held == key:
                if seq % 2 or granted_ns > copy_started_ns:
                    return None
                return Vouch(slot, seq, key, checksum)
        return None

    def still_holds(self, vouch: Vouch, now_ns: int) -> bool:
        """After the copy: the slot is unchanged since `snapshot` and its lease is not past its
        deadline at `now_ns`."""
        seq, held, _, expires_ns, _ = _SLOT.unpack_from(self._area, self._offset(vouch.slot))
        return seq == vouch.seq and held == vouch.key and now_ns < expires_ns

    def _offset(self, slot: int) -> int:
        return _BOARD_HEAD.size + slot * _SLOT.size


def _home_slots(key: int, slots: int) -> list[int]:
    return [(key + probe) % slots for probe in range(PROBE)]
