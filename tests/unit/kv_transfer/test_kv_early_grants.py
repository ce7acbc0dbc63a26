"""The scheduler half grants a lease straight to its transfer server (kv_transfer.grants), so a
consumer's PULL does not wait for the next engine step; a wrong token grants nothing."""

import time

import pytest
import torch

from kv_transfer.consumer import PullClient
from kv_transfer.grants import EarlyGranter, grant_from_message, grant_message
from kv_transfer.layout import KVLayout
from kv_transfer.leases import LeaseTable
from kv_transfer.records import LeaseGrant
from kv_transfer.producer import TransferServer

TOKEN = "0123456789abcdef"


def _layout(fill: float) -> KVLayout:
    return KVLayout({f"layer.{i}": torch.full((16, 2, 32, 64), fill, dtype=torch.bfloat16) for i in range(2)}, 16)


@pytest.fixture
def producer():
    layout, leases = _layout(7.0), LeaseTable()
    server = TransferServer(layout, layout.compat("m", 32), leases, "127.0.0.1", 0, transports=("tcp",),
                            grant_token=TOKEN)
    address = f"127.0.0.1:{server.start()}"
    yield server, leases, address
    server.stop()


def _wait_held(leases: LeaseTable, count: int) -> None:
    deadline = time.monotonic() + 5
    while leases.num_held < count:
        assert time.monotonic() < deadline, "the early grant never arrived"
        time.sleep(0.005)


def test_an_early_grant_lets_a_consumer_pull_without_the_engines_step(producer):
    server, leases, address = producer
    granter = EarlyGranter(address, TOKEN)
    assert granter.send(LeaseGrant("t1", "r1", (3, 4), 64, 30.0)) is True
    _wait_held(leases, 1)
    caches = {f"layer.{i}": torch.zeros(16, 2, 32, 64, dtype=torch.bfloat16) for i in range(2)}
    consumer = KVLayout(caches, 16)
    client = PullClient(consumer, consumer.compat("m", 32), "tcp", timeout_s=5)
    assert client.pull(address, "t1", [3, 4], [8, 9], release=True).num_blocks == 2
    assert all(bool((cache[8:10] == 7.0).all()) and bool((cache[:8] == 0).all()) for cache in caches.values())
    released, deadline = set(), time.monotonic() + 5
    while not released and time.monotonic() < deadline:   # tcp: the producer reads DONE after we return
        released |= leases.take_released()
        time.sleep(0.005)
    assert server.stats.early_grants == 1 and released == {"r1"}
    client.close()
    granter.close()


def test_a_grant_with_a_wrong_token_or_none_grants_nothing(producer):
    server, leases, address = producer
    assert EarlyGranter(address, "").send(LeaseGrant("t1", "r1", (3,), 32, 30.0)) is False  # off
    wrong = EarlyGranter(address, "not-the-token")
    wrong.send(LeaseGrant("t2", "r2", (3,), 32, 30.0))
    deadline = time.monotonic() + 2
    while server.stats.refused_handshakes == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.stats.refused_handshakes == 1 and leases.num_held == 0 and server.stats.early_grants == 0
    wrong.close()


def test_a_grant_message_round_trips_and_a_bad_one_is_refused():
    grant = LeaseGrant("t1", "r1", (3, 4), 64, 30.0)
    assert grant_from_message(grant_message(grant)) == grant
    with pytest.raises(ValueError, match="a bad GRANT"):
        grant_from_message({"op": "GRANT", "transfer_id": "t1"})
    with pytest.raises(ValueError, match="block ids and a positive lease"):
        grant_from_message(grant_message(LeaseGrant("t1", "r1", (), 0, 30.0)))
