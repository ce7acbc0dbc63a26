"""A chaos run's schedule and its report: plain values."""

import random
from collections import Counter

import pytest

from loadgen.chaos import ACTIONS, ChaosReport, Victim, chaos_schedule, pick_victim


def test_events_come_every_period_take_every_action_and_leave_a_quiet_tail():
    events = chaos_schedule(duration_s=600, every_s=30, seed=3)
    assert len(events) == 18                                    # 30, 60, ... 540: none in the last 30 s
    assert all(abs(e.at_s - 30 * (i + 1)) <= 7.5 for i, e in enumerate(events))
    assert max(e.at_s for e in events) < 600 - 30 + 7.5
    counts = Counter(e.action for e in events)
    assert set(counts) == set(ACTIONS) and max(counts.values()) - min(counts.values()) <= 1
    assert chaos_schedule(600, 30, seed=3) == events             # the seed decides it


def test_a_schedule_needs_positive_times():
    with pytest.raises(ValueError, match="must be > 0"):
        chaos_schedule(duration_s=60, every_s=0)


def test_the_report_names_every_missed_aim_and_excludes_requests_on_a_killed_router():
    report = ChaosReport(in_flight_on_router_kill=2)
    for outcome, n in (("completed", 97), ("failed_clean", 3)):
        for _ in range(n):
            report.record(outcome)
    assert report.sent == 100 and report.completed_share == pytest.approx(97 / 98)   # 2 were on a dead router
    assert report.shortfalls() == [f"completed {97 / 98:.1%} < 99%"]
    report.record("hung")
    report.wrong, report.checked, report.leaked_kv_blocks = 1, 10, 4
    assert report.shortfalls() == ["1 hung", f"completed {97 / 99:.1%} < 99%", "1 of 10 checked had wrong tokens",
                                   "4 KV blocks and 0 leases left"]
    report.settle_error = "TimeoutError: decode-7 not ready within 600 s"
    assert report.shortfalls()[-1] == "what was left could not be counted: TimeoutError: decode-7 not ready within 600 s"


def test_a_kill_that_would_leave_a_pool_under_its_budget_waits_for_the_replacement():
    rng = random.Random(0)
    # two serve: taking one leaves one, within a budget of one: at once
    victim = pick_victim(["decode-1", "decode-2"], set(), min_serving=1, rng=rng)
    assert victim in (Victim("decode-1", surge=False), Victim("decode-2", surge=False))
    # the last one serving (the other's replacement still starting): only after a surge
    assert pick_victim(["decode-2"], set(), min_serving=1, rng=rng) == Victim("decode-2", surge=True)
    assert pick_victim(["prefill-0"], set(), min_serving=1, rng=rng) == Victim("prefill-0", surge=True)
    # a budget of 0 takes even the last at once
    assert pick_victim(["prefill-0"], set(), min_serving=0, rng=rng) == Victim("prefill-0", surge=False)


def test_a_doomed_worker_is_not_chosen_again_nor_counted_as_serving():
    rng = random.Random(0)
    assert pick_victim(["decode-1", "decode-2"], {"decode-1"}, min_serving=1, rng=rng) == Victim("decode-2", surge=True)
    assert pick_victim(["decode-1"], {"decode-1"}, min_serving=1, rng=rng) is None
    assert pick_victim([], set(), min_serving=1, rng=rng) is None
