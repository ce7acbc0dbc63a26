"""Producer-side KV held for consumers, keyed by pdserve's transfer id.

A prefilled request's blocks stay pinned in the prefill engine until one of three things happens:
the consumer confirms its pull (DONE of a PULL that asked for release, or a RELEASE), the request
is aborted (RELEASE from the router), or the lease expires because no consumer came. Whichever
comes first ends the lease exactly once; the engine learns about it through `take_released()`
(vLLM's `finished_sending`) and frees the blocks, which it may then hand to another request.

Sends pin a lease: `acquire()` counts a send in progress and `finish()` ends it. While a lease has
sends in progress, a release or an expiry only marks it: the lease is refused to new pulls at once,
and its blocks are reported free when the last send finishes, so no byte is ever read from a block
the engine has reused. A lease past its deadline is never served, even before `expire()` runs.

A release can arrive before the grant (an abort racing the engine's metadata): it leaves a
tombstone, and the grant that follows is released on arrival, so no block is ever stranded.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Literal, Sequence

from kv_transfer.lease_board import lease_checksum

logger = logging.getLogger(__name__)

Ending = Literal["released", "expired"]


@dataclass(frozen=True)
class Lease:
    transfer_id: str
    request_id: str            # vLLM's id inside the producer engine
    block_ids: tuple[int, ...]
    num_tokens: int
    expires_at_s: float        # time.monotonic() deadline
    checksums: tuple[int, ...] = ()   # per block, as `block_ids` (kv_transfer.checksum); () = none taken

    def checksums_of(self, block_ids: Sequence[int]) -> list[int] | None:
        """The checksums of `block_ids` (a subset of this lease's, any order); None without checksums."""
        if not self.checksums:
            return None
        by_id = dict(zip(self.block_ids, self.checksums))
        return [by_id[block_id] for block_id in block_ids]


@dataclass
class _Held:
    lease: Lease
    granted_at_s: float = 0.0        # this table's clock when the grant arrived (the blocks were final)
    sending: int = 0                 # sends in progress: the blocks must stay
    ending: Ending | None = None     # set once: refused to new pulls, freed when `sending` is 0
    consumer: str | None = None      # the consumer identity it is bound to (`claim`); None: nobody yet


class LeaseTable:
    """Thread-safe: granted and expired by the engine's worker thread, used by the transfer server's."""

    TOMBSTONE_S = 120.0

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._board = None   # a `kv_transfer.lease_board.LeaseBoard`: leases shown to shm consumers
        self._checksummer: Callable[[Sequence[int]], list[int]] | None = None
        self._cond = threading.Condition()
        self._held: dict[str, _Held] = {}
        self._tombstones: dict[str, float] = {}
        self._released: set[str] = set()
        self._granted: dict[tuple[str, str], float] = {}   # (transfer id, request id) -> forget after
        self.num_expired = 0

    def attach_board(self, board) -> None:
        """From now on, show every held lease on `board` (a `LeaseBoard` in the producer's shared
        segment) from its grant until it ends; needs the real monotonic clock (the board's times are
        `time.monotonic_ns()`, which consumers compare with theirs)."""
        with self._cond:
            self._board = board
            for held in self._held.values():
                if held.ending is None:
                    self._show(held)

    def attach_checksums(self, checksummer: Callable[[Sequence[int]], list[int]]) -> None:
        """From now on every grant takes its blocks' checksums (`checksummer(block_ids)`) before the
        lease is held, so every pull and the board see them; the first checksummer attached stays
        (two servers over one table serve the same bytes)."""
        with self._cond:
            if self._checksummer is None:
                self._checksummer = checksummer

    def grant(self, lease: Lease) -> None:
        """Holds `lease`. The same grant twice (the scheduler half's early grant, then the step's:
        same transfer and request id) is one grant: the second is ignored, whether the first is
        still held or already ended. Released on arrival when its id was released before any grant
        (an abort that raced the prefill), or when another request's lease holds the same transfer
        id (a duplicate id must not strand the blocks of either)."""
        with self._cond:
            if (lease.transfer_id, lease.request_id) in self._granted:
                return
            checksummer = self._checksummer
        if checksummer is not None and not lease.checksums:
            # Outside the lock (a pass over the blocks' bytes): they are final, the prefill wrote them.
            lease = replace(lease, checksums=tuple(checksummer(lease.block_ids)))
        with self._cond:
            key = (lease.transfer_id, lease.request_id)
            if key in self._granted:
                return
            self._granted[key] = self._clock() + self.TOMBSTONE_S
            if self._tombstones.pop(lease.transfer_id, None) is not None:
                self._released.add(lease.request_id)
                return
            if lease.transfer_id in self._held:
                logger.warning("KV transfer id %s granted twice; releasing the second grant (request %s)",
                               lease.transfer_id, lease.request_id)
                self._released.add(lease.request_id)
                return
            held = self._held[lease.transfer_id] = _Held(lease, granted_at_s=self._clock())
            if self._board is not None:
                self._show(held)
            self._cond.notify_all()

    def acquire(self, transfer_id: str, timeout_s: float) -> Lease | None:
        """The lease for `transfer_id`, pinned for one send, waiting up to `timeout_s` for its grant.

        None if it was released, expired (deadline passed, even if `expire()` has not run) or never
        granted in time. A non-None result must be paired with exactly one `finish()`."""
        deadline = self._clock() + timeout_s
        with self._cond:
            while transfer_id not in self._held:
                remaining = deadline - self._clock()
                if remaining <= 0 or transfer_id in self._tombstones:
                    return None
                self._cond.wait(remaining)
            held = self._held[transfer_id]
            if held.ending is None and held.lease.expires_at_s <= self._clock():
                self._end(held, "expired")
            if held.ending is not None:
                return None
            held.sending += 1
            return held.lease

    def granted_by(self, transfer_id: str, at_s: float) -> bool:
        """True if `transfer_id`'s lease is held and was granted at or before `at_s` (this table's
        clock). A consumer that began copying at `at_s` and holds the pin now (`acquire`) read
        blocks that were final and pinned for its whole copy: the grant comes after the prefill
        wrote them, and a lease, once ended, is never served again."""
        with self._cond:
            held = self._held.get(transfer_id)
            return held is not None and held.granted_at_s <= at_s

    def claim(self, transfer_id: str, consumer: str) -> str | None:
        """Binds `transfer_id`'s lease to `consumer` unless it is bound already; returns whom it is
        bound to now (None when no lease is held under that id). Atomic: of two consumers racing
        for an unbound lease exactly one gets it. A binding lasts as long as the lease."""
        with self._cond:
            held = self._held.get(transfer_id)
            if held is None:
                return None
            if held.consumer is None:
                held.consumer = consumer
            return held.consumer

    def consumer_of(self, transfer_id: str) -> str | None:
        """Whom the held lease `transfer_id` is bound to (None: nobody yet, or no such lease)."""
        with self._cond:
            held = self._held.get(transfer_id)
            return held.consumer if held is not None else None

    def finish(self, transfer_id: str, release: bool = False) -> None:
        """Ends one send of `acquire()`; with `release`, the consumer has its bytes and the lease
        ends now. A release or expiry that came during the send takes effect here."""
        with self._cond:
            held = self._held.get(transfer_id)
            if held is None or held.sending <= 0:
                raise RuntimeError(f"finish({transfer_id!r}) without a matching acquire")
            held.sending -= 1
            if release and held.ending is None:
                self._end(held, "released")
            elif held.ending is not None and held.sending == 0:
                self._drop(held)

    def release(self, transfer_id: str) -> bool:
        """Releases the lease (once its sends finish); True if it was held and not already ending.
        Either way the id is tombstoned, so a late grant is released on arrival and a late pull is
        refused at once."""
        with self._cond:
            self._tombstones[transfer_id] = self._clock() + self.TOMBSTONE_S
            self._cond.notify_all()
            held = self._held.get(transfer_id)
            if held is None or held.ending is not None:
                return False
            self._end(held, "released")
            return True

    def expire(self) -> list[Lease]:
        """Ends every lease past its deadline (the ones being sent when their sends finish) and
        forgets old tombstones. Returns the leases that expired in this call."""
        now = self._clock()
        with self._cond:
            expired = [held for held in self._held.values() if held.ending is None and held.lease.expires_at_s <= now]
            for held in expired:
                self._end(held, "expired")
            self._tombstones = {t: until for t, until in self._tombstones.items() if until > now}
            self._granted = {key: until for key, until in self._granted.items() if until > now}
            return [held.lease for held in expired]

    def take_released(self) -> set[str]:
        """Request ids whose blocks may now be freed; each is returned once, never while a send
        of its blocks is in progress."""
        with self._cond:
            released, self._released = self._released, set()
            return released

    @property
    def num_held(self) -> int:
        """Leases whose blocks are still pinned (including ones ending once their sends finish)."""
        with self._cond:
            return len(self._held)

    def __len__(self) -> int:
        return self.num_held

    def _show(self, held: _Held) -> None:
        """Publishes `held` on the board, its times widened by a microsecond against rounding (a
        consumer must never see it granted earlier, or expiring later, than it is)."""
        self._board.publish(held.lease.transfer_id, int(held.granted_at_s * 1e9) + 1_000,
                            int(held.lease.expires_at_s * 1e9) - 1_000,
                            lease_checksum(held.lease.checksums) if held.lease.checksums else 0)

    def _end(self, held: _Held, ending: Ending) -> None:
        """Marks `held` ending (caller holds the lock); frees it now if no send is in progress.
        Off the board first: no consumer may count on the blocks from here on."""
        if self._board is not None:
            self._board.retract(held.lease.transfer_id)
        held.ending = ending
        if ending == "expired":
            self.num_expired += 1
        self._tombstones[held.lease.transfer_id] = self._clock() + self.TOMBSTONE_S
        if held.sending == 0:
            self._drop(held)

    def _drop(self, held: _Held) -> None:
        del self._held[held.lease.transfer_id]
        self._released.add(held.lease.request_id)
