"""Which prompt a worker is computing, by the router's books, and what the queue is charged for it."""

import pytest

from router.policies.placement.cost import CostModel
from router.policies.placement.head_of_queue import HeadOfQueue

COST = CostModel(fixed_s=0.1, per_token_s=1e-3, step_fixed_s=0.02, step_per_seq_s=0.001)   # 1,000 tokens: 1.1 s


def test_the_first_prompt_begins_when_sent_to_an_idle_worker_and_the_next_when_it_comes_back():
    heads = HeadOfQueue()
    assert heads.head("p", now_s=5.0) == (0, 0.0)
    heads.book("p", 1, 1000, now_s=10.0)
    heads.book("p", 2, 200, now_s=10.5)           # behind the first: not started
    assert heads.head("p", now_s=10.8) == (1000, pytest.approx(0.8))
    heads.settle("p", 1, now_s=11.1)
    assert heads.head("p", now_s=11.4) == (200, pytest.approx(0.3))
    heads.settle("p", 2, now_s=11.5)
    assert heads.head("p", now_s=12.0) == (0, 0.0)


def test_a_prompt_leaving_from_behind_the_first_does_not_restart_it():
    heads = HeadOfQueue()
    heads.book("p", 1, 1000, now_s=0.0)
    heads.book("p", 2, 200, now_s=0.1)
    heads.settle("p", 2, now_s=0.5)               # cancelled while queued
    heads.settle("p", 99, now_s=0.6)              # unknown: ignored
    assert heads.head("p", now_s=0.9) == (1000, pytest.approx(0.9))


def test_the_queue_is_charged_what_is_left_of_the_first_prompt_and_the_rest_in_full():
    # 1,000 tokens begun 0.8 s ago (0.3 s left) and 2 x 500 behind it (0.6 s each)
    assert COST.queue_s(2000, 3, head_elapsed_s=0.8, head_tokens=1000) == pytest.approx(0.3 + 1.2)
    # past its prediction it costs nothing more; the rest stays
    assert COST.queue_s(2000, 3, head_elapsed_s=5.0, head_tokens=1000) == pytest.approx(1.2)
    # nothing begun: the queue as before (3 prompts of the mean size)
    assert COST.queue_s(2000, 3) == pytest.approx(3 * COST.prefill_s(2000 / 3))
