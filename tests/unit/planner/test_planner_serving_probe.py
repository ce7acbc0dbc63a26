"""The serving probe's plan, its CPU runs' arithmetic and its /proc readings, without a cluster (the batched
runs' fits: test_planner_stream_fit)."""

import os
import subprocess
import sys
import time

import pytest
from planner_testkit import ROUND_MODEL

from loadgen.proc_cpu import cpu_seconds, process_tree
from planner.profiler.serving_fit import (CpuRun, cpu_terms, long_prompt_requests, long_prompt_tokens, serving_plan,
                                          solve_per_prompt_token, solve_per_request_and_token)
from planner.profiler.stream_fit import BatchRun
from planner.serving_costs import ServingCosts


def test_per_request_and_per_token_cpu_solve_exactly_through_two_runs():
    # truth: 2 ms per request, 0.1 ms per token
    short = CpuRun(requests=10, tokens=20, cpu_s={"g": 10 * 0.002 + 20 * 0.0001})
    long = CpuRun(requests=10, tokens=320, cpu_s={"g": 10 * 0.002 + 320 * 0.0001})
    per_request, per_token = solve_per_request_and_token(short, long, "g")
    assert per_request == pytest.approx(0.002, abs=1e-12) and per_token == pytest.approx(0.0001, abs=1e-12)


def test_idle_cpu_is_netted_out_before_solving_so_a_slow_run_does_not_inflate_the_per_request_cost():
    # truth: 2 ms per request, 0.1 ms per token, plus 0.02 cores of idle work (timers, heartbeats);
    # the long run lasts 150 s, as a slow model's profiling run does, the short one 30 s
    idle = {"g": 0.02}
    short = CpuRun(10, 20, {"g": 10 * 0.002 + 20 * 0.0001 + 0.02 * 30}, wall_s=30)
    long = CpuRun(10, 320, {"g": 10 * 0.002 + 320 * 0.0001 + 0.02 * 150}, wall_s=150)
    inflated, _ = solve_per_request_and_token(short, long, "g")
    assert inflated > 0.04  # the idle CPU read as traffic: 20x the truth
    per_request, per_token = solve_per_request_and_token(short.net_of_idle(idle), long.net_of_idle(idle), "g")
    assert per_request == pytest.approx(0.002, abs=1e-9) and per_token == pytest.approx(0.0001, abs=1e-9)
    assert CpuRun(1, 1, {"g": 0.01}, wall_s=10).net_of_idle(idle).cpu_s == {"g": 0.0}  # never below 0


def test_noise_that_would_make_a_cost_negative_is_clamped_to_zero():
    short = CpuRun(10, 20, {"g": 0.05})
    long = CpuRun(10, 320, {"g": 0.04})  # fewer CPU seconds for more tokens: noise
    assert solve_per_request_and_token(short, long, "g") == (0.005, 0.0)


def test_runs_that_stream_the_same_tokens_cannot_separate_the_costs():
    with pytest.raises(ValueError, match="more tokens"):
        solve_per_request_and_token(CpuRun(10, 20, {"g": 1}), CpuRun(10, 20, {"g": 1}), "g")


def _run(requests: int, tokens: int, prompt_tokens: int, per_request: float, per_token: float,
         per_prompt_token: float) -> CpuRun:
    """A steady run whose groups cost that much (the prefill worker, which streams no output, no per token)."""
    cpu = requests * per_request + prompt_tokens * per_prompt_token
    return CpuRun(requests, tokens, {"decode": cpu + tokens * per_token, "host": cpu + tokens * per_token,
                                     "router": cpu + tokens * per_token, "prefill": cpu},
                  wall_s=10.0, prompt_tokens=prompt_tokens)


def test_a_per_prompt_token_cpu_solves_exactly_through_a_long_prompt_run():
    # 2 ms a request, 0.1 ms an output token, 5 us a prompt token; prompts of 128 and 1024 on average
    short, long = _run(10, 20, 1280, 0.002, 1e-4, 5e-6), _run(10, 320, 1280, 0.002, 1e-4, 5e-6)
    long_prompts = _run(16, 32, 16384, 0.002, 1e-4, 5e-6)
    per_request, per_token = solve_per_request_and_token(short, long, "host")
    assert per_token == pytest.approx(1e-4)
    assert per_request == pytest.approx(0.002 + 128 * 5e-6)   # without the third run: at the runs' prompts
    assert solve_per_prompt_token(short, long_prompts, "host", per_token) == pytest.approx((0.002, 5e-6))
    costs = cpu_terms(short, long, long_prompts, host_cores=2)
    assert costs.host_cpu_s_per_request == pytest.approx(0.002) and costs.host_cpu_s_per_prompt_token == pytest.approx(5e-6)
    assert costs.decode_cpu_s_per_prompt_token == pytest.approx(5e-6)
    # the prefill worker streams nothing: both short-prompt runs pool for its per-request term
    assert costs.prefill_cpu_s_per_request == pytest.approx(0.002)
    assert costs.prefill_cpu_s_per_prompt_token == pytest.approx(5e-6)
    assert costs.router_request_cpu_s(1024) == pytest.approx(0.002 + 1024 * 5e-6)


def test_without_a_long_prompt_run_the_per_request_cpu_holds_the_prompts_share_as_before():
    short, long = _run(10, 20, 1280, 0.002, 1e-4, 5e-6), _run(10, 320, 1280, 0.002, 1e-4, 5e-6)
    costs = cpu_terms(short, long, None, host_cores=2)
    assert costs.host_cpu_s_per_prompt_token == 0 and costs.prefill_cpu_s_per_prompt_token == 0
    assert costs.host_cpu_s_per_request == pytest.approx(0.002 + 128 * 5e-6)


def test_a_per_prompt_token_cpu_that_noise_makes_negative_is_zero_and_the_request_term_keeps_the_short_runs():
    short = _run(10, 20, 1280, 0.002, 0.0, 0.0)
    long_prompts = _run(10, 20, 10240, 0.0015, 0.0, 0.0)   # cheaper a request with longer prompts: noise
    assert solve_per_prompt_token(short, long_prompts, "host", 0.0) == pytest.approx((0.002, 0.0))
    with pytest.raises(ValueError, match="longer on average"):
        solve_per_prompt_token(short, short, "host", 0.0)


def test_the_prompt_cost_is_read_against_short_prompts_at_the_long_runs_rate_where_a_request_costs_more():
    # 2 ms a request at the main runs' rate, 5 ms at the long-prompt runs' lower one (wake-ups, idle
    # netted over a longer run); 3 us a prompt token
    short, long = _run(10, 20, 1280, 0.002, 1e-4, 3e-6), _run(10, 320, 1280, 0.002, 1e-4, 3e-6)
    long_prompts, reference = _run(16, 32, 16384, 0.005, 1e-4, 3e-6), _run(16, 32, 2048, 0.005, 1e-4, 3e-6)
    per_token = 1e-4
    # read against the short run, the slow rate's 3 ms a request pass for 3.4 us a prompt token too
    assert solve_per_prompt_token(short, long_prompts, "host", per_token)[1] == pytest.approx(3e-6 + 0.003 / 896)
    # against the same rate and count it cancels; the request term is the main runs' own
    assert solve_per_prompt_token(short, long_prompts, "host", per_token, reference) == pytest.approx((0.002, 3e-6))
    costs = cpu_terms(short, long, long_prompts, host_cores=2, reference=reference)
    assert costs.decode_cpu_s_per_request == pytest.approx(0.002) and costs.decode_cpu_s_per_prompt_token == pytest.approx(3e-6)
    assert costs.prefill_cpu_s_per_request == pytest.approx(0.002) and costs.prefill_cpu_s_per_prompt_token == pytest.approx(3e-6)
    # where the low rate costs less a request, the short run would hide the prompt's cost
    cheap = _run(16, 32, 16384, 0.0005, 1e-4, 1e-6)
    assert solve_per_prompt_token(short, cheap, "host", per_token)[1] == 0.0
    assert solve_per_prompt_token(short, cheap, "host", per_token, _run(16, 32, 2048, 0.0005, 1e-4, 1e-6)
                                  )[1] == pytest.approx(1e-6)


def test_the_plan_counts_the_long_prompt_runs_reference_among_its_steps():
    plan = serving_plan(max_model_len=2048, max_num_seqs=64, quick=True)
    assert plan.long_prompt_tokens == 1024
    assert plan.steps == 5 + len(plan.prompt_tokens) + len(plan.decode_batches)
    short_context = serving_plan(max_model_len=512, max_num_seqs=64, quick=True)   # no long-prompt runs
    assert short_context.steps == 3 + len(short_context.prompt_tokens) + len(short_context.decode_batches)


def test_the_long_prompt_run_takes_half_the_context_when_that_is_far_from_the_other_runs_prompts():
    assert long_prompt_tokens(128, 2048) == 1024
    assert long_prompt_tokens(128, 4096) == 2048
    assert long_prompt_tokens(128, 512) == 0      # 256 is too close to 128 to tell a slope from noise
    assert serving_plan(2048, 64, quick=False).long_prompt_tokens == 1024
    # about 40 s of requests at its rate, at least 30, at most the other runs' count (a quick plan's 24)
    assert long_prompt_requests(3.0, 60) == 60 and long_prompt_requests(1.2, 60) == 48
    assert long_prompt_requests(0.1, 60) == 30 and long_prompt_requests(0.1, 24) == 24


def test_a_process_tree_and_its_cpu_seconds_come_from_proc():
    spin = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\ntime.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c",
                               f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {spin!r}]); "
                               "time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while len(tree := process_tree(parent.pid)) < 2 or cpu_seconds(tree) < 0.3:
            assert time.monotonic() < deadline, f"tree {tree} never burned 0.3 CPU seconds"
            time.sleep(0.05)
        assert tree[0] == parent.pid and len(tree) == 2
        assert cpu_seconds(tree) >= 0.3 > cpu_seconds(tree[:1])  # the child did the work
        assert cpu_seconds([2**22 + os.getpid()]) == 0.0  # no such process
    finally:
        for pid in reversed(process_tree(parent.pid)):
            os.kill(pid, 9)
        parent.wait()


def test_a_probe_may_run_each_batch_size_more_often_but_a_quick_one_runs_each_once():
    from planner.profiler.serving_fit import BATCHES, serving_plan

    assert serving_plan(4096, 64, False, batch_repeats=4).decode_batches == BATCHES * 4
    assert serving_plan(4096, 64, False).decode_batches == BATCHES * 2
    assert serving_plan(4096, 16, True, batch_repeats=4).decode_batches == (1, 4, 16)


def test_lone_latencies_are_grouped_by_prompt_length_for_their_spread():
    from planner.profiler.serving_probe import by_length

    assert by_length([32, 32, 128, 32, 512], [1.0, 2.0, 3.0, 4.0, 5.0]) == [[1.0, 2.0, 4.0], [3.0], [5.0]]


def test_a_batched_run_whose_connection_broke_is_measured_again_not_the_profile_failed():
    import httpx

    from planner.profiler.serving_fit import ServingPlan
    from planner.profiler.batched_runs import measure_served_steps

    tried, notes = [], []

    async def run_batch(target, batch, vocab_size, host_cpu, seed, output_tokens, router_cpu=None):
        tried.append((batch, output_tokens))
        if batch == 4 and len(tried) == 2:   # a VM that stalled for longer than the connect timeout
            raise httpx.ConnectTimeout("")
        step_s = ROUND_MODEL.decode_step_s(batch, batch * 40)
        return BatchRun(batch, step_s, batch * 40, batch / step_s, 0.0, batch * output_tokens, (step_s,) * 4)

    plan = ServingPlan((32,), 1, 32, 10, (1, 4), max_output_tokens=2032)
    steps = measure_served_steps("t", None, ROUND_MODEL, (), ServingCosts(host_cores=2), 0.0, 1000, plan,
                                 lambda label, step=True: notes.append((label, step)), run_batch=run_batch)
    assert tried == [(1, 256), (4, 256), (4, 512)]
    assert [row[0] for row in steps.batch_runs] == [1.0, 4.0]   # both batch sizes measured, nothing skipped
    assert ("serving: batch 4: the connection broke (ConnectTimeout: ); again", False) in notes


def test_served_steps_retry_a_batch_that_never_decoded_together_and_skip_it_if_it_never_does():
    from planner.profiler.serving_fit import ServingPlan
    from planner.profiler.stream_fit import NoCommonWindow
    from planner.profiler.batched_runs import measure_served_steps

    tried, notes = [], []

    async def run_batch(target, batch, vocab_size, host_cpu, seed, output_tokens, router_cpu=None):
        tried.append((batch, output_tokens))
        if batch == 64 or (batch == 16 and output_tokens == 256):   # 16 joins at 512 tokens; 64 never does
            raise NoCommonWindow(f"the {batch} profiling requests never decoded together (window 0.000 s)")
        step_s = ROUND_MODEL.decode_step_s(batch, batch * 40)
        gaps = (step_s - 0.001, step_s, step_s, step_s + 0.004)   # one late wake-up in four gaps
        return BatchRun(batch, step_s, batch * 40, batch / step_s, 0.0, batch * output_tokens, gaps)

    plan = ServingPlan((32,), 1, 32, 10, (1, 16, 64), max_output_tokens=2032)
    host = ServingCosts(host_cores=2)
    steps = measure_served_steps("t", None, ROUND_MODEL, (), host, 0.0, 1000, plan,
                                 lambda label, step=True: notes.append((label, step)), run_batch=run_batch)
    assert tried == [(1, 256), (16, 256), (16, 512), (64, 256), (64, 512), (64, 1024)]
    assert steps.decode_step_s == pytest.approx(0.0, abs=1e-9)   # served = engine
    assert steps.decode_cpu_s_per_token == pytest.approx(0.0, abs=1e-9)
    # the spread pools both measured runs' gaps around each run's own median: 2 x (-1, 0, 0, +4) ms
    assert steps.spread_s[0] == pytest.approx(-0.001) and steps.spread_s[-1] == pytest.approx(0.004, abs=2e-4)
    assert steps.spread_s[len(steps.spread_s) // 2] == pytest.approx(0.0)
    assert [row[0] for row in steps.batch_runs] == [1.0, 16.0]   # the runs the fit used, kept for the profile
    assert ("serving: skipped batches [64] (never decoded together); fitted on the others", False) in notes
    assert sum(step for _, step in notes) == 3   # one progress step per planned batch, skipped or not

    async def never(*args, **kwargs):
        raise NoCommonWindow("never")

    with pytest.raises(RuntimeError, match=r"batches \[1, 16, 64\] never decoded together"):
        measure_served_steps("t", None, ROUND_MODEL, (), host, 0.0, 1000, plan, lambda *a, **k: None, run_batch=never)


def test_a_batch_whose_two_runs_disagree_is_measured_once_more_and_its_median_kept():
    from planner.profiler.serving_fit import ServingPlan
    from planner.profiler.batched_runs import measure_served_steps
    from planner.profiler.stream_fit import batches_to_measure_again, median_runs

    def run(batch: int, step_ms: float) -> BatchRun:
        return BatchRun(batch, step_ms / 1e3, batch * 40, batch / (step_ms / 1e3), 0.0, batch * 256)

    # 64: 16.0 against 10.6 ms (51% apart); 4: 5% apart; 1: measured once; 8: already three runs
    runs = [run(1, 3.0), run(4, 4.0), run(4, 4.2), run(64, 16.0), run(64, 10.6), run(8, 5.0), run(8, 9.0),
            run(8, 5.1)]
    assert batches_to_measure_again(runs) == [64]
    assert batches_to_measure_again(runs, spread=0.6) == []
    # a batch measured again keeps its run of the median step; one whose extra run failed keeps both
    third = run(64, 14.5)
    assert [r.step_s * 1e3 for r in median_runs(runs + [third], [64]) if r.batch == 64] == pytest.approx([14.5])
    assert median_runs(runs, [64]) == runs and len(median_runs(runs, [8])) == len(runs) - 2

    engine_64_s = ROUND_MODEL.decode_step_s(64, 64 * 40)
    steps_64_s = iter([engine_64_s + 0.200, engine_64_s + 0.010, engine_64_s + 0.080])   # 32% apart, then between
    tried, notes = [], []

    async def run_batch(target, batch, vocab_size, host_cpu, seed, output_tokens, router_cpu=None):
        tried.append((batch, seed))
        step_s = next(steps_64_s) if batch == 64 else ROUND_MODEL.decode_step_s(batch, batch * 40)
        return BatchRun(batch, step_s, batch * 40, batch / step_s, 0.0, batch * output_tokens, (step_s,) * 4)

    plan = ServingPlan((32,), 1, 32, 10, (1, 64, 1, 64), max_output_tokens=2032)
    steps = measure_served_steps("t", None, ROUND_MODEL, (), ServingCosts(host_cores=2), 0.0, 1000, plan,
                                 lambda label, step=True: notes.append((label, step)), run_batch=run_batch)
    assert tried == [(1, 100), (64, 101), (1, 102), (64, 103), (64, 200)]
    # batch 64's run of the median step fitted and kept alone; the spread still pools every run's gaps
    assert [row[0] for row in steps.batch_runs] == [1.0, 1.0, 64.0]
    assert steps.batch_runs[-1][1] == pytest.approx(engine_64_s + 0.080)
    assert dict(steps.extra_by_batch)[64.0] == pytest.approx(0.080)
    assert steps.decode_cpu_s_per_token == pytest.approx(0.080 / 63, rel=1e-6)   # the line through 0 at 1, 80 ms at 64
    assert any(label.startswith("serving: batch 64: its runs took") and "once more, the median kept" in label
               and not step for label, step in notes)
    assert sum(step for _, step in notes) == 4   # the extra run is no step of the plan's


def test_served_steps_of_one_batch_size_are_its_step_alone_and_said_so():
    """A server whose batched streams arrive in bursts (vLLM's, auto-bound on two vCPUs) leaves only
    the lone batch measurable: the profile gets its step, no per-token term, and a note, not a
    failed run."""
    from planner.profiler.serving_fit import ServingPlan
    from planner.profiler.stream_fit import NoCommonWindow
    from planner.profiler.batched_runs import measure_served_steps

    notes = []

    async def run_batch(target, batch, vocab_size, host_cpu, seed, output_tokens, router_cpu=None):
        if batch > 1:
            raise NoCommonWindow(f"the {batch} profiling requests never decoded together (window 0.000 s)")
        step_s = ROUND_MODEL.decode_step_s(1, 40) + 0.002   # served: 2 ms beyond the engine's step
        return BatchRun(1, step_s, 40, 1 / step_s, 0.0, output_tokens, (step_s, step_s))

    plan = ServingPlan((32,), 1, 32, 10, (1, 4, 16), max_output_tokens=2032)
    steps = measure_served_steps("t", None, ROUND_MODEL, (), ServingCosts(host_cores=2), 0.0, 1000, plan,
                                 lambda label, step=True: notes.append((label, step)), run_batch=run_batch)
    assert steps.decode_step_s == pytest.approx(0.002) and steps.decode_cpu_s_per_token == 0.0
    assert any("only batch 1 decoded together (batches [4, 16] never did" in label for label, _ in notes)
    assert sum(step for _, step in notes) == 3



def test_a_lone_handoff_splits_into_the_traced_way_in_and_what_the_idle_engine_added():
    from planner.profiler.serving_fit import split_lone_handoff

    # 9 ms of handoff beyond the simulator's pull and step, 6 ms of it the Decode call's way in
    assert split_lone_handoff(0.009, 0.006) == pytest.approx((0.006, 0.003))
    # untraced: all of it is the hop, as in a profile measured before
    assert split_lone_handoff(0.009, None) == (0.009, 0.0)
    # a way in longer than the whole (the netting's noise): no negative idle join
    assert split_lone_handoff(0.004, 0.006) == pytest.approx((0.006, 0.0))
    assert split_lone_handoff(-0.001, None) == (0.0, 0.0)


def test_the_traced_way_in_is_the_median_over_the_window_of_the_decode_workers_front_end(tmp_path):
    from pdserve.engine_step_trace import JOIN_COLUMNS
    from planner.profiler.serving_probe import traced_way_in_s

    def write(name: str, rows: list[tuple]) -> None:
        lines = [",".join(JOIN_COLUMNS)] + [",".join(str(v) for v in row) for row in rows]
        (tmp_path / name).write_text("\n".join(lines) + "\n")

    # prefill-0 computed a, b and c (their first tokens at 1.000, 2.000, 3.000); decode-1 pulled them,
    # its front end taking each 5, 7 and 30 ms later; c came after the window
    write("joins-prefill-0-11.csv", [(f"{r}-0a1b2c3d", 100, t - 0.1, t - 0.09, "nan", t - 0.05, t)
                                     for r, t in (("a", 1.0), ("b", 2.0), ("c", 3.0))])
    write("joins-decode-1-12.csv", [(f"{r}-9f8e7d6c", 100, t + way, t + way + 0.001, t + way + 0.004,
                                     t + way + 0.005, t + way + 0.009)
                                    for r, t, way in (("a", 1.0, 0.005), ("b", 2.0, 0.007), ("c", 3.0, 0.030))])
    assert traced_way_in_s(tmp_path, "prefill-0", "decode-1", 0.5, 2.5) == pytest.approx(0.006)
    assert traced_way_in_s(tmp_path, "prefill-0", "decode-1", 5.0, 6.0) is None    # none in the window
    assert traced_way_in_s(tmp_path / "none", "prefill-0", "decode-1", 0.5, 2.5) is None   # no trace written
