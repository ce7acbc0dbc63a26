"""`planner.profile_merge`: several profiles of one setup taken point by point, with plain values:
the example profile slowed by known factors, and serving terms written out by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.profile import DecodeSample, HardwareInfo, PrefillSample, ProfileError, load_profile, save_profile
from planner.profile_merge import merged_by_batch, merged_profile, merged_serving, merged_spread
from planner.profiles.example import build_example_profile
from planner.serving_costs import ServingCosts

BASE = build_example_profile()


def slowed(factor: float, created_at: str, **changes):
    """The example profile with every engine row `factor` times as long, each row timed."""
    return replace(BASE, created_at=created_at,
                   prefill=tuple(PrefillSample(r.prompt_tokens, r.chunk_tokens, r.prefill_s * factor, 5.0, 6.0)
                                 for r in BASE.prefill),
                   decode=tuple(DecodeSample(r.batch_size, r.context_tokens, r.step_s * factor, 7.0, 8.0)
                                for r in BASE.decode), **changes)


def test_each_row_is_the_median_of_the_profiles_and_forgets_when_it_was_read():
    merged = merged_profile([slowed(1.5, "b"), slowed(1.0, "a"), slowed(1.2, "c")])
    assert [r.prefill_s for r in merged.prefill] == pytest.approx([r.prefill_s * 1.2 for r in BASE.prefill])
    assert [r.step_s for r in merged.decode] == pytest.approx([r.step_s * 1.2 for r in BASE.decode])
    assert [(r.batch_size, r.context_tokens) for r in merged.decode] == [(r.batch_size, r.context_tokens)
                                                                         for r in BASE.decode]
    assert all((r.start_s, r.end_s) == (0.0, 0.0) for r in (*merged.prefill, *merged.decode))
    assert merged.kv_transfer == BASE.kv_transfer      # the same rows in each: the same row out
    assert merged.created_at == "c" and "median of 3 profiles (created b, a, c)" in merged.notes
    # two profiles: their mean
    two = merged_profile([slowed(1.0, "a"), slowed(2.0, "b")])
    assert two.decode[0].step_s == pytest.approx(1.5 * BASE.decode[0].step_s)


def test_a_row_most_profiles_lack_stays_out_and_one_most_have_stays_in():
    extra = DecodeSample(3, 300, 0.5)
    merged = merged_profile([replace(BASE, decode=BASE.decode + (extra,)), BASE, BASE])
    assert extra.batch_size not in {r.batch_size for r in merged.decode}
    merged = merged_profile([replace(BASE, decode=BASE.decode + (extra,)),
                             replace(BASE, decode=BASE.decode + (replace(extra, step_s=0.7),)), BASE])
    assert [r.step_s for r in merged.decode if r.batch_size == 3] == [pytest.approx(0.6)]   # over the two with it


def test_serving_terms_are_medians_and_a_routers_part_stays_within_its_hosts():
    def costs(k: float, **more) -> ServingCosts:
        return ServingCosts(first_token_s=0.010 * k, decode_step_s=0.002 * k, host_cores=2,
                            host_cpu_s_per_token=0.001 * k, router_cpu_s_per_token=0.0009 * k, **more)

    merged = merged_serving([costs(1.0), costs(3.0), costs(2.0)])
    assert merged.first_token_s == pytest.approx(0.020) and merged.decode_step_s == pytest.approx(0.004)
    assert merged.router_cpu_s_per_token == pytest.approx(0.0018)
    assert merged.router_cpu_s_per_token <= merged.host_cpu_s_per_token
    assert merged.host_cores == 2


def test_by_batch_tables_take_each_batch_over_the_profiles_that_measured_it():
    loss = [((2, 1.3, 0.0), (8, 2.0, 0.010)), (), ((2, 1.5, 0.002), (8, 2.4, 0.0), (32, 3.0, 0.0))]
    assert merged_by_batch(loss) == ((2, pytest.approx(1.4), pytest.approx(0.001)),
                                     (8, pytest.approx(2.2), pytest.approx(0.005)), (32, 3.0, 0.0))
    assert merged_by_batch([(), ()]) == ()
    merged = merged_serving([ServingCosts(prompt_loss_by_batch=rows, served_step_extra_s=((1, 0.001 * k), (4, 0.002 * k)))
                             for k, rows in zip((1, 2, 3), loss)])
    assert merged.prompt_loss_by_batch[1] == (8, pytest.approx(2.2), pytest.approx(0.005))
    assert merged.served_step_extra_s == ((1, pytest.approx(0.002)), (4, pytest.approx(0.004)))


def test_the_served_corun_is_the_median_of_the_profiles_that_measured_it():
    merged = merged_serving([ServingCosts(corun_decode_stretch_served=v) for v in (0.0, 1.2, 1.1, 0.0, 1.4)])
    assert merged.corun_decode_stretch_served == pytest.approx(1.2)
    assert merged_serving([ServingCosts(), ServingCosts()]).corun_decode_stretch_served == 0.0   # none measured it


def test_the_join_warmup_is_the_median_of_the_profiles_that_measured_it_term_by_term():
    costs = [ServingCosts(join_warmup_s=a, join_warmup_s_per_context_token=b)
             for a, b in ((0.0, 0.0), (0.001, 2e-6), (0.0, 4e-6), (0.003, 3e-6))]
    merged = merged_serving(costs)
    assert merged.join_warmup_s == pytest.approx(0.001)            # of 0.001, 0.0, 0.003: not the unmeasured 0
    assert merged.join_warmup_s_per_context_token == pytest.approx(3e-6)
    assert merged_serving([ServingCosts(), ServingCosts()]).join_warmup_cost_s(1000) == 0.0


def test_batched_runs_are_pooled_without_their_windows():
    runs = [((1.0, 0.005, 100.0, 200.0),), ((1.0, 0.007, 100.0, 150.0), (4.0, 0.009, 400.0, 400.0))]
    merged = merged_serving([ServingCosts(served_batch_runs=r, served_batch_windows_s=((1.0, 2.0),) * len(r))
                             for r in runs])
    assert merged.served_batch_runs == runs[0] + runs[1] and merged.served_batch_windows_s == ()


def test_a_spread_is_merged_quantile_by_quantile_over_the_most_common_length():
    assert merged_spread([(-1.0, 0.0, 2.0), (-3.0, 0.0, 4.0), (), (-2.0, 1.0, 9.0), (0.0, 5.0)]) == (-2.0, 0.0, 4.0)
    assert merged_spread([(), ()]) == ()
    assert merged_spread([(0.0, 1.0), (0.0, 1.0, 2.0)]) == (0.0, 1.0, 2.0)    # a tie: the finer


def test_the_compute_checks_span_every_profiles_and_the_others_are_medians():
    def machine(start_ms: float, end_ms: float, wake_us: float) -> HardwareInfo:
        return HardwareInfo("AMD EPYC", 2, host_kind="kind", machine_ms_start=start_ms, machine_ms_end=end_ms,
                            machine_wake_us_start=wake_us, machine_interp_ms=start_ms / 10,
                            machine_interp_series_ms=((0, (1.0, None)),), machine_interp_start_s=50.0)

    merged = merged_profile([replace(BASE, hardware=machine(*checks))
                             for checks in ((6.0, 6.2, 90.0), (7.5, 0.0, 0.0), (6.4, 5.9, 150.0))]).hardware
    # the machine moved from 5.9 to 7.5 ms over the three: a plan's auto margin sees 1.27x
    assert (merged.machine_ms_start, merged.machine_ms_end) == (5.9, 7.5)
    assert merged.machine_wake_us_start == pytest.approx(120.0) and merged.machine_wake_us_end == 0.0
    assert merged.machine_interp_ms == pytest.approx(0.64)
    assert merged.machine_interp_series_ms == () and merged.machine_interp_start_s == 0.0


@pytest.mark.parametrize("change, what", [
    (lambda p: replace(p, model=replace(p.model, dtype="float32")), "the model"),
    (lambda p: replace(p, engine=replace(p.engine, max_num_seqs=64)), "the engine settings"),
    (lambda p: replace(p, hardware=replace(p.hardware, host_kind="other")), "hardware.host_kind"),
    (lambda p: replace(p, serving=replace(p.serving, client_placement="wake")), "serving.client_placement"),
])
def test_profiles_of_different_setups_are_not_merged(change, what):
    with pytest.raises(ProfileError, match=f"whose {what} differ"):
        merged_profile([BASE, change(BASE)])
    with pytest.raises(ProfileError, match="at least two"):
        merged_profile([BASE])


def test_the_merged_profile_is_a_valid_file(tmp_path):
    merged = merged_profile([slowed(1.0, "a"), slowed(1.1, "b")])
    save_profile(merged, tmp_path / "m.json")
    assert load_profile(tmp_path / "m.json") == merged


def test_pdserve_profile_merge_writes_the_median_and_refuses_another_setup(tmp_path, capsys):
    from cli.main import main

    paths = []
    for name, factor in (("a", 1.0), ("b", 1.4), ("c", 1.1)):
        paths += ["--merge", str(tmp_path / f"{name}.json")]
        save_profile(slowed(factor, name), tmp_path / f"{name}.json")
    assert main(["profile", *paths, "--out", str(tmp_path / "m.json")]) == 0
    merged = load_profile(tmp_path / "m.json")
    assert merged.decode[0].step_s == pytest.approx(1.1 * BASE.decode[0].step_s)
    assert (tmp_path / "m.png").stat().st_size > 10_000
    assert "the median of 3 profiles" in " ".join(capsys.readouterr().out.split())   # rich wraps long lines
    save_profile(replace(BASE, model=replace(BASE.model, dtype="float32")), tmp_path / "other.json")
    with pytest.raises(SystemExit, match="--merge: cannot merge profiles whose the model differ"):
        main(["profile", "--merge", str(tmp_path / "a.json"), "--merge", str(tmp_path / "other.json"),
              "--out", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit, match="give --model"):
        main(["profile", "--out", str(tmp_path / "x.json")])
