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
    assert table.expire() == [] and len(table) == 1
    clock.now = 105.0
    assert [lease.transfer_id for lease in table.expire()] == ["t1"]
    assert table.take_released() == {"r1"} and len(table) == 0 and table.num_expired == 1


def test_release_before_grant_frees_the_blocks_on_arrival():
    table = LeaseTable(Clock())
    assert table.release("t1") is False  # an abort racing the engine's metadata
    table.grant(_lease())
    assert len(table) == 0
    assert table.take_released() == {"r1"}


def test_wait_returns_granted_lease_and_refuses_released_at_once():
    table = LeaseTable()
    table.grant(_lease())
    assert table.wait("t1", timeout_s=0.01).block_ids == (4, 5)
    table.release("t1")
    assert table.wait("t1", timeout_s=5.0) is None  # tombstoned: no 5 s wait
    assert table.wait("never", timeout_s=0.01) is None
