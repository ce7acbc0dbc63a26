"""Producer-side KV held for consumers, keyed by pdserve's transfer id.

A prefilled request's blocks stay pinned in the prefill engine until one of three things happens:
the consumer confirms its pull (RELEASE), the request is aborted (RELEASE from the router), or the
lease expires because no consumer came. Whichever comes first releases the lease exactly once; the
engine learns about it through `take_released()` (vLLM's `finished_sending`) and frees the blocks.

A release can arrive before the grant (an abort racing the engine's metadata): it leaves a
tombstone, and the grant that follows is released on arrival, so no block is ever stranded.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Lease:
    transfer_id: str
    request_id: str            # vLLM's id inside the producer engine
    block_ids: tuple[int, ...]
    num_tokens: int
    expires_at_s: float        # time.monotonic() deadline


class LeaseTable:
    """Thread-safe: granted by the engine's worker thread, used by the transfer server's threads."""

    TOMBSTONE_S = 120.0

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._cond = threading.Condition()
        self._active: dict[str, Lease] = {}
        self._tombstones: dict[str, float] = {}
        self._released: set[str] = set()
        self.num_expired = 0

    def grant(self, lease: Lease) -> None:
        with self._cond:
            if self._tombstones.pop(lease.transfer_id, None) is not None:
                self._released.add(lease.request_id)
                return
            self._active[lease.transfer_id] = lease
            self._cond.notify_all()

    def wait(self, transfer_id: str, timeout_s: float) -> Lease | None:
        """The active lease for `transfer_id`, waiting up to `timeout_s` for its grant to arrive."""
        deadline = self._clock() + timeout_s
        with self._cond:
            while transfer_id not in self._active:
                remaining = deadline - self._clock()
                if remaining <= 0 or transfer_id in self._tombstones:
                    return None
                self._cond.wait(remaining)
            return self._active[transfer_id]

    def release(self, transfer_id: str) -> bool:
        """Releases the lease; True if it was active. Either way the id is tombstoned, so a late
        grant is released on arrival and a late pull is refused at once."""
        with self._cond:
            self._tombstones[transfer_id] = self._clock() + self.TOMBSTONE_S
            self._cond.notify_all()
            lease = self._active.pop(transfer_id, None)
            if lease is None:
                return False
            self._released.add(lease.request_id)
            return True

    def expire(self) -> list[Lease]:
        """Releases every lease past its deadline and forgets old tombstones."""
        now = self._clock()
        with self._cond:
            expired = [lease for lease in self._active.values() if lease.expires_at_s <= now]
            for lease in expired:
                del self._active[lease.transfer_id]
                self._released.add(lease.request_id)
            self.num_expired += len(expired)
            self._tombstones = {t: until for t, until in self._tombstones.items() if until > now}
            return expired

    def take_released(self) -> set[str]:
        """Request ids whose blocks may now be freed; each is returned once."""
        with self._cond:
            released, self._released = self._released, set()
            return released

    def __len__(self) -> int:
        with self._cond:
            return len(self._active)
