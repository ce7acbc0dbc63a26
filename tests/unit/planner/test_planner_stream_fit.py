"""The batched runs' fits of the serving probe (`planner.profiler.stream_fit`): the unbound processes'
CPU per streaming step and token, the served decode step over the engine's, and the windows a
batched run is read in, on plain values."""

import statistics
from dataclasses import replace

import pytest
from planner_testkit import ROUND_MODEL

from planner.profile import DecodeSample
from planner.profiler.stream_fit import (BatchRun, StreamCpu, StreamWindow, engine_step_s, fit_served_steps,
                                         nonnegative_lstsq, stream_cpu_terms, usable_window)
from planner.serving_costs import ServingCosts
from planner.simulator.host import stretch_for_load


def batch_run(batch: int, served_s: float, tokens_per_s: float = 100.0, host_cpu_s: float = 0.0,
              tokens: int = 1000) -> BatchRun:
    return BatchRun(batch, served_s, context_tokens=batch * 40, tokens_per_s=tokens_per_s, host_cpu_s=host_cpu_s,
                    tokens=tokens)


def _windowed(batch: int, seconds: float, w_host: float, t_host: float, w_router: float, t_router: float,
              idle_host: float = 0.0, idle_router: float = 0.0) -> BatchRun:
    tokens_per_s = 1000.0 * batch / (batch + 10)  # the step slows as the batch grows
    tokens = round(tokens_per_s * seconds)
    steps = tokens / batch
    window = StreamWindow(seconds, tokens, w_host * steps + t_host * tokens + idle_host * seconds,
                          w_router * steps + t_router * tokens + idle_router * seconds)
    return replace(batch_run(batch, 0.01, tokens_per_s=tokens_per_s), window=window)


def test_the_unbound_cpu_is_fitted_per_streaming_step_and_per_token_over_every_batchs_window_net_of_idle():
    runs = [_windowed(b, 3.0, 0.0012, 0.0004, 0.0005, 0.00023, idle_host=0.02, idle_router=0.01)
            for b in (1, 4, 8, 16, 32, 64)]
    terms = stream_cpu_terms(runs, idle_host_cores=0.02, idle_router_cores=0.01)
    assert (terms.host_per_step_s, terms.host_per_token_s) == pytest.approx((0.0012, 0.0004), rel=1e-6)
    assert (terms.router_per_step_s, terms.router_per_token_s) == pytest.approx((0.0005, 0.00023), rel=1e-6)
    # the load it implies at batch 4, 100 tokens/s: 25 wake-ups and 100 tokens a second
    assert terms.host_load_cores(100.0, 4) == pytest.approx(
        (25 * 0.0007 + 100 * 0.00017, 25 * 0.0005 + 100 * 0.00023), rel=1e-9)
    # the router's part never exceeds the host's, whatever the noise
    noisy = stream_cpu_terms([_windowed(b, 3.0, 0.0002, 0.0001, 0.0005, 0.0002) for b in (1, 8, 64)])
    assert noisy.router_per_step_s <= noisy.host_per_step_s and noisy.router_per_token_s <= noisy.host_per_token_s


def test_windows_too_short_or_too_idle_to_measure_are_left_out_of_the_fit():
    good = [_windowed(b, 3.0, 0.0012, 0.0004, 0.0005, 0.00023, idle_host=0.02, idle_router=0.01) for b in (1, 8, 64)]
    # a batch of 64 whose window held 5 steps, and a window whose CPU /proc could not tell from idle
    short = replace(good[2], window=StreamWindow(0.05, 5 * 64, 1.0, 0.5))
    idle = replace(good[0], window=StreamWindow(3.0, 300, 0.02, 0.0))
    assert not usable_window(64, short.window) and not usable_window(1, idle.window)
    assert usable_window(8, good[1].window) and not usable_window(8, None)
    terms = stream_cpu_terms([*good, short, idle], idle_host_cores=0.02, idle_router_cores=0.01)
    assert (terms.router_per_step_s, terms.router_per_token_s) == pytest.approx((0.0005, 0.00023), rel=1e-6)
    # runs with windows are fitted on when they cover two batch sizes, whatever the runs without
    mixed = stream_cpu_terms([good[0], good[2], batch_run(16, 0.01)], idle_host_cores=0.02, idle_router_cores=0.01)
    assert mixed.host_per_step_s == pytest.approx(0.0012, rel=1e-6)


def test_nonnegative_least_squares_drops_a_column_that_would_go_negative():
    x = [[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]]
    assert nonnegative_lstsq(x, [3.0, 5.0, 7.0]) == pytest.approx([2.0, 1.0])
    kept = nonnegative_lstsq(x, [1.0, 0.5, 0.0])  # the slope alone would be negative: the constant alone
    assert kept[0] == 0.0 and kept[1] == pytest.approx(0.5)


def test_runs_without_a_window_fall_back_to_the_largest_batchs_cost_per_token():
    runs = [BatchRun(32, 0.0, 32 * 40, 4000, 0.032 + 0.8, 2000, router_cpu_s=0.032 + 0.5),
            replace(batch_run(4, 0.01), window=StreamWindow(1.0, 100, 0.05, 0.02))]
    assert stream_cpu_terms(runs, router_cpu_s_per_request=0.001) == StreamCpu(
        host_per_token_s=pytest.approx(0.0004), router_per_token_s=pytest.approx(0.00025))
    assert stream_cpu_terms([]) == StreamCpu()


def test_the_window_reader_opens_at_the_last_second_token_and_closes_at_the_first_end():
    from planner.profiler.batched_runs import StreamWindowReader

    cpu = {"host": 0.0}
    reader = StreamWindowReader(2, host_cpu=lambda: cpu["host"], router_cpu=lambda: cpu["host"] / 2)
    assert reader.window([[0.0], [0.0]]) is None  # never opened
    reader.second_token()
    assert reader.start is None  # one of two streams past its second token
    cpu["host"] = 1.0
    reader.second_token()
    cpu["host"] = 1.6
    reader.ended()
    reader.ended()  # the second stream's end changes nothing
    start, end = reader.start[0], reader.end[0]
    inside = [start + (end - start) * f for f in (0.25, 0.5, 1.0)]
    window = reader.window([[start - 1.0, *inside], [start - 0.5, inside[0]]])
    assert (window.tokens, window.host_cpu_s, window.router_cpu_s) == (4, pytest.approx(0.6), pytest.approx(0.3))
    assert window.seconds == pytest.approx(end - start)


def test_served_steps_fit_a_per_step_and_a_per_token_cost_over_the_engine():
    # truth: 1.5 ms per step and 0.2 ms per token of the batch on top of the engine's step
    runs = [batch_run(b, ROUND_MODEL.decode_step_s(b, b * 40) + 0.0015 + 0.0002 * b) for b in (1, 4, 12, 32)]
    step_s, per_token_s, host_per_token_s = fit_served_steps(runs, ROUND_MODEL, ServingCosts())
    assert step_s == pytest.approx(0.0015, abs=1e-9) and per_token_s == pytest.approx(0.0002, abs=1e-9)
    assert host_per_token_s == 0.0


def test_a_serving_cost_that_falls_with_the_batch_is_all_per_step():
    # wake-ups amortised better than linearly: the fit must not return a negative per-token cost
    runs = [batch_run(b, ROUND_MODEL.decode_step_s(b, b * 40) + extra) for b, extra in ((1, 0.003), (8, 0.002))]
    step_s, per_token_s, _ = fit_served_steps(runs, ROUND_MODEL, ServingCosts())
    assert per_token_s == 0.0 and step_s == pytest.approx(0.0025, abs=1e-9)


def test_the_host_cpu_per_token_comes_from_the_largest_batch_and_its_stretch_is_not_counted_twice():
    host = ServingCosts(host_cpu_s_per_request=0.003, host_cores=2)  # with the load generator's share
    # largest batch: the router's 1 ms x 32 requests (0.032 s) + 2000 tokens at 0.4 ms (0.8 s) -> 0.4 ms/token
    # at 4000 tokens/s that is 1.6 cores of load; one core is idle, so the stepping one is shared
    stretch = stretch_for_load(0.0004 * 4000, 2, busy_cores=1)
    assert stretch == pytest.approx(1 / (1 - 0.6))
    runs = [batch_run(1, ROUND_MODEL.decode_step_s(1, 40) + 0.001, tokens_per_s=10, host_cpu_s=0.0, tokens=50),
            batch_run(32, (ROUND_MODEL.decode_step_s(32, 32 * 40) + 0.001) * stretch, tokens_per_s=4000,
                      host_cpu_s=0.032 + 0.8, tokens=2000)]
    step_s, per_token_s, host_per_token_s = fit_served_steps(runs, ROUND_MODEL, host, router_cpu_s_per_request=0.001)
    assert host_per_token_s == pytest.approx(0.0004, abs=1e-12)
    assert step_s == pytest.approx(0.001, abs=1e-9) and per_token_s == pytest.approx(0.0, abs=1e-9)


def test_the_routers_part_of_the_host_cpu_is_measured_apart_and_its_load_kept_on_the_prefill_core():
    from planner.profiler.stream_fit import unbound_cpu_per_token

    # largest batch: host 0.8 s over 2000 tokens after the router's 1 ms x 32 requests, the router's
    # own 0.032 + 0.5 s of it -> 0.4 ms/token in all, 0.25 of it the router's
    big = BatchRun(32, 0.0, 32 * 40, 4000, 0.032 + 0.8, 2000, router_cpu_s=0.032 + 0.5)
    assert unbound_cpu_per_token([big], 0.001) == pytest.approx((0.0004, 0.00025), abs=1e-12)
    # noise that puts the router above the host is capped at the host's
    assert unbound_cpu_per_token([replace(big, router_cpu_s=2.0)], 0.001) == pytest.approx((0.0004, 0.0004), abs=1e-12)
    # all of it the router's, 1.2 cores at 4000 tokens/s: bound to the idle prefill core it does not
    # stretch the decode step (the served steps are the engine's + 1 ms); floating, 0.2 cores of it
    # would have, and the fit would read the steps as cheaper than they are
    runs = [batch_run(1, ROUND_MODEL.decode_step_s(1, 40) + 0.001, tokens_per_s=10, tokens=50),
            BatchRun(32, ROUND_MODEL.decode_step_s(32, 32 * 40) + 0.001, 32 * 40, 4000, 0.032 + 0.6, 2000,
                     router_cpu_s=0.032 + 0.6)]
    step_s, per_token_s, host_per_token_s = fit_served_steps(runs, ROUND_MODEL, ServingCosts(host_cores=2), 0.001)
    assert host_per_token_s == pytest.approx(0.0003, abs=1e-12)
    assert step_s == pytest.approx(0.001, abs=1e-9) and per_token_s == pytest.approx(0.0, abs=1e-9)
    floating = [runs[0], replace(runs[1], router_cpu_s=0.0)]
    step_floating, _, _ = fit_served_steps(floating, ROUND_MODEL, ServingCosts(host_cores=2), 0.001)
    assert step_floating < 0.0009  # the big run's step divided by a 1.25x stretch it did not have


def test_an_engine_over_every_core_is_netted_of_the_front_ends_whole_load():
    """vLLM's server: one engine over both cores, its front end floating. The served step is net of
    the team stretch the simulator charges it (the load on either core holds both), not of a stretch
    that a one-core engine with an idle core beside it would have had (none)."""
    stream = StreamCpu(host_per_step_s=0.0, host_per_token_s=0.0001)   # 10 streams at 1000 tokens/s: 0.1 cores
    engine_s = ROUND_MODEL.decode_step_s(10, 400)
    run = BatchRun(10, engine_s / (1 - 0.1) + 0.001, 400, 1000, 0.0, 2000)
    step_s, _, _ = fit_served_steps([run], ROUND_MODEL, ServingCosts(host_cores=2), stream=stream, engine_cores=2)
    assert step_s == pytest.approx((engine_s / 0.9 + 0.001) * 0.9 - engine_s, abs=1e-12)   # 0.9 ms
    one_core, _, _ = fit_served_steps([run], ROUND_MODEL, ServingCosts(host_cores=2), stream=stream)
    assert one_core == pytest.approx(engine_s / 0.9 + 0.001 - engine_s, abs=1e-12)   # the load on the idle core: no stretch
    assert stream.decode_stretch(1000, 10, 2, engine_cores=2) == pytest.approx(1 / 0.9, abs=1e-12)
    assert stream.decode_stretch(1000, 10, 2) == 1.0


def test_the_engine_step_a_served_step_is_compared_with_is_the_measured_row_moved_along_the_context():
    rows = (DecodeSample(8, 200, 0.050), DecodeSample(8, 4000, 0.500), DecodeSample(16, 400, 0.090))
    # nearest row at batch 8 (context 200), plus the model's 1e-4 s per context token for 100 more
    assert engine_step_s(8, 300, ROUND_MODEL, rows) == pytest.approx(0.050 + 100 * 1e-4)
    assert engine_step_s(8, 3900, ROUND_MODEL, rows) == pytest.approx(0.500 - 100 * 1e-4)
    assert engine_step_s(4, 160, ROUND_MODEL, rows) == ROUND_MODEL.decode_step_s(4, 160)  # no row: the model


def test_where_the_fit_misses_the_engine_the_miss_is_not_read_as_serving_cost():
    # the engine really costs 1 ms more per sequence at these short contexts than the model says;
    # serving adds 1.5 ms per step and 0.2 ms per token on top of the real engine
    def real_engine(b: int) -> float:
        return ROUND_MODEL.decode_step_s(b, b * 40) + 0.001 * b

    runs = [batch_run(b, real_engine(b) + 0.0015 + 0.0002 * b) for b in (1, 4, 12, 32)]
    rows = [DecodeSample(b, b * 40, real_engine(b)) for b in (1, 4, 12, 32)]
    step_s, per_token_s, _ = fit_served_steps(runs, ROUND_MODEL, ServingCosts(), engine_rows=rows)
    assert step_s == pytest.approx(0.0015, abs=1e-9) and per_token_s == pytest.approx(0.0002, abs=1e-9)
    _, per_token_against_the_fit, _ = fit_served_steps(runs, ROUND_MODEL, ServingCosts())
    assert per_token_against_the_fit == pytest.approx(0.0012, abs=1e-9)  # what the fit alone misreads


def test_a_batched_run_whose_requests_never_decoded_together_is_named_not_measured():
    from planner.profiler.stream_fit import NoCommonWindow, common_window

    # token times of 3 requests: all three decode together between 1.0 and 1.3
    together = [[0.0, 1.0, 1.1, 1.2, 1.3], [0.1, 0.9, 1.05, 1.15, 1.35], [0.2, 0.95, 1.0, 1.1, 1.4]]
    start, end, gaps = common_window(together)
    assert (start, end) == (1.0, 1.3) and len(gaps) >= 3
    # the first finished (0.5) before the last had its second token (0.9): no common window
    apart = [[0.0, 0.2, 0.3, 0.5], [0.1, 0.9, 1.0, 1.1]]
    with pytest.raises(NoCommonWindow, match="the 2 profiling requests never decoded together"):
        common_window(apart)


def test_a_batched_run_is_read_off_its_token_times_in_the_late_half_of_the_common_window():
    from planner.profiler.stream_fit import BATCH_PROMPT_TOKENS, batch_run_of

    # two requests stepping every 10 ms, then 20 ms once settled; both decode together from 1.01 to
    # 1.09: the settled half is 1.05-1.09, and its steps (20 ms) are what the run reads
    first = [1.00, 1.01, 1.02, 1.03, 1.04, 1.05, 1.07, 1.09, 1.11]
    second = [0.99, 1.01, 1.02, 1.03, 1.04, 1.05, 1.07, 1.09]
    run = batch_run_of(2, [first, second], host_cpu_s=0.3, router_cpu_s=0.1)
    assert run.batch == 2 and run.step_s == pytest.approx(0.02)
    assert len(run.gaps_s) == 4 and all(g == pytest.approx(0.02) for g in run.gaps_s)
    assert run.tokens == 17 and run.tokens_per_s == pytest.approx(6 / 0.04)   # 3 tokens each inside 1.05-1.09
    assert run.context_tokens == 2 * (BATCH_PROMPT_TOKENS + 7)   # each had 7 tokens by the half's middle, 1.07 s
    assert (run.host_cpu_s, run.router_cpu_s) == (0.3, 0.1)


def test_a_window_too_short_to_settle_is_named_not_measured():
    from planner.profiler.stream_fit import NoCommonWindow, settled_window

    # together from 1.0 to 1.1: a late half of 50 ms holds one gap of the two requests'
    brief = [[0.0, 1.0, 1.06, 1.1], [0.05, 0.9, 1.0, 1.11]]
    with pytest.raises(NoCommonWindow, match="decoded together too briefly to read a settled step"):
        settled_window(brief)


def test_a_batched_run_is_retried_with_longer_outputs_within_the_context():
    from planner.profiler.stream_fit import batch_output_attempts

    assert batch_output_attempts(2032) == [256, 512, 1024]
    assert batch_output_attempts(600) == [256, 512]
    assert batch_output_attempts(200) == [200]   # a context too short for the default: what it holds


def test_the_runs_a_profile_keeps_refit_to_the_terms_fitted_when_measured(tmp_path):
    from planner.profile import ProfileError, load_profile, save_profile
    from planner.profiles.example import build_example_profile
    from planner.profiler.served_refit import kept_batch_runs, kept_row

    stream = StreamCpu(host_per_step_s=0.0004, host_per_token_s=0.0001, router_per_step_s=0.0002, router_per_token_s=5e-5)
    host = ServingCosts(host_cores=2)
    runs = [batch_run(b, 1.1 * (ROUND_MODEL.decode_step_s(b, b * 40) + 0.001 + 0.00015 * b), tokens_per_s=200.0 * b ** 0.5)
            for b in (1, 4, 8, 16, 32, 64)]
    fitted = fit_served_steps(runs, ROUND_MODEL, host, stream=stream)
    kept = replace(host, host_cpu_s_per_step=0.0004, host_cpu_s_per_token=0.0001, router_cpu_s_per_step=0.0002,
                   router_cpu_s_per_token=5e-5, served_batch_runs=[list(kept_row(run)) for run in runs])  # as JSON gives it
    assert kept.served_batch_runs[2] == (8.0, runs[2].step_s, 320.0, runs[2].tokens_per_s)
    assert fit_served_steps(kept_batch_runs(kept), ROUND_MODEL, kept, stream=StreamCpu.of(kept)) == pytest.approx(fitted)
    profile = replace(build_example_profile(), serving=kept)
    save_profile(profile, tmp_path / "kept.json")
    assert load_profile(tmp_path / "kept.json") == profile   # the file keeps them
    with pytest.raises(ProfileError, match="served_batch_runs"):
        ServingCosts(served_batch_runs=[[0, 0.01, 10, 100]])   # a batch of none
    with pytest.raises(ProfileError, match="served_batch_runs"):
        ServingCosts(served_batch_runs=[[4, 0.01, 10]])


def test_the_served_extra_is_kept_per_batch_as_the_median_of_its_runs_and_never_below_zero():
    from planner.profiler.stream_fit import served_extra_by_batch

    table = served_extra_by_batch([4, 1, 4, 1, 4, 64], [0.002, 0.0004, 0.001, 0.0002, 0.0009, -0.001])
    assert [b for b, _ in table] == [1.0, 4.0, 64.0]
    assert [s for _, s in table] == pytest.approx([0.0003, 0.001, 0.0])
    with pytest.raises(ValueError, match="2 batches but 1"):
        served_extra_by_batch([1, 4], [0.001])


def convex_runs(host: ServingCosts) -> tuple[list[BatchRun], dict[int, float]]:
    """Runs whose serving extra is a fixed part and then grows faster than the batch (as measured
    on an AMX Xeon: 0.4 ms at batch 1, 8.7 at 64), two per batch, on an idle host (stretch 1)."""
    extra = {1: 0.0004, 4: 0.0005, 8: 0.0006, 16: 0.001, 32: 0.003, 64: 0.009}
    runs = [batch_run(b, ROUND_MODEL.decode_step_s(b, b * 40) + extra_s * factor)
            for b, extra_s in extra.items() for factor in (0.9, 1.1)]
    return runs, extra


def test_a_table_by_batch_charges_a_convex_extra_where_a_line_through_it_misses():
    from planner.profiler.stream_fit import served_extra_by_batch, served_residuals_s, served_step_error

    host = ServingCosts(host_cores=0)   # the host not modelled: every stretch is 1
    runs, extra = convex_runs(host)
    residuals = served_residuals_s(runs, ROUND_MODEL, host.host_cores, StreamCpu.of(host))
    table = served_extra_by_batch([run.batch for run in runs], residuals)
    assert [b for b, _ in table] == list(extra)
    assert [s for _, s in table] == pytest.approx(list(extra.values()))   # the two runs' mean is the median
    step_s, per_token_s, _ = fit_served_steps(runs, ROUND_MODEL, host)
    line = replace(host, decode_step_s=step_s, decode_cpu_s_per_token=per_token_s)
    by_table = served_step_error(runs, ROUND_MODEL, replace(line, served_step_extra_s=table), by_batch=True)
    by_line = served_step_error(runs, ROUND_MODEL, line, by_batch=False)
    # the table misses each run by its own scatter around the batch's median (|0.1 x extra| over the step)
    scatter = statistics.mean(0.1 * s / (ROUND_MODEL.decode_step_s(b, b * 40) + s * f)
                              for b, s in extra.items() for f in (0.9, 1.1))
    assert by_table == pytest.approx(scatter, rel=1e-9)
    assert by_line > 2 * by_table


def test_a_profile_measured_with_a_line_is_refitted_to_a_table_and_nothing_else_changes():
    from planner.profiler.served_refit import kept_row, with_served_table

    host = ServingCosts(host_cores=0)
    runs, extra = convex_runs(host)
    step_s, per_token_s, _ = fit_served_steps(runs, ROUND_MODEL, host)
    old = replace(host, decode_step_s=step_s, decode_cpu_s_per_token=per_token_s, handoff_s=0.005,
                  served_batch_runs=tuple(kept_row(run) for run in runs))
    new = with_served_table(old, ROUND_MODEL)
    assert [b for b, _ in new.served_step_extra_s] == [1, 4, 8, 16, 32, 64]
    assert new.decode_serving_s(1, by_batch=True) == pytest.approx(extra[1])
    assert new.decode_serving_s(1, by_batch=False) == old.decode_serving_s(1, by_batch=False)   # the line as it was
    assert replace(new, served_step_extra_s=()) == old   # and every other term
    assert with_served_table(host, ROUND_MODEL) is host   # nothing kept, nothing to refit


def test_a_served_step_netted_for_the_woken_client_loses_the_clients_share_of_the_decode_core():
    """The router bound to the idle prefill core, the client's 0.3 cores placed as Linux wakes it
    (`wake_share_on_router`): part of it on the decode core, whose steps it stretched. Netted with
    that placement the fit takes the stretch out; with "router-room" (all of it on the prefill core)
    it reads that share as serving cost. `renetted` fits a profile's kept runs again for another
    placement and keeps which; without kept runs it cannot."""
    from planner.profiler.served_refit import renetted
    from planner.simulator.host import wake_share_on_router

    stream = StreamCpu(host_per_token_s=0.0005, router_per_token_s=0.0002)   # at 1000 tokens/s: router 0.2, client 0.3
    on_decode = 0.3 - wake_share_on_router(0.3, 0.2, 0, 1)
    runs = [BatchRun(b, (ROUND_MODEL.decode_step_s(b, b * 40) + 0.001 + 0.0001 * b) / (1 - on_decode), b * 40, 1000.0,
                     0.0, 2000) for b in (1, 4, 16)]
    host = ServingCosts(host_cores=2, host_cpu_s_per_token=0.0005, router_cpu_s_per_token=0.0002)
    step_s, per_token_s, _ = fit_served_steps(runs, ROUND_MODEL, host, stream=stream, client_placement="wake")
    assert (step_s, per_token_s) == pytest.approx((0.001, 0.0001), abs=1e-9)
    room_step_s, room_per_token_s, _ = fit_served_steps(runs, ROUND_MODEL, host, stream=stream)
    assert room_step_s + 4 * room_per_token_s > 0.001 + 4 * 0.0001 + 1e-4   # the stretch read as serving

    kept = replace(host, decode_step_s=room_step_s, decode_cpu_s_per_token=room_per_token_s, served_step_extra_s=(
        (1.0, 0.0), (4.0, 0.0), (16.0, 0.0)), served_batch_runs=tuple((float(r.batch), r.step_s, r.context_tokens,
                                                                         r.tokens_per_s) for r in runs))
    woken = renetted(kept, ROUND_MODEL, "wake")
    assert woken.client_placement == "wake" and woken.host_cpu_s_per_token == kept.host_cpu_s_per_token
    assert (woken.decode_step_s, woken.decode_cpu_s_per_token) == pytest.approx((0.001, 0.0001), abs=1e-9)
    assert [extra for _, extra in woken.served_step_extra_s] == pytest.approx([0.0011, 0.0014, 0.0026], abs=1e-9)
    assert renetted(woken, ROUND_MODEL, "wake") is woken
    assert renetted(woken, ROUND_MODEL, "router-room").decode_step_s == pytest.approx(room_step_s, abs=1e-12)
    with pytest.raises(ValueError, match="no batched runs were kept"):
        renetted(replace(kept, served_batch_runs=()), ROUND_MODEL, "wake")


def test_the_profiles_served_step_line_says_where_the_client_was_placed_when_it_was_netted():
    from planner.profiler.summary import served_step_line

    runs = ((1.0, 0.0035, 40.0, 280.0), (8.0, 0.0110, 320.0, 720.0))
    costs = ServingCosts(decode_step_s=0.001, decode_cpu_s_per_token=0.0001, served_batch_runs=runs,
                         served_step_extra_s=((1.0, 0.0011), (8.0, 0.0018)), client_placement="wake")
    line = served_step_line(costs, ROUND_MODEL, ())
    assert "b1 +1.10, b8 +1.80" in line and "client placed 'wake'" in line
    assert served_step_line(replace(costs, served_batch_runs=()), ROUND_MODEL, ()) == ""
