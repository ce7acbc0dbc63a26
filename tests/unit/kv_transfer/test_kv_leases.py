"""LeaseTable: every way a lease ends, exactly once, and never while its blocks are being sent."""

import threading

import pytest

from kv_transfer.leases import Lease, LeaseTable


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _lease(transfer_id="t1", request_id="r1", expires_at_s=110.0):
    return Lease(transfer_id, request_id, (4, 5), 40, expires_at_s)


def test_release_by_consumer_frees_the_request_exactly_once():
    table = LeaseTable(Clock())
    table.grant(_lease())
    assert table.release("t1") is True
    assert table.take_released() == {"r1"}
    assert table.take_released() == set()
    assert table.release("t1") is False


def test_lease_expires_when_nobody_pulls():
    clock = Clock()
    table = LeaseTable(clock)
    table.grant(_lease(expires_at_s=105.0))
    assert table.expire() == [] and table.num_held == 1
    clock.now = 105.0
    assert [lease.transfer_id for lease in table.expire()] == ["t1"]
    assert table.take_released() == {"r1"} and table.num_held == 0 and table.num_expired == 1


def test_release_before_grant_frees_the_blocks_on_arrival():
    table = LeaseTable(Clock())
    assert table.release("t1") is False  # an abort racing the engine's metadata
    table.grant(_lease())
    assert table.num_held == 0
    assert table.take_released() == {"r1"}


def test_acquire_returns_the_granted_lease_and_refuses_a_released_one_at_once():
    table = LeaseTable()
    table.grant(_lease(expires_at_s=float("inf")))
    assert table.acquire("t1", timeout_s=0.01).block_ids == (4, 5)
    table.finish("t1")
    table.release("t1")
    assert table.acquire("t1", timeout_s=5.0) is None  # tombstoned: no 5 s wait
    assert table.acquire("never", timeout_s=0.01) is None


def test_release_during_a_send_frees_the_blocks_only_when_the_send_ends():
    table = LeaseTable(Clock())
    table.grant(_lease())
    assert table.acquire("t1", timeout_s=0) is not None
    assert table.release("t1") is True          # the abort is accepted ...
    assert table.take_released() == set()       # ... but the blocks stay while they are read
    assert table.acquire("t1", timeout_s=0) is None  # and nobody starts a new send
    assert table.num_held == 1
    table.finish("t1")
    assert table.take_released() == {"r1"} and table.num_held == 0
    assert table.release("t1") is False


def test_expiry_during_a_send_is_deferred_and_the_lease_is_never_served_again():
    clock = Clock()
    table = LeaseTable(clock)
    table.grant(_lease(expires_at_s=105.0))
    assert table.acquire("t1", timeout_s=0) is not None
    clock.now = 106.0
    assert [lease.transfer_id for lease in table.expire()] == ["t1"]
    assert table.take_released() == set() and table.num_expired == 1
    assert table.acquire("t1", timeout_s=0) is None
    table.finish("t1", release=True)            # a send that completes still ends it once
    assert table.take_released() == {"r1"}
    assert table.expire() == [] and table.num_expired == 1 and table.num_held == 0


def test_a_lease_past_its_deadline_is_never_served_even_before_expire_runs():
    clock = Clock()
    table = LeaseTable(clock)
    table.grant(_lease(expires_at_s=105.0))
    clock.now = 105.0
    assert table.acquire("t1", timeout_s=0) is None
    assert table.take_released() == {"r1"} and table.num_expired == 1


def test_finish_with_release_ends_the_lease_once_and_without_release_keeps_it():
    table = LeaseTable(Clock())
    table.grant(_lease())
    table.acquire("t1", timeout_s=0)
    table.finish("t1")                           # a failed send: the lease stays for a retry
    assert table.take_released() == set() and table.num_held == 1
    table.acquire("t1", timeout_s=0)
    table.finish("t1", release=True)
    assert table.take_released() == {"r1"} and table.num_held == 0
    with pytest.raises(RuntimeError, match="without a matching acquire"):
        table.finish("t1")


def test_a_second_grant_of_a_transfer_id_is_released_at_once():
    table = LeaseTable(Clock())
    table.grant(_lease(request_id="first"))
    table.grant(_lease(request_id="second"))
    assert table.take_released() == {"second"} and table.num_held == 1
    assert table.acquire("t1", timeout_s=0).request_id == "first"


def test_concurrent_sends_and_a_release_free_the_blocks_once_after_the_last_send():
    """8 threads pin and unpin one lease while the main thread releases it. Whenever the blocks
    are reported free, no send may be in progress, and they are reported exactly once."""
    table = LeaseTable()
    table.grant(_lease(expires_at_s=float("inf")))
    in_send = 0
    counter = threading.Lock()
    violations, served = [], []
    start = threading.Barrier(9)

    def sender():
        nonlocal in_send
        start.wait()
        for _ in range(300):
            if table.acquire("t1", timeout_s=0) is None:
                return
            with counter:
                in_send += 1
            served.append(1)
            with counter:
                in_send -= 1
            table.finish("t1")

    threads = [threading.Thread(target=sender) for _ in range(8)]
    for thread in threads:
        thread.start()
    start.wait()
    released = set()
    while not served:
        pass
    assert table.release("t1") is True
    while any(thread.is_alive() for thread in threads):
        taken = table.take_released()
        with counter:
            if taken and in_send:
                violations.append(in_send)
        released |= taken
    for thread in threads:
        thread.join(timeout=10)
    released |= table.take_released()
    assert violations == []
    assert released == {"r1"} and table.num_held == 0
    assert table.acquire("t1", timeout_s=0) is None


def test_the_same_grant_twice_is_one_grant_held_or_already_released():
    """The scheduler half's early grant and the step's grant of the same lease: the second is
    ignored, and never reports the blocks free while a consumer may still read them."""
    table = LeaseTable(Clock())
    table.grant(_lease())
    table.grant(_lease())                       # the step's copy while the lease is held
    assert table.num_held == 1 and table.take_released() == set()
    assert table.release("t1") is True and table.take_released() == {"r1"}
    table.grant(_lease())                       # the step's copy after the consumer released it
    assert table.num_held == 0 and table.take_released() == set()   # not reported free twice


def test_granted_by_holds_from_the_grant_on_and_ends_with_the_lease():
    clock = Clock()
    table = LeaseTable(clock)
    assert not table.granted_by("t1", 100.0)           # not granted yet
    clock.now = 101.0
    table.grant(_lease())
    assert not table.granted_by("t1", 100.5)           # a copy that began before the grant
    assert table.granted_by("t1", 101.0) and table.granted_by("t1", 150.0)
    table.release("t1")
    assert not table.granted_by("t1", 150.0)           # ended: nothing is vouched for
