"""A prompt step beside decode streams: its rows over idle and the idle row itself
(`planner.profiler.prompt_loss_fit`), charged as measured (`SimSettings.prompt_loss`), the
probe's plan (`ServingPlan`, `prompt_loss_probe.stream_output_tokens`), the profile's rows
(`ServingCosts.prompt_loss_by_batch`) and what the simulator charges with them, on a hand schedule;
and the decode side of the same probes (`prompt_loss_fit.served_decode_corun`,
`ServingCosts.corun_decode_stretch_served`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.profile_checks import ProfileError
from planner.profiler.prompt_loss_fit import bucket_low, loss_over_idle
from planner.profiler.serving_fit import PROMPT_LOSS_BATCHES, QUICK_PROMPT_LOSS_BATCHES, serving_plan
from planner.serving_costs import ServingCosts
from planner.simulator import SimulationError, Topology, simulate
from planner_testkit import ROUND_MODEL, round_settings, spec


def test_bucket_labels_give_their_smallest_batch():
    assert [bucket_low(label) for label in ("0", "1", "2-3", "8-15", "64+")] == [0, 1, 2, 8, 64]


def test_each_batch_is_kept_as_its_increase_over_the_idle_line():
    by_bucket = {"0": {"steps": 8, "median_stretch": 1.3, "lost_ms": 2.0, "slope": 1.2},
                 "8-15": {"steps": 8, "median_stretch": 2.5, "lost_ms": 12.0, "slope": 1.5},
                 "2-3": {"steps": 8, "median_stretch": 1.6, "lost_ms": 5.0, "slope": 1.1}}
    rows = loss_over_idle(by_bucket)
    # by rising batch; the slope below idle's is taken as no stretch (1), the fixed part over idle's kept
    assert rows == ((2, 1.0, 0.003), (8, pytest.approx(1.3), pytest.approx(0.010)))
    # a bucket without a line: the difference of the medians (the idle excess is charged already), no
    # fixed part; a fixed part below idle's: 0
    rows = loss_over_idle({"0": by_bucket["0"], "4-7": {"steps": 5, "median_stretch": 2.6},
                           "16-31": {"steps": 8, "median_stretch": 1.0, "lost_ms": 1.0, "slope": 1.4}})
    assert rows == ((4, pytest.approx(2.3), 0.0), (16, pytest.approx(1.2), 0.0))
    assert loss_over_idle({"8-15": by_bucket["8-15"]}) == ()   # nothing to read an increase against


def test_the_plan_probes_idle_and_the_batches_the_engine_admits():
    plan = serving_plan(max_model_len=2048, max_num_seqs=64, quick=True)
    assert plan.prompt_loss_batches == (0, *QUICK_PROMPT_LOSS_BATCHES) and plan.prompt_loss_repeats == 2
    full = serving_plan(max_model_len=2048, max_num_seqs=64, quick=False)
    assert full.prompt_loss_batches == (0, *PROMPT_LOSS_BATCHES) and full.prompt_loss_repeats == 3
    assert plan.prompt_loss_lengths == (*plan.prompt_tokens, 1024)
    assert plan.cluster_steps == plan.steps + len(plan.prompt_loss_batches)
    small = serving_plan(max_model_len=512, max_num_seqs=8, quick=False)
    assert small.prompt_loss_batches == (0, 2) and small.prompt_loss_repeats == 3
    assert small.prompt_loss_lengths == small.prompt_tokens   # no long prompt in a short context


def test_the_streams_outlast_the_probes():
    from planner.profiler.prompt_loss_probe import PROBE_PAUSE_S, STREAM_MARGIN, stream_output_tokens

    lengths, repeats = (32, 128), 3
    probes_s = repeats * sum(ROUND_MODEL.prefill_s(n, n) + PROBE_PAUSE_S + 3 * ROUND_MODEL.decode_step_s(9, n)
                             for n in lengths)
    tokens = stream_output_tokens(ROUND_MODEL, 8, lengths, repeats, max_output_tokens=10_000)
    assert tokens * ROUND_MODEL.decode_step_s(8, 96) >= STREAM_MARGIN * probes_s
    assert stream_output_tokens(ROUND_MODEL, 8, lengths, repeats, max_output_tokens=100) == 100
    assert stream_output_tokens(ROUND_MODEL, 0, lengths, repeats, max_output_tokens=100) == 0   # the idle probes


def test_the_profiles_rows_are_checked():
    assert ServingCosts(prompt_loss_by_batch=[[2, 1.1, 0.004], [8, 1.4, 0.01]]).prompt_loss_by_batch == (
        (2.0, 1.1, 0.004), (8.0, 1.4, 0.01))
    for bad in ([[8, 1.4, 0.01], [2, 1.1, 0.0]], [[0, 1.1, 0.0]], [[2, 0.9, 0.0]], [[2, 1.1, -0.001]],
                [[2.5, 1.1, 0.0]], [[2, 1.1]]):
        with pytest.raises(ProfileError, match="prompt_loss_by_batch"):
            ServingCosts(prompt_loss_by_batch=bad)


PROMPT_S = 0.1 + 0.001 * 50 + 1e-6 * 50 * 50   # a 50-token prompt on the round model: 0.1525 s
# the first request decodes past 0.6 s, so the second prompt, at 0.3 s, starts beside one stream


def first_tokens(settings) -> list[float]:
    result = simulate([spec(0.0, 50, 20), spec(0.3, 50, 2)], Topology.disaggregated(1, 1), settings, ROUND_MODEL)
    return [float(t) for t in result.timeline["first_token_s"]]


def test_the_simulator_charges_the_profiles_loss_unless_told_not_to():
    measured = ServingCosts(prompt_loss_by_batch=((1, 1.5, 0.02),))
    charged = first_tokens(round_settings(serving=measured))
    assert charged == pytest.approx([PROMPT_S, 0.3 + 0.02 + 1.5 * PROMPT_S])   # idle: none; beside one stream
    assert first_tokens(round_settings(serving=measured, prompt_loss="none")) == pytest.approx([PROMPT_S, 0.3 + PROMPT_S])
    # a what-if's rows take the profile's place
    assert first_tokens(round_settings(serving=measured, prompt_stretch=((1, 2.0),))) == pytest.approx(
        [PROMPT_S, 0.3 + 2 * PROMPT_S])
    with pytest.raises(SimulationError, match="prompt_loss"):
        round_settings(prompt_loss="measured")


def test_the_idle_row_is_kept_as_measured_with_its_line_or_its_median():
    from planner.profiler.prompt_loss_fit import idle_loss

    assert idle_loss({"0": {"steps": 12, "median_stretch": 1.48, "lost_ms": 0.7, "slope": 1.38}}) == (1.38, 0.0007)
    assert idle_loss({"0": {"steps": 5, "median_stretch": 1.3}}) == (1.3, 0.0)             # no line: the median
    # a slope under 1 or a negative fixed part is noise: at least the model's step, no time given back
    assert idle_loss({"0": {"steps": 9, "median_stretch": 1.1, "lost_ms": -2.0, "slope": 0.9}}) == (1.0, 0.0)
    assert idle_loss({"8-15": {"steps": 9, "median_stretch": 2.0}}) is None


def test_the_rows_as_measured_are_each_row_over_idle_added_to_the_idle_one():
    from planner.simulator.config import prompt_rows_as_measured

    over_idle = ((2, 1.3, 0.001), (8, 1.8, 0.004))
    assert prompt_rows_as_measured(over_idle, (1.4, 0.0007)) == (
        (0, 1.4, 0.0007), (2, pytest.approx(1.7), pytest.approx(0.0017)), (8, pytest.approx(2.2), pytest.approx(0.0047)))
    assert prompt_rows_as_measured(over_idle, ()) == over_idle      # a profile measured before the idle row
    assert prompt_rows_as_measured((), (1.2, 0.0)) == ((0, 1.2, 0.0),)


def test_the_first_tokens_idle_excess_is_the_idle_loss_of_the_lone_prompt_and_its_cpu():
    from planner.profiler.serving_probe import first_token_idle_excess_s

    step_s = ROUND_MODEL.prefill_step_s(128, 128 ** 2)
    assert first_token_idle_excess_s((1.5, 0.002), ROUND_MODEL, 128, cpu_s=0.004) == pytest.approx(
        0.002 + 0.5 * (step_s + 0.004))
    assert first_token_idle_excess_s((), ROUND_MODEL, 128, cpu_s=0.004) == 0.0


def test_the_idle_row_is_checked_and_merged_as_measured():
    from planner.profile_merge import merged_serving

    assert ServingCosts(prompt_idle_loss=[1.4, 0.0007]).prompt_idle_loss == (1.4, 0.0007)
    assert ServingCosts(prompt_idle_loss=[]).prompt_idle_loss == ()
    for bad in ([0.9, 0.0], [1.2, -0.001], [1.2], [1.2, float("nan")], "1.2"):
        with pytest.raises(ProfileError, match="prompt_idle_loss"):
            ServingCosts(prompt_idle_loss=bad)
    a = ServingCosts(first_token_s=0.008, prompt_idle_loss=(1.4, 0.001), first_token_idle_excess_s=0.003)
    b = ServingCosts(first_token_s=0.010, prompt_idle_loss=(1.2, 0.003), first_token_idle_excess_s=0.002)
    older = ServingCosts(first_token_s=0.009)
    merged = merged_serving([a, b, older])
    # of the profiles that measured it, term by term; the first token the median of all three
    assert merged.prompt_idle_loss == pytest.approx((1.3, 0.002)) and merged.first_token_idle_excess_s == pytest.approx(0.0025)
    assert merged.first_token_s == pytest.approx(0.009)
    assert merged_serving([older, older]).prompt_idle_loss == () and merged_serving([older, older]).first_token_idle_excess_s == 0


def test_the_simulator_charges_the_idle_row_to_the_step_and_takes_it_off_the_first_tokens_delivery():
    # the lone prompt's idle excess (0.02 + 0.2 x its step) moves from the delivery to the step:
    # alone, the first token the client sees is where it was; queued behind it, the second waits longer
    excess_s = 0.02 + 0.2 * PROMPT_S
    measured = ServingCosts(first_token_s=0.08, prompt_idle_loss=(1.2, 0.02), first_token_idle_excess_s=excess_s,
                            prompt_loss_by_batch=((1, 1.5, 0.01),))
    settings = round_settings(serving=measured)
    assert settings.prompt_loss_rows == ((0, 1.2, 0.02), (1, pytest.approx(1.7), pytest.approx(0.03)))
    assert settings.first_token_delivery_s == pytest.approx(0.08 - excess_s)
    lone = simulate([spec(0.0, 50, 1)], Topology.disaggregated(1, 1), settings, ROUND_MODEL)
    assert float(lone.timeline["first_token_s"][0]) == pytest.approx(0.02 + 1.2 * PROMPT_S)   # the step
    assert float(lone.ttft_s[0]) == pytest.approx(PROMPT_S + 0.08)   # what a lone request measured
    before = round_settings(serving=measured, prompt_loss="over-idle")
    assert before.prompt_loss_rows == ((1, 1.5, 0.01),) and before.first_token_delivery_s == 0.08
    # two prompts at once share one step of 100 tokens: its idle loss once, the delivery less the lone excess
    pair = simulate([spec(0.0, 50, 1), spec(0.0, 50, 1)], Topology.disaggregated(1, 1), settings, ROUND_MODEL)
    pair_step_s = ROUND_MODEL.prefill_step_s(100, 2 * 50 ** 2)
    assert pair.ttft_s == pytest.approx([0.02 + 1.2 * pair_step_s + 0.08 - excess_s] * 2)
    # a what-if's rows keep the whole delivery
    assert round_settings(serving=measured, prompt_stretch=((0, 1.1),)).first_token_delivery_s == 0.08


def test_a_bucket_is_described_with_its_line_and_error_or_why_it_has_none():
    from planner.profiler.prompt_loss_probe import describe

    assert describe({"steps": 12, "median_stretch": 1.634, "lost_ms": 13.04, "slope": 1.52, "line_error": 0.081}) == (
        "12 steps, median 1.63x the engine's; the line +13.0 ms + 1.52x the engine's step misses them by 8.1%")
    assert describe({"steps": 5, "median_stretch": 2.0}).endswith("too alike in length for a line")


def test_a_probe_that_fails_leaves_the_profile_without_rows_and_says_why(monkeypatch, tmp_path):
    from pdserve.errors import NoHealthyWorker
    from planner.profiler import prompt_loss_probe
    from planner.profiler.serving_probe import measured_prompt_loss

    def broken(*args, **kwargs):
        raise NoHealthyWorker("the decode pool went away")

    notes = []
    monkeypatch.setattr(prompt_loss_probe, "measure_prompt_loss", broken)
    plan = serving_plan(max_model_len=2048, max_num_seqs=64, quick=True)
    rows, idle, corun_rows = measured_prompt_loss("localhost:1", tmp_path, "prefill-0", "decode-1", ROUND_MODEL, plan,
                                                  100, lambda note, step=True: notes.append((note, step)))
    assert rows == () and idle == () and corun_rows == []
    assert notes == [(notes[0][0], False)] and "NoHealthyWorker: the decode pool went away" in notes[0][0]
    assert "the host model alone" in notes[0][0]


def test_the_measured_floor_holds_the_co_run_stretch_already():
    # the probe's prompts ran beside the decode engine's steps: the co-run stretch (1.5 here) is not
    # applied to the floor again; the larger of the two is the step
    def costs(stretch):
        return ServingCosts(corun_prefill_stretch=1.5, prompt_loss_by_batch=((1, stretch, 0.0),))

    assert first_tokens(round_settings(serving=costs(1.2)))[1] == pytest.approx(0.3 + 1.5 * PROMPT_S)
    assert first_tokens(round_settings(serving=costs(2.0)))[1] == pytest.approx(0.3 + 2.0 * PROMPT_S)


# ---- the decode side of the same probes: a decode step beside a prompt, through the cluster ----

def _row(batch: str, beside_ms: float, alone_ms: float, steps: int = 40):
    from planner.validation_steps import CorunRow

    return CorunRow(batch, beside_ms / 1e3, alone_ms / 1e3, steps, steps)


def test_the_served_corun_is_the_median_ratio_where_the_host_model_charges_nothing_for_it():
    from planner.profiler.prompt_loss_fit import served_decode_corun
    from planner.profiler.stream_fit import StreamCpu

    rows = [_row("2-3", 5.6, 4.8), _row("8-15", 7.7, 7.0), _row("32-63", 16.0, 15.0)]
    stretch, lines = served_decode_corun(rows, StreamCpu(), host_cores=2, client_placement="wake")
    assert stretch == pytest.approx(1.1)   # 1.1667, 1.1, 1.0667: the median
    assert len(lines) == 3 and lines[1].startswith("8-15 streams: 7.70 ms a step beside a prompt (40 steps)")
    assert "1.100x, of which the host model charges 1.000x" in lines[1]
    assert served_decode_corun([], StreamCpu(), 2, "wake") == (None, [])


def test_the_served_corun_is_net_of_what_the_host_model_already_charges_beside_a_prompt():
    """The client woken beside a bound router lands on the decode core more while the prefill engine
    steps on the router's: the host model's own stretch beside a prompt is larger than alone, and
    the profile keeps only what the cluster showed beyond it (or the simulator charges it twice)."""
    from planner.profiler.prompt_loss_fit import served_decode_corun
    from planner.profiler.stream_fit import StreamCpu

    stream = StreamCpu(host_per_step_s=0.0004, host_per_token_s=0.0002, router_per_step_s=0.0001,
                       router_per_token_s=0.0001)
    tokens_per_s, batch = 8 / 0.007, 8
    beside = stream.decode_stretch(tokens_per_s, batch, 2, client_placement="wake", beside_prompt=True)
    alone = stream.decode_stretch(tokens_per_s, batch, 2, client_placement="wake")
    assert beside > alone >= 1.0
    stretch, _ = served_decode_corun([_row("8-15", 8.4, 7.0)], stream, host_cores=2, client_placement="wake")
    assert stretch == pytest.approx(1.2 / (beside / alone), abs=1e-4)
    # the room the router leaves takes the whole client, prompt or not: nothing to net
    assert stream.decode_stretch(tokens_per_s, batch, 2, beside_prompt=True) == stream.decode_stretch(tokens_per_s, batch, 2)
    assert served_decode_corun([_row("8-15", 8.4, 7.0)], stream, 2, "router-room")[0] == pytest.approx(1.2)


def test_a_decode_step_beside_a_prompt_takes_the_served_corun_unless_told_the_engines():
    # R1 alone: prefill 0.1525, 5 blocks pulled by 0.2075, then decode steps of 0.0201, 0.0202 and
    # 0.0203 s. R2 arrives at 0.22 while R1's first step runs; R1's next two start beside its prompt.
    costs = ServingCosts(corun_decode_stretch=1.5, corun_decode_stretch_served=1.25)
    requests = [spec(0.0, 50, 4), spec(0.22, 50, 1)]

    def finish_s(**what_if) -> float:
        result = simulate(requests, Topology.disaggregated(1, 1), round_settings(serving=costs, **what_if), ROUND_MODEL)
        return float(result.timeline["finish_s"][0])

    assert finish_s() == pytest.approx(0.2075 + 0.0201 + 1.25 * (0.0202 + 0.0203), abs=1e-12)
    assert finish_s(corun="engines") == pytest.approx(0.2075 + 0.0201 + 1.5 * (0.0202 + 0.0203), abs=1e-12)
    # a profile measured before the served one (0) charges the engines' either way
    older = round_settings(serving=replace(costs, corun_decode_stretch_served=0.0))
    assert older.corun_stretches == round_settings(serving=costs, corun="engines").corun_stretches == (1.0, 1.5)
    with pytest.raises(SimulationError, match="corun must be one of"):
        round_settings(corun="both")


@pytest.mark.parametrize("value", [0.3, 5.0, float("nan"), -1.0])
def test_a_served_corun_outside_its_range_is_refused_and_zero_is_not_measured(value):
    assert ServingCosts(corun_decode_stretch_served=0.0).corun_decode_stretch_served == 0.0
    with pytest.raises(ProfileError, match="corun_decode_stretch_served"):
        ServingCosts(corun_decode_stretch_served=value)
