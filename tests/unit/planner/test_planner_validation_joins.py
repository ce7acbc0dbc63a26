"""Where a handoff's time goes inside a decode worker (planner.validation_joins), with plain values:
hand-made steps and joins whose phases are known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pdserve.engine_step_trace import Stamps, TracedJoin, TracedStep
from planner.validation_joins import (behind_step_s, client_first_gap_s, external_id, handoff_summary, hop_in_s,
                                      prompt_summary, pull_phases)

NAN = math.nan


def decode(start_s, duration_s, joined=0, continuing=2):
    batch = joined + continuing
    return TracedStep(start_s, start_s + duration_s, joined, continuing, batch, batch, 100 * batch)


# a decode engine stepping every 10 ms (9 ms a step, 1 ms between), from 1.000 s
STEPS = [decode(1.000 + 0.010 * k, 0.009, joined=1 if k in (3, 7) else 0) for k in range(12)]
# request a: accepted at 1.004 (5 ms left of the step running), taken in at its end 1.0095, its pull
# beside the next step (1.010-1.019) and reported after it (1.0195), run one step later than it
# could have been (1.030, not 1.020)
A = TracedJoin("a", 1000, accepted_s=1.004, arrived_s=1.0095, pulled_s=1.0195, start_s=1.030, end_s=1.039)
# request b: accepted while the engine sat between steps (1.0495), taken in at once, its pull took
# two steps (1.050 and 1.060), run at 1.070
B = TracedJoin("b", 2000, accepted_s=1.0495, arrived_s=1.0497, pulled_s=1.0695, start_s=1.070, end_s=1.079)
PROMPT = TracedJoin("p", 300, accepted_s=2.000, arrived_s=2.002, pulled_s=NAN, start_s=2.010, end_s=2.040)


def test_what_was_left_of_the_running_step_when_a_request_came():
    starts = np.array([s.start_s for s in STEPS])
    assert behind_step_s(1.004, STEPS, starts) == pytest.approx(0.005)
    assert behind_step_s(1.0095, STEPS, starts) == 0.0      # between two steps
    assert behind_step_s(0.5, STEPS, starts) == 0.0         # before any step ran
    assert behind_step_s(3.0, STEPS, starts) == 0.0         # after the last


def test_a_pulled_requests_phases_and_the_steps_its_pull_spanned():
    phases = pull_phases([A, B, PROMPT], STEPS)
    assert phases["front"] == pytest.approx([0.0055, 0.0002])
    assert phases["behind_step"] == pytest.approx([0.005, 0.0])
    assert phases["pull"] == pytest.approx([0.010, 0.0198])
    assert list(phases["pull_steps"]) == [1, 2]
    assert phases["to_join"] == pytest.approx([0.0105, 0.0005])
    assert phases["join_step"] == pytest.approx([0.009, 0.009])
    assert phases["inside"] == pytest.approx([0.035, 0.0295])
    # the phases add up to the whole inside the worker
    parts = phases["front"] + phases["pull"] + phases["to_join"] + phases["join_step"]
    assert parts == pytest.approx(phases["inside"])


def test_the_handoff_summary_over_a_window_with_the_hops_outside():
    summary = handoff_summary([A, B, PROMPT], STEPS, 1.0, 1.045, client_first_gap_s=0.045)
    assert summary["requests"] == 1                           # b was accepted after the window
    assert summary["inside_ms"] == pytest.approx(35.0)
    assert summary["hops_ms"] == pytest.approx(10.0)
    assert summary["pull_steps_share"] == {"0": 0.0, "1": 1.0, "2": 0.0, "3+": 0.0}
    both = handoff_summary([A, B], STEPS, 1.0, 2.0)
    assert both["requests"] == 2 and both["pull_ms"] == pytest.approx(14.9)
    assert both["pull_steps_share"] == {"0": 0.0, "1": 0.5, "2": 0.5, "3+": 0.0}
    assert "hops_ms" not in both                              # no clients' gap given
    assert handoff_summary([PROMPT], STEPS, 0.0, 9.0) == {"requests": 0}


# the same requests in a prefill worker, under the engine ids vLLM's front end makes of the router's:
# a's first token at 0.998 (accepted by the decode worker 6 ms later), b's at 1.0475 (2 ms later)
PREFILLED = [TracedJoin("a-1f2e3d4c", 1000, 0.90, 0.901, NAN, 0.95, 0.998),
             TracedJoin("b-0a9b8c7d", 2000, 0.95, 0.951, NAN, 1.00, 1.0475),
             TracedJoin("c-12345678", 50, 0.95, 0.951, NAN, 1.00, 1.0100)]   # never reached a decode worker


def test_the_router_given_id_from_an_engines_request_id():
    assert external_id("a-1f2e3d4c") == "a"
    assert external_id("cmpl-7-0-1f2e3d4c") == "cmpl-7-0"
    assert external_id("plain") == "plain"
    assert external_id("a-short") == "a-short"                  # not vLLM's 8-character suffix


def test_the_way_in_from_the_prefill_join_to_the_decode_front_end():
    decoded = [TracedJoin(j.request_id + "-99aa88bb", j.prompt_tokens, j.accepted_s, j.arrived_s, j.pulled_s,
                          j.start_s, j.end_s) for j in (A, B, PROMPT)]
    # in the decode joins' order; p pulled nothing (computed where it decodes) and is left out
    assert hop_in_s(PREFILLED, decoded) == pytest.approx([0.006, 0.002])
    pulled_there = [TracedJoin("a-1f2e3d4c", 1000, 0.90, 0.901, 0.93, 0.95, 0.998)]
    assert len(hop_in_s(pulled_there, decoded)) == 0             # a decode worker's join is no prefill
    summary = handoff_summary(decoded, STEPS, 1.0, 2.0, client_first_gap_s=0.045, prefill_joins=PREFILLED)
    assert summary["hop_in_requests"] == 2 and summary["hop_in_ms"] == pytest.approx(4.0)   # the median
    assert "hop_in_ms" not in handoff_summary(decoded, STEPS, 1.0, 2.0)
    # a prompt over the engine's token budget ran in chunks and joined at its first: left out
    assert hop_in_s(PREFILLED, decoded, max_prompt_tokens=1500) == pytest.approx([0.006])
    assert handoff_summary(decoded, STEPS, 1.0, 2.0, prefill_joins=PREFILLED, max_prompt_tokens=1500)[
        "hop_in_requests"] == 1


def test_a_prompts_front_end_queue_and_first_step():
    summary = prompt_summary([A, PROMPT], 0.0, 9.0)
    assert summary == {"requests": 1, "front_ms": pytest.approx(2.0), "queue_ms": pytest.approx(8.0),
                       "first_step_ms": pytest.approx(30.0)}
    assert prompt_summary([A], 0.0, 9.0) == {"requests": 0}


def test_the_clients_first_gap_over_requests_of_two_tokens_or_more():
    assert client_first_gap_s([(0.1, 0.15, 0.2), (0.2, 0.23), (0.3,)]) == pytest.approx(0.04)
    assert math.isnan(client_first_gap_s([(0.1,)]))


def test_a_schedulers_stamps_until_a_requests_first_step():
    stamps = Stamps(wall_to_monotonic_s=1000.0)
    stamps.arrived("a", accepted_wall_s=1001.5, prompt_tokens=40, now_s=1.75)
    stamps.arrived("a", accepted_wall_s=1009.0, prompt_tokens=40, now_s=9.0)   # seen again: the first stamp stays
    stamps.pulled("a", 2.5)
    stamps.pulled("unknown", 2.5)                                              # never arrived: ignored
    stamps.arrived("b", accepted_wall_s=None, prompt_tokens=8, now_s=3.0)
    a = stamps.take("a")
    assert (a.prompt_tokens, a.accepted_s, a.arrived_s, a.pulled_s) == (40, 1.5, 1.75, 2.5)
    assert stamps.take("a") is None                                            # forgotten once taken
    b = stamps.take("b")
    assert math.isnan(b.accepted_s) and math.isnan(b.pulled_s)
    assert stamps.take("unknown") is None


def test_stamps_of_requests_that_never_ran_are_bounded():
    stamps = Stamps(wall_to_monotonic_s=0.0)
    for k in range(Stamps.MAX + 1):
        stamps.arrived(f"r{k}", None, 1, float(k))
    assert stamps.take("r0") is None                          # the oldest half went
    assert stamps.take(f"r{Stamps.MAX}") is not None


def test_the_way_in_beside_the_batch_the_decode_engine_ran_as_the_prompt_finished():
    from planner.validation_joins import way_in_by_batch

    decoded = [TracedJoin(j.request_id + "-99aa88bb", j.prompt_tokens, j.accepted_s, j.arrived_s, j.pulled_s,
                          j.start_s, j.end_s) for j in (A, B, PROMPT)]
    # a's first token at 0.998: before the first traced step (batch 0); b's at 1.0475, within the step
    # of 1.040-1.049, which ran 2 continuing requests
    batches, ways = way_in_by_batch(PREFILLED, decoded, STEPS)
    assert list(batches) == [0, 2] and ways == pytest.approx([0.006, 0.002])
    batches, ways = way_in_by_batch(PREFILLED, decoded, STEPS, max_prompt_tokens=1500)   # b's 2,000 tokens: chunked
    assert list(batches) == [0] and ways == pytest.approx([0.006])


def test_the_share_of_a_span_an_engine_stepped():
    from planner.validation_joins import busy_share

    starts = np.array([s.start_s for s in STEPS])
    assert busy_share(STEPS, starts, 1.000, 1.010) == pytest.approx(0.9)     # a 9 ms step in 10 ms
    assert busy_share(STEPS, starts, 1.0045, 1.0145) == pytest.approx(0.9)   # across a step's end
    assert busy_share(STEPS, starts, 1.0092, 1.0098) == 0.0                  # between two steps
    assert busy_share(STEPS, starts, 5.0, 6.0) == 0.0 and busy_share(STEPS, starts, 1.0, 1.0) == 0.0


def test_the_way_in_beside_the_share_of_it_the_prefill_engine_stepped():
    from planner.validation_joins import way_in_by_prefill_share

    decoded = [TracedJoin(j.request_id + "-99aa88bb", j.prompt_tokens, j.accepted_s, j.arrived_s, j.pulled_s,
                          j.start_s, j.end_s) for j in (A, B, PROMPT)]
    # the prefill engine steps 1.0460-1.0520: b's way in (1.0475-1.0495) is all inside it, a's
    # (0.998-1.004) sees none of it
    prefill_steps = [TracedStep(1.046, 1.052, 1, 0, 300, 0, 300)]
    shares, ways = way_in_by_prefill_share(PREFILLED, decoded, prefill_steps)
    assert shares == pytest.approx([0.0, 1.0]) and ways == pytest.approx([0.006, 0.002])


def test_when_cpu_work_on_a_stepping_engines_core_is_done():
    from planner.validation_joins import served_by_s

    starts = np.array([s.start_s for s in STEPS])   # steps of 9 ms every 10 ms from 1.000
    # 2 ms of work from 1.0090 (the gap 1.009-1.010): 1 ms in the gap, then the step 1.010-1.019 ...
    assert served_by_s(STEPS, starts, 1.009, 0.002, 1.0) == pytest.approx(1.011)    # ... does not slow it
    assert served_by_s(STEPS, starts, 1.009, 0.002, 0.5) == pytest.approx(1.012)    # halves it
    assert served_by_s(STEPS, starts, 1.009, 0.002, 0.0) == pytest.approx(1.020)    # holds it to the next gap
    # started inside a step (1.0145, 4.5 ms left of it): a tenth of the core there, then the gap
    assert served_by_s(STEPS, starts, 1.0145, 0.001, 0.1) == pytest.approx(1.01955)  # 0.45 ms there, 0.55 after
    assert served_by_s(STEPS, starts, 1.0145, 0.0004, 0.1) == pytest.approx(1.0185)  # done within it
    # several steps' gaps at 0: 3 ms of work takes the three gaps after 1.0005
    assert served_by_s(STEPS, starts, 1.0005, 0.003, 0.0) == pytest.approx(1.030)
    # after the last step and before the first, the whole core; no work, no time
    assert served_by_s(STEPS, starts, 3.0, 0.004, 0.0) == pytest.approx(3.004)
    assert served_by_s(STEPS, starts, 0.5, 0.004, 0.0) == pytest.approx(0.504)
    assert served_by_s(STEPS, starts, 1.005, 0.0, 0.0) == 1.005
    with pytest.raises(ValueError, match="share_while_stepping"):
        served_by_s(STEPS, starts, 1.0, 0.001, 1.5)


def test_prompts_a_prefill_engine_cut_into_chunks_are_left_out():
    from planner.validation_joins import one_step_prompts

    # three steps: p and q joined at 1.00 (q cut: the step at 1.05 continues it), r alone at 1.10
    steps = [TracedStep(1.00, 1.05, 2, 0, 2048, 0, 0), TracedStep(1.05, 1.08, 0, 1, 500, 0, 0),
             TracedStep(1.10, 1.14, 1, 0, 900, 0, 0)]
    p = TracedJoin("p", 1500, 0.99, 0.995, NAN, 1.00, 1.05)
    q = TracedJoin("q", 1048, 0.99, 0.995, NAN, 1.00, 1.05)
    r = TracedJoin("r", 900, 1.09, 1.095, NAN, 1.10, 1.14)
    assert one_step_prompts([p, q, r], steps) == [r]               # which of p, q was cut the trace does not say
    assert one_step_prompts([p, q, r], steps[2:]) == [p, q, r]     # no step continued a chunk
    assert one_step_prompts([r], []) == [r]
