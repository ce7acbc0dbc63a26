"""Where a prediction goes wrong (planner/validation_phases.py): a request's latency split into
queue, prefill, first gap and steady decode gap, from loadgen's records and from the simulator's
timeline, compared per phase."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from planner_testkit import ROUND_MODEL, round_settings, spec

from loadgen.runner import RequestRecord
from loadgen.targets.base import PhaseTimings
from planner.serving_costs import ServingCosts
from planner.simulator import Topology, simulate
from planner.validation_phases import PHASES, measured_phases, phase_rows, simulated_phases

REPO = Path(__file__).resolve().parents[3]


def record(index: int, chunk_times_s: tuple[float, ...], queued_s: float | None, output_tokens: int,
           status: str = "ok") -> RequestRecord:
    phases = None if queued_s is None else PhaseTimings(queued_s, 0.0, 0.0, 0, 0.0)
    return RequestRecord(index=index, scheduled_s=0.0, sent_s=0.0, client_queue_s=0.0, prompt_tokens=10,
                         requested_output_tokens=output_tokens, status=status, output_tokens=output_tokens,
                         chunk_times_s=chunk_times_s, phases=phases)


def test_measured_phases_split_each_request_by_its_chunks_and_the_routers_queue():
    records = [record(2, (0.10, 0.13, 0.14, 0.16), 0.02, 4),   # index order is the record's own
               record(0, (0.05,), 0.01, 1),                      # one token: no gaps
               record(1, (), None, 4, status="refused")]         # refused: nothing
    phases = measured_phases(records, 3)
    assert phases["queue"][2] == pytest.approx(0.02) and phases["prefill"][2] == pytest.approx(0.08)
    assert phases["first_gap"][2] == pytest.approx(0.03)
    assert phases["steady_gap"][2] == pytest.approx((0.16 - 0.13) / 2)
    assert phases["queue"][0] == pytest.approx(0.01) and math.isnan(phases["first_gap"][0])
    assert all(math.isnan(phases[p][1]) for p in PHASES)


def test_simulated_phases_add_up_to_ttft_and_tpot_on_a_hand_schedule():
    costs = ServingCosts(first_token_s=0.004, handoff_s=0.003)
    result = simulate([spec(0.0, 50, 4), spec(0.01, 50, 4)], Topology.disaggregated(1, 1),
                      round_settings(serving=costs), ROUND_MODEL)
    phases = simulated_phases(result.timeline, result.output_tokens, result.delivery_s)
    # the second prompt arrives during the first's prefill step (0.1525 s) and waits for it
    assert phases["queue"].tolist() == pytest.approx([0.0, 0.1525 - 0.01])
    np.testing.assert_allclose(phases["queue"] + phases["prefill"], result.ttft_s)
    tpot = (phases["first_gap"] + 2 * phases["steady_gap"]) / 3
    np.testing.assert_allclose(tpot, result.tpot_s)


def test_the_simulated_handoff_splits_into_the_hops_and_the_decode_workers_part():
    costs = ServingCosts(first_token_s=0.004, handoff_s=0.003)
    result = simulate([spec(0.0, 50, 4)], Topology.disaggregated(1, 1), round_settings(serving=costs), ROUND_MODEL)
    t = {name: values[0] for name, values in result.timeline.items()}
    assert t["handed_off_s"] == pytest.approx(t["first_token_s"] + 0.003)    # the hops: the profile's handoff_s
    # an idle decode engine pulls at once (5 blocks of 10 tokens x 100 bytes: 5 ms + 5,000 B at 1e5 B/s),
    # then runs it in its next step (batch 1, context 51: 10 + 5 + 5.1 ms)
    assert t["transfer_start_s"] == pytest.approx(t["handed_off_s"])
    assert t["first_decode_token_s"] - t["handed_off_s"] == pytest.approx(0.055 + 0.0201)
    summary = result.summary()
    assert summary["mean_handoff_hops_ms"] == pytest.approx(3.0)
    assert summary["mean_handoff_inside_ms"] == pytest.approx(75.1)
    assert summary["median_handoff_hops_ms"] == pytest.approx(3.0)
    colocated = simulate([spec(0.0, 50, 4)], Topology.colocated(1), round_settings(serving=costs), ROUND_MODEL)
    assert colocated.summary()["mean_handoff_hops_ms"] is None            # nothing pulled
    assert colocated.timeline["handed_off_s"][0] == colocated.timeline["first_token_s"][0]


def test_phase_rows_compare_each_sides_own_requests_and_say_when_a_phase_is_missing():
    measured = {"queue": [0.01, 0.02, math.nan], "prefill": [0.1, 0.2, 0.3], "first_gap": [math.nan] * 3,
                "steady_gap": [0.01, 0.01, 0.01]}
    simulated = {"queue": np.array([0.0, 0.0, 0.0]), "prefill": np.array([0.1, 0.1, 0.1]),
                 "first_gap": np.array([0.02, 0.02, 0.02]), "steady_gap": np.array([0.005, 0.005, 0.005])}
    rows = {row.phase: row for row in phase_rows(measured, simulated)}
    assert rows["queue"].measured_p50_s == pytest.approx(0.015)         # the NaN is not a request with a phase
    assert rows["prefill"].error("p50") == pytest.approx(-0.5)
    assert rows["first_gap"].measured_p50_s is None and rows["first_gap"].error("p50") is None
    assert rows["steady_gap"].error("p90") == pytest.approx(-0.5)
    assert rows["queue"].error("p50") == pytest.approx(-1.0)


def test_a_validation_keeps_its_measured_phases_and_a_resimulation_compares_them(tmp_path):
    from loadgen.metrics import SLO
    from loadgen.workload import RequestSpec
    from planner import validation_runs
    from planner.validation import handoff_table, phase_table, prompt_step_table, to_json

    profile_path = REPO / "planner" / "profiles" / "tiny_2cpu_served.json"
    sample = [RequestSpec(0.1 * i, 100, 6) for i in range(4)]
    phases = {"queue": [0.001, 0.002, math.nan, 0.001], "prefill": [0.02, 0.03, math.nan, 0.02],
              "first_gap": [0.01] * 3 + [math.nan], "steady_gap": [0.004] * 4}
    measured = {"median_ttft_ms": 25, "p90_ttft_ms": 30, "median_tpot_ms": 5, "p90_tpot_ms": 6, "slo_attainment": 1.0}
    # the run's join trace: two decode workers' handoffs (planner.validation_joins)
    # (decode-0's way in matched over 2 of its requests, decode-1's over its one)
    traced = {"workers": {"decode-0": {"handoff": {"requests": 3, "hops_ms": 2.0, "inside_ms": 8.0,
                                                   "hop_in_requests": 2, "hop_in_ms": 1.0}},
                          "decode-1": {"handoff": {"requests": 1, "hops_ms": 6.0, "inside_ms": 4.0,
                                                   "hop_in_requests": 1, "hop_in_ms": 4.0}}},
              # its prefill worker's prompt steps by the decode batch beside them (validation_steps)
              "prefill_workers": {"prefill-0": {"stretch_by_decode_batch": {
                  "0": {"steps": 3, "median_stretch": 1.5}, "2-3": {"steps": 1, "median_stretch": 2.5}}}}}
    runs = [validation_runs.RateRun(1.0, sample, measured | {"engine_steps": traced}, None, phases,
                                    {"ms_per_product": 3.1, "wake_us": 70.0})]
    setup = validation_runs.ValidationSetup("tiny", SLO(ttft_s=0.2, tpot_s=0.02), {"shape": "uniform"}, "tcp")
    comparisons = validation_runs.compare(runs, [profile_path], "tcp", setup.slo)
    assert [row.phase for row in comparisons[0].phases] == list(PHASES)
    validation_runs.write_validation(tmp_path, setup, [profile_path], runs, comparisons)

    _, again = validation_runs.load_earlier(tmp_path / "validation.json", default_transport="tcp")
    assert again[0].phases["queue"][:2] == [0.001, 0.002] and math.isnan(again[0].phases["queue"][2])
    assert again[0].machine == {"ms_per_product": 3.1, "wake_us": 70.0}   # the machine before the rate, kept
    assert validation_runs.compare(again, [profile_path], "tcp", setup.slo)[0].phases == comparisons[0].phases
    assert phase_table(comparisons, "phases").row_count == len(PHASES)
    # the handoff split: the trace's, weighted by each worker's requests, beside the simulator's
    handoff = to_json(comparisons)["runs"][0]["handoff_ms"]
    assert handoff["measured"] == {"hops": pytest.approx(3.0), "inside": pytest.approx(7.0), "hop_in": pytest.approx(2.0)}
    assert set(handoff["simulated"]) == {"hops", "inside", "hop_in"} and handoff["simulated"]["inside"] > 0
    # the prompt steps: the trace's beside the simulation's (its four prompts: one each, too few to read)
    assert to_json(comparisons)["runs"][0]["prompt_stretch"] == {"0": {"measured": 1.5, "simulated": None},
                                                                "2-3": {"measured": 2.5, "simulated": None}}
    assert prompt_step_table(comparisons, "prompts").row_count == 1
    assert "decode_stretch" not in to_json(comparisons)["runs"][0]       # no decode worker's rows traced
    assert again[0].measured["engine_steps"] == traced                     # kept, and back on a resimulation
    assert handoff_table(validation_runs.compare(again, [profile_path], "tcp", setup.slo), "handoff").row_count == 1
    assert phase_table([validation_runs.compare([validation_runs.RateRun(1.0, sample, measured, None)],
                                                [profile_path], "tcp", setup.slo)[0]], "none") is None


def test_the_machine_before_a_rate_is_said_against_the_profile():
    from planner.profile import HardwareInfo
    from planner.validation_speed import machine_against_profile

    profiled = HardwareInfo("cpu", 2, machine_ms_start=3.0, machine_ms_end=3.2, machine_product="bfloat16",
                            machine_wake_us_start=400.0, machine_wake_us_end=600.0)
    assert machine_against_profile({"ms_per_product": 3.1, "wake_us": 100.0}, profiled) == \
        "compute x1.00 of the profile's, wake-up x0.20 of the profile's"
    older = HardwareInfo("cpu", 2, machine_ms_start=3.0)
    assert machine_against_profile({"ms_per_product": 6.0, "wake_us": 100.0}, older) == \
        "compute x2.00 of the profile's, wake-up: the profile did not check"


def test_the_interpreter_over_a_rate_is_said_against_the_profiles_mean():
    from planner.profile import HardwareInfo
    from planner.validation_speed import machine_against_profile

    profiled = HardwareInfo("cpu", 2, machine_ms_start=3.0, machine_ms_end=3.0, machine_interp_ms=0.8)
    assert machine_against_profile({"ms_per_product": 3.0, "wake_us": 100.0, "interp_ms": 1.2}, profiled) == \
        "compute x1.00 of the profile's, wake-up: the profile did not check, interpreter x1.50 of the profile's"
    unsampled = HardwareInfo("cpu", 2, machine_ms_start=3.0)
    assert machine_against_profile({"ms_per_product": 3.0, "wake_us": 1.0, "interp_ms": 1.2}, unsampled).endswith(
        "interpreter: the profile did not check")
    bf16 = HardwareInfo("cpu", 2, machine_ms_start=3.0, machine_product="bfloat16")
    assert machine_against_profile({"ms_per_product": 6.0, "product": "float32"}, bf16) == \
        "compute: another product (float32) than the profile's (bfloat16)"


def test_a_rate_is_simulated_at_its_own_speed_prompts_by_the_compute_check_decodes_by_the_interpreter():
    from planner.perf_model import fit_perf_model
    from planner.profile import HardwareInfo
    from planner.validation_speed import at_run_speed, run_speed_factors
    from planner.profiles.example import build_example_profile

    profiled = HardwareInfo("cpu", 2, machine_ms_start=2.0, machine_ms_end=2.0, machine_interp_ms=0.8)
    assert run_speed_factors({"ms_per_product": 2.5, "wake_us": 90.0, "interp_ms": 1.2}, profiled) == \
        pytest.approx((1.25, 1.5))
    assert run_speed_factors({"ms_per_product": 2.5, "wake_us": 90.0}, profiled) == pytest.approx((1.25, 1.0))
    assert run_speed_factors(None, profiled) == (1.0, 1.0)
    assert run_speed_factors({"interp_ms": 1.2}, HardwareInfo("cpu", 2)) == (1.0, 1.0)   # the profile did not check
    named = {"ms_per_product": 2.5, "product": "float32", "interp_ms": 1.2}
    assert run_speed_factors(named, profiled) == pytest.approx((1.25, 1.5))   # the profile timed float32 too
    bf16 = HardwareInfo("cpu", 2, machine_ms_start=2.0, machine_ms_end=2.0, machine_interp_ms=0.8,
                        machine_product="bfloat16")
    assert run_speed_factors(named, bf16) == pytest.approx((1.0, 1.5))   # another product: no compute ratio
    model = fit_perf_model(build_example_profile()).model
    at_run = at_run_speed(model, {"ms_per_product": 2.5, "interp_ms": 1.2}, profiled)
    assert at_run.prefill_s(1000, 2048) == pytest.approx(1.25 * model.prefill_s(1000, 2048))
    assert at_run.decode_step_s(8, 2000) == pytest.approx(1.5 * model.decode_step_s(8, 2000))
    assert at_run_speed(model, None, profiled) is model


def test_the_measured_local_share_counts_served_requests_the_decode_worker_prefilled_itself():
    from dataclasses import replace

    from planner.validation_phases import measured_local_share

    local = replace(record(0, (0.1, 0.2), 0.01, 2), phases=PhaseTimings(0.01, 0.0, 0.0, 0, 0.0, disaggregated=False))
    handed_over = [record(i, (0.1, 0.2), 0.01, 2) for i in (1, 2, 3)]
    refused = record(4, (), None, 2, status="refused")
    assert measured_local_share([local, *handed_over, refused]) == pytest.approx(0.25)
    assert measured_local_share([refused, record(5, (0.1,), None, 1)]) is None   # no timings: nothing to say


def test_a_rate_replays_its_decode_cores_interpreter_second_by_second():
    from planner.perf_model import fit_perf_model
    from planner.profile import HardwareInfo
    from planner.profiles.example import build_example_profile
    from planner.simulator import SimSettings
    from planner.validation_runs import RateRun
    from planner.validation_speed import at_run_speed_as, decode_speed_of, run_speed_mode

    profiled = HardwareInfo("cpu", 2, machine_ms_start=2.0, machine_ms_end=2.0, machine_interp_ms=0.5)
    machine = {"ms_per_product": 2.5, "product": "float32", "interp_ms": 0.6,
               "interp_series_ms": {"0": [0.5, 0.5, 0.5], "1": [0.5, None, 1.0]}, "interp_window_s": 1.0}
    loads = [{"worker": "prefill-0", "cores": [0]}, {"worker": "decode-0", "cores": [1]}]
    run = RateRun(1.0, [], {}, None, machine=machine, core_loads=loads)
    # the decode worker's core 1: 1.0x, a window without a sample at its series' mean (0.75 ms), 2.0x
    assert decode_speed_of(run, profiled).series[0] == pytest.approx((1.0, 1.5, 2.0))
    both = RateRun(1.0, [], {}, None, machine=machine, core_loads=[{"worker": "decode-0", "cores": [0, 1]}])
    assert decode_speed_of(both, profiled).series[0] == pytest.approx((1.0, 1.0, 1.5))   # the mean of its cores
    assert decode_speed_of(RateRun(1.0, [], {}, None, machine=machine), profiled) is None   # no core loads
    assert decode_speed_of(run, HardwareInfo("cpu", 2)) is None   # the profile did not sample

    model = fit_perf_model(build_example_profile()).model
    settings = SimSettings.from_profile(build_example_profile())
    assert at_run_speed_as(None, settings, model, run, profiled) == (settings, model)
    replayed, prompts = at_run_speed_as("series", settings, model, run, profiled)
    assert replayed.decode_speed.series[0] == pytest.approx((1.0, 1.5, 2.0))
    assert prompts.prefill_s(1000, 2048) == pytest.approx(1.25 * model.prefill_s(1000, 2048))
    assert prompts.decode_step_s(8, 2000) == pytest.approx(model.decode_step_s(8, 2000))   # the series has them
    halved, _ = at_run_speed_as("series", settings, model, run, profiled, elasticity=0.5)
    assert halved.decode_speed.series[0] == pytest.approx((1.0, 1.5 ** 0.5, 2.0 ** 0.5))
    _, at_half = at_run_speed_as("mean", settings, model, run, profiled, elasticity=0.5)
    assert at_half.decode_step_s(8, 2000) == pytest.approx(1.2 ** 0.5 * model.decode_step_s(8, 2000))
    meaned, at_mean = at_run_speed_as("mean", settings, model, run, profiled)
    assert meaned.decode_speed is None and at_mean.decode_step_s(8, 2000) == pytest.approx(
        1.2 * model.decode_step_s(8, 2000))
    older = RateRun(1.0, [], {}, None, machine={"ms_per_product": 2.5, "interp_ms": 0.6}, core_loads=loads)
    assert at_run_speed_as("series", settings, model, older, profiled)[0].decode_speed is None   # at its mean
    assert [run_speed_mode(v) for v in (None, False, True, "mean", "series")] == [None, None, "mean", "mean", "series"]
    with pytest.raises(ValueError, match="at_run_speed must be one of"):
        run_speed_mode("seconds")


def test_a_rate_can_be_simulated_at_speeds_drawn_from_the_profiles_own_series():
    from planner.profile import HardwareInfo
    from planner.profiles.example import build_example_profile
    from planner.simulator import SimSettings, Topology
    from planner.validation_runs import RateRun, compare
    from planner.validation_speed import with_profile_speed
    from loadgen.workload import RequestSpec

    settings = SimSettings.from_profile(build_example_profile())
    sampled = HardwareInfo("cpu", 2, machine_interp_ms=0.5,
                           machine_interp_series_ms=((0, (0.5, 1.0) * 10), (1, (0.5,) * 20)))
    run = RateRun(2.0, [RequestSpec(0.0, 100, 10), RequestSpec(9.5, 100, 10)], {}, None)
    drawn = with_profile_speed(settings, sampled, Topology.disaggregated(1, 2), run).decode_speed
    assert len(drawn.series) == 2 and all(len(s) == 310 for s in drawn.series)   # 9.5 s + 300 s, 1 s windows
    assert set(drawn.series[0]) <= {1.0, 2.0}
    again = with_profile_speed(settings, sampled, Topology.disaggregated(1, 2), run).decode_speed
    assert again == drawn   # seeded by the rate: the same run draws the same speeds
    halved = with_profile_speed(settings, sampled, Topology.disaggregated(1, 2), run, elasticity=0.5).decode_speed
    assert halved.series[0] == pytest.approx(tuple(f ** 0.5 for f in drawn.series[0]))
    assert with_profile_speed(settings, HardwareInfo("cpu", 2, machine_interp_ms=0.5), Topology.disaggregated(1, 1),
                              run) is settings   # a profile without a series: as it is
    with pytest.raises(ValueError, match="ask for one"):
        compare([run], [], "tcp", None, what_if={"at_run_speed": "mean", "speed_from_profile": True})
