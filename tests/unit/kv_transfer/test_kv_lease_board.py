"""The lease board on plain memory: what the producer publishes, what a consumer may count on, and
every way the board declines to vouch (the consumer then asks the producer)."""

import pytest

from kv_transfer.lease_board import (PROBE, BoardReader, LeaseBoard, Vouch, board_readable, num_slots, transfer_key)
from kv_transfer.leases import Lease, LeaseTable

AREA_BYTES = 3072


def _board():
    area = memoryview(bytearray(AREA_BYTES))
    return LeaseBoard(area), BoardReader.open(area)


def test_a_lease_shown_before_the_copy_and_unchanged_after_it_is_vouched_for():
    board, reader = _board()
    assert board.publish("t1", granted_ns=1_000, expires_ns=9_000)
    vouch = reader.snapshot("t1", copy_started_ns=2_000)
    assert isinstance(vouch, Vouch) and vouch.seq % 2 == 0
    assert reader.still_holds(vouch, now_ns=3_000)


def test_the_board_declines_a_lease_granted_after_the_copy_began_or_never_shown():
    board, reader = _board()
    board.publish("t1", granted_ns=5_000, expires_ns=9_000)
    assert reader.snapshot("t1", copy_started_ns=4_999) is None
    assert reader.snapshot("other", copy_started_ns=6_000) is None


def test_a_retraction_or_a_new_lease_in_the_slot_during_the_copy_breaks_the_vouch():
    board, reader = _board()
    board.publish("t1", 1_000, 9_000)
    vouch = reader.snapshot("t1", 2_000)
    board.retract("t1")
    assert not reader.still_holds(vouch, 3_000)
    board.publish("t1", 1_000, 9_000)   # shown again (a new grant under the same id): a new seq
    assert not reader.still_holds(vouch, 3_000)


def test_a_lease_past_its_deadline_when_the_copy_ends_is_not_vouched_for():
    board, reader = _board()
    board.publish("t1", 1_000, 9_000)
    vouch = reader.snapshot("t1", 2_000)
    assert not reader.still_holds(vouch, now_ns=9_000)


def test_a_slot_being_written_is_never_vouched_for():
    board, reader = _board()
    board.publish("t1", 1_000, 9_000)
    vouch = reader.snapshot("t1", 2_000)
    area = board._area
    offset = 16 + vouch.slot * 40   # a slot: seq, key, granted, expires, checksum
    area[offset:offset + 4] = (vouch.seq + 1).to_bytes(4, "little")   # the writer's first store, alone
    assert reader.snapshot("t1", 2_000) is None and not reader.still_holds(vouch, 3_000)


def test_a_transfer_whose_home_slots_are_taken_is_not_shown_and_a_retraction_frees_one():
    board, reader = _board()
    slots = num_slots(AREA_BYTES)
    home = transfer_key("target") % slots
    others = [f"x{i}" for i in range(100_000) if transfer_key(f"x{i}") % slots == home][:PROBE]
    for other in others:   # each lands in the first free slot from the same home on
        assert board.publish(other, 1_000, 9_000)
    assert not board.publish("target", 1_000, 9_000) and reader.snapshot("target", 2_000) is None
    board.retract(others[0])
    assert board.publish("target", 1_000, 9_000) and reader.snapshot("target", 2_000) is not None


def test_an_area_without_a_board_or_a_cpu_without_x86_ordering_is_never_read():
    assert BoardReader.open(memoryview(bytes(AREA_BYTES))) is None   # an older producer: zeros
    assert board_readable("x86_64") and board_readable("AMD64") and not board_readable("aarch64")
    with pytest.raises(ValueError):
        LeaseBoard(memoryview(bytearray(64)))


def test_the_lease_table_shows_a_lease_from_its_grant_and_retracts_it_when_it_ends():
    board, reader = _board()
    table = LeaseTable()
    table.attach_board(board)
    now_s = 100.0
    table._clock = lambda: now_s   # the table's clock in seconds; the board's in ns of it
    table.grant(Lease("t1", "r1", (1, 2), 64, expires_at_s=130.0))
    vouch = reader.snapshot("t1", copy_started_ns=int(100.5e9))
    assert vouch is not None and reader.snapshot("t1", copy_started_ns=int(100e9)) is None  # the 1 us margin
    assert reader.still_holds(vouch, int(110e9)) and not reader.still_holds(vouch, int(130e9))
    assert table.acquire("t1", 0.0) is not None
    table.release("t1")   # during a send: refused to new pulls at once, and off the board at once
    assert not reader.still_holds(vouch, int(110e9)) and reader.snapshot("t1", int(110e9)) is None
