"""A prefilled request's hops beside its prefill engine's steps (`SimSettings.hops` "prefill-core"):
the work on one core (`planner.simulator.core_share.WorkBesideSteps`) with plain values, and the
simulator on a hand schedule."""

from __future__ import annotations

import pytest

from planner.serving_costs import ServingCosts
from planner.simulator import Topology, simulate
from planner.simulator.core_share import WorkBesideSteps
from planner_testkit import ROUND_MODEL, round_settings, spec


def test_work_runs_at_the_whole_core_between_steps_and_at_its_share_during_one():
    work = WorkBesideSteps(0.5)
    work.add(1.0, "a", 0.004)
    assert work.next_done_s(1.0) == pytest.approx(1.004)          # the engine idles
    work.step_started(1.001, end_s=1.010)                          # 3 ms left, now at half the core
    assert work.next_done_s(1.001) == pytest.approx(1.007)
    work.add(1.002, "b", 0.008)                                   # 8 ms: not done within the step (4.5 ms of it)
    assert work.next_done_s(1.007) == pytest.approx(1.007)
    assert work.done(1.007) == [("a", 1.0)] and len(work) == 1
    assert work.next_done_s(1.007) is None                        # b has 5.5 ms left, the step 1.5 ms at half
    work.step_ended(1.010)                                         # b did 4 ms in the step: 4 left
    assert work.next_done_s(1.010) == pytest.approx(1.014)
    assert work.done(1.014) == [("b", 1.002)] and len(work) == 0 and work.next_done_s(1.014) is None


def test_work_that_waits_for_the_engines_gaps_and_the_version_that_marks_a_change():
    work = WorkBesideSteps(0.0)
    work.step_started(0.0, end_s=0.1)
    work.add(0.05, "a", 0.002)
    version = work.version
    assert work.next_done_s(0.05) is None                         # nothing moves while the engine steps
    work.step_ended(0.1)
    assert work.version > version and work.next_done_s(0.1) == pytest.approx(0.102)
    assert work.done(0.101) == []                                  # half done
    with pytest.raises(ValueError, match="share_while_stepping"):
        WorkBesideSteps(-0.1)


def test_a_hop_shares_its_prefill_engines_core_with_the_next_prompts_step():
    """a's prompt (100 tokens: 0.1 + 0.1 + 0.01 = 0.21 s) ends at 0.21 as b's starts (0.21-0.42); a's
    hop (20 ms) runs at half the core beside it: 40 ms. b's finds the engine idle: 20 ms, then 1 ms in
    the router behind a's stream and 4 ms in the decode worker's API process behind its step's output
    (2 ms of CPU at half the core)."""
    costs = ServingCosts(first_token_s=0.004, handoff_s=0.02, decode_cpu_s_per_token=0.002,
                         router_cpu_s_per_token=0.001, host_cpu_s_per_token=0.001)
    requests = [spec(0.0, 100, 40), spec(0.1, 100, 4)]
    hops = {}
    for model in ("stretched", "prefill-core"):
        result = simulate(requests, Topology.disaggregated(1, 1), round_settings(serving=costs, hops=model), ROUND_MODEL)
        t = result.timeline
        assert list(t["first_token_s"]) == pytest.approx([0.21, 0.42])
        hops[model] = (list(t["handed_off_s"] - t["first_token_s"]), list(result.ttft_s))
    assert hops["stretched"][0] == pytest.approx([0.02, 0.02])
    assert hops["prefill-core"][0] == pytest.approx([0.04, 0.02 + 0.001 + 0.004])
    # the first token's delivery takes the hop's stretch (2 for a) and the router's wait (b)
    assert hops["prefill-core"][1] == pytest.approx([0.21 + 0.008, 0.32 + 0.004 + 0.001])
