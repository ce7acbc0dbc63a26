"""The router's dispatch queue: better class first, shorter first within a class, and no starvation."""

import pytest

from router.policies.ordering import DispatchQueue, QueuedItem, overtake_window_s, priority_key, queue_share
from router.policies.placement import CostModel, PlacementConfig

# 1/1024 s per token (exact in binary): a 1024-token prompt costs 1 s, so keys are exact
COST = CostModel(fixed_s=0.0, per_token_s=1 / 1024, step_fixed_s=0.0, step_per_seq_s=0.0)
CONFIG = PlacementConfig()   # interactive 0, "" 1, batch 2; class_gap_s 2.0


def _queue(*items):
    queue = DispatchQueue(COST, CONFIG)
    for item in items:
        queue.push(item)
    return queue


def _ids(queue, now_s):
    return [item.request_id for item in queue.ordered(now_s)]


def test_priority_key_is_class_gap_plus_prefill_time_minus_wait():
    item = QueuedItem("r", "batch", 2048, arrived_s=10.0)
    assert priority_key(item, now_s=13.0, cost=COST, config=CONFIG) == 2 * 2.0 + 2.0 - 3.0


def test_interactive_goes_before_batch_at_equal_wait():
    queue = _queue(QueuedItem("batch", "batch", 64, 0.0), QueuedItem("chat", "interactive", 64, 0.0))
    assert queue.pop_next(now_s=1.0).request_id == "chat"
    assert queue.pop_next(now_s=1.0).request_id == "batch"
    assert queue.pop_next(now_s=1.0) is None


def test_shorter_prompt_goes_first_within_a_class():
    queue = _queue(QueuedItem("long", "", 4096, 0.0), QueuedItem("short", "", 128, 0.5))
    assert _ids(queue, now_s=1.0) == ["short", "long"]


def test_ties_go_to_the_earlier_arrival_then_the_request_id():
    queue = _queue(QueuedItem("b", "", 128, 1.0), QueuedItem("c", "", 128, 0.0), QueuedItem("a", "", 128, 1.0))
    assert _ids(queue, now_s=2.0) == ["c", "a", "b"]


def test_a_long_request_is_overtaken_only_within_its_window_so_it_cannot_starve():
    long = QueuedItem("long", "", 4096, arrived_s=0.0)      # 4 s of prefill
    # the best newcomer: interactive, one token: overtakes only if it arrives < 2 + 4 - 1/1024 s later
    window_s = overtake_window_s(long, COST, CONFIG)
    assert window_s == 2.0 + 4.0 - 1 / 1024
    inside = QueuedItem("inside", "interactive", 1, arrived_s=window_s - 0.25)
    outside = QueuedItem("outside", "interactive", 1, arrived_s=window_s + 0.25)
    assert _ids(_queue(long, inside, outside), now_s=10.0) == ["inside", "long", "outside"]


def test_a_batch_request_goes_first_after_waiting_class_gaps_longer():
    batch = QueuedItem("batch", "batch", 1024, arrived_s=0.0)
    just_before = QueuedItem("chat-early", "interactive", 1024, arrived_s=3.75)   # less than 2 ranks x 2 s later
    just_after = QueuedItem("chat-late", "interactive", 1024, arrived_s=4.25)
    assert _ids(_queue(batch, just_before, just_after), now_s=5.0) == ["chat-early", "batch", "chat-late"]


def test_the_order_of_queued_items_does_not_change_while_they_wait():
    queue = _queue(QueuedItem("a", "batch", 64, 0.0), QueuedItem("b", "interactive", 4096, 1.0),
                   QueuedItem("c", "", 512, 2.0))
    # keys at now_s = 0: a 2*2 + 1/16 = 4.0625, b 0 + 4 + 1 = 5, c 2 + 0.5 + 2 = 4.5: a 4 s prefill outweighs two ranks
    assert _ids(queue, now_s=2.0) == _ids(queue, now_s=600.0) == ["a", "c", "b"]


def test_removal_and_tokens_ahead():
    queue = _queue(QueuedItem("a", "interactive", 100, 0.0), QueuedItem("b", "", 200, 0.0),
                   QueuedItem("c", "batch", 300, 0.0))
    assert queue.tokens_ahead_of("c", now_s=1.0) == 300
    assert queue.remove("b") is True and queue.remove("b") is False
    assert len(queue) == 2 and "b" not in queue
    assert queue.tokens_ahead_of("c", now_s=1.0) == 100
    assert queue.peek(now_s=1.0).request_id == "a" and len(queue) == 2
    with pytest.raises(KeyError):
        queue.tokens_ahead_of("b", now_s=1.0)


def test_a_request_cannot_be_queued_twice():
    queue = _queue(QueuedItem("a", "", 100, 0.0))
    with pytest.raises(ValueError, match="request a is already queued"):
        queue.push(QueuedItem("a", "", 50, 1.0))


def test_the_queue_ahead_is_shared_evenly_and_each_share_prompt_keeps_a_token():
    assert queue_share(3000, 3, 2) == (1500, 2)   # a share counts a split prompt as one of its own
    assert queue_share(1000, 1, 0) == (1000, 1)   # no computing worker: all of it on the one asked about
    assert queue_share(3, 3, 4) == (0, 0)         # under a token each: nothing queued
    assert queue_share(5, 4, 2) == (2, 2)
    assert queue_share(0, 0, 3) == (0, 0)
