"""The profile file format and the performance model fitted to it."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from planner.perf_model import (DecodeCoeffs, MeasuredRange, PerfModel, PrefillCoeffs, fit_nonnegative, fit_perf_model,
                                fit_prefill)
from planner.profile import (
    PROFILE_VERSION,
    DecodeSample,
    PrefillSample,
    ProfileError,
    TransferSample,
    load_profile,
    profile_from_dict,
    profile_to_dict,
    save_profile,
)
from planner.profiles.example import EXAMPLE_PROFILE_PATH, build_example_profile
from router.policies.placement.cost import CostModel, prior_units


def test_checked_in_example_profile_is_what_its_generator_builds():
    assert load_profile(EXAMPLE_PROFILE_PATH) == build_example_profile()


def test_example_profile_derives_kv_sizes_of_the_bench_model():
    profile = build_example_profile()
    # 2 (K, V) x 12 layers x 4 KV heads x 64 head dim x 2 bytes (bf16)
    assert profile.model.kv_bytes_per_token == 12_288
    assert profile.model.kv_bytes_per_block == 393_216
    assert profile.num_kv_blocks == (1 << 30) // 393_216 == 2730
    assert profile.transports == ("tcp",)


def test_save_then_load_round_trips(tmp_path):
    path = tmp_path / "profile.json"
    save_profile(build_example_profile(), path)
    assert load_profile(path) == build_example_profile()
    assert json.loads(path.read_text())["version"] == PROFILE_VERSION


def test_the_machine_speed_a_profile_was_measured_at_round_trips_and_older_profiles_still_load(tmp_path):
    example = build_example_profile()
    timed = replace(example, hardware=replace(example.hardware, machine_ms_start=0.77, machine_ms_end=0.91))
    save_profile(timed, tmp_path / "timed.json")
    assert load_profile(tmp_path / "timed.json").hardware.machine_ms_end == 0.91
    older = profile_to_dict(example)
    for key in ("machine_ms_start", "machine_ms_end"):
        older["hardware"].pop(key)
    assert profile_from_dict(older).hardware.machine_ms_start == 0.0   # not checked


def test_the_interpreters_series_round_trips_as_tuples_and_older_profiles_have_none(tmp_path):
    example = build_example_profile()
    series = ((0, (0.61, None, 0.9)), (1, (0.58, 0.6, 0.59)))
    sampled = replace(example, hardware=replace(example.hardware, machine_interp_ms=0.65,
                                                machine_interp_series_ms=series, machine_interp_window_s=0.5))
    save_profile(sampled, tmp_path / "sampled.json")
    loaded = load_profile(tmp_path / "sampled.json").hardware
    assert loaded.machine_interp_series_ms == series and loaded.machine_interp_window_s == 0.5
    hash(loaded)   # JSON's lists came back as tuples: the hardware record stays hashable
    assert example.hardware.machine_interp_series_ms == ()
    with pytest.raises(ProfileError, match="machine_interp_window_s must be > 0"):
        replace(example.hardware, machine_interp_window_s=0.0)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(version=99), "profile version 99 is not readable"),
    (lambda d: d.update(format="other"), "not a pdserve profile"),
    (lambda d: d["model"].update(dtype="int3"), "model.dtype 'int3' is unknown"),
    (lambda d: d["model"].update(colour="red"), r"profile.model has unknown keys \['colour'\]"),
    (lambda d: d["engine"].pop("max_num_seqs"), "profile.engine: .*max_num_seqs"),
    (lambda d: d.update(prefill=d["prefill"][:2]), "prefill needs rows for at least 3 distinct prompt lengths"),
    (lambda d: d["decode"][0].update(step_s=-1.0), r"profile.decode\[0\]: decode\[\].step_s must be a positive number"),
    (lambda d: d.update(kv_transfer=d["kv_transfer"][:1]), "kv_transfer for 'tcp' needs >= 2 distinct kv_bytes"),
])
def test_invalid_profiles_are_refused_with_the_field_named(mutate, message):
    data = profile_to_dict(build_example_profile())
    mutate(data)
    with pytest.raises(ProfileError, match=message):
        profile_from_dict(data)


def test_fit_recovers_known_coefficients_from_exact_synthetic_tables():
    a, b, c = 0.02, 3e-4, 5e-8
    prefill = tuple(PrefillSample(n, k, -(-n // k) * a + b * n + c * n * n)
                    for n, k in [(64, 2048), (256, 2048), (1000, 2048), (2048, 2048), (2048, 256), (1500, 512)])
    decode = tuple(DecodeSample(bs, ctx, 0.008 + 0.0012 * bs + 4e-7 * ctx)
                   for bs, ctx in [(1, 100), (4, 2000), (16, 3000), (32, 40000), (8, 8000)])
    transfer = tuple(TransferSample("torch", size, 0.002 + size / 5e9) for size in (100_000, 1_000_000, 10_000_000))
    profile = build_example_profile()
    profile = type(profile)(profile.hardware, profile.model, profile.engine, prefill, decode, transfer)
    report = fit_perf_model(profile)
    p, d, t = report.model.prefill, report.model.decode, report.model.transfer["torch"]
    assert (p.step_s, p.per_token_s, p.per_token2_s) == pytest.approx((a, b, c), rel=1e-6)
    assert (d.step_s, d.per_seq_s, d.per_context_token_s) == pytest.approx((0.008, 0.0012, 4e-7), rel=1e-6)
    assert (t.latency_s, t.bytes_per_s) == pytest.approx((0.002, 5e9), rel=1e-6)
    assert report.prefill_mape < 1e-9 and report.decode_mape < 1e-9 and report.transfer_mape["torch"] < 1e-9


def test_a_chunked_prompts_attention_over_earlier_chunks_is_fitted_from_rows_in_small_chunks():
    a, b, c, e = 0.015, 8e-4, 2.4e-7, 1.3e-7
    def seconds(n, k):
        return -(-n // k) * a + b * n + c * n * n + e * prior_units(n, k)
    rows = [(n, 2048) for n in (32, 128, 512, 1024, 2048, 4095)] + [(n, 256) for n in (512, 1024, 2048)]
    prefill = tuple(PrefillSample(n, k, seconds(n, k)) for n, k in rows)
    p, error = fit_prefill(prefill)
    assert (p.step_s, p.per_token_s, p.per_token2_s, p.per_prior_unit_s) == pytest.approx((a, b, c, e), rel=1e-6)
    assert error < 1e-9
    model = PerfModel(p, DecodeCoeffs(0.01, 0.001, 1e-6))
    # 2,000 tokens in 256-token chunks: 8 steps and the prior term beyond the one-pass prompt
    assert model.prefill_s(2000, 256) - model.prefill_s(2000, 2048) == pytest.approx(
        7 * a + e * prior_units(2000, 256), rel=1e-9)
    # without rows in small chunks (a profile before them: one engine budget, its longest prompt in
    # two chunks) the term is not fitted: 0, and a, b, c fitted as before
    unchunked = tuple(r for r in prefill if r.chunk_tokens == 2048)
    assert fit_prefill(unchunked)[0].per_prior_unit_s == 0.0


def test_a_chunked_prompt_cheaper_than_one_pass_is_fitted_with_a_negative_term_down_to_minus_2c():
    # as on an AMX Xeon: a step of 2,048 tokens runs slower per token than its 256-token chunks, so the
    # one-pass n^2 is not attention alone and a chunk's queries over earlier tokens cost 2c + e < 2c
    a, b, c, e = 0.023, 1.8e-4, 8.8e-8, -1.2e-7
    def seconds(n, k):
        return -(-n // k) * a + b * n + c * n * n + e * prior_units(n, k)
    rows = [(n, 2048) for n in (32, 128, 512, 1024, 2048, 4095)] + [(n, 256) for n in (512, 1024, 2048)]
    p, error = fit_prefill(tuple(PrefillSample(n, k, seconds(n, k)) for n, k in rows))
    assert (p.step_s, p.per_token_s, p.per_token2_s, p.per_prior_unit_s) == pytest.approx((a, b, c, e), rel=1e-6)
    assert error < 1e-9
    model = PerfModel(p, DecodeCoeffs(0.01, 0.001, 1e-6))
    assert model.prefill_s(2000, 256) < model.prefill_s(2000, 2048) + 7 * a   # cheaper than telescoped
    # rows whose chunks cost nothing over earlier tokens (or less: noise) stop the fit at e = -2c: a
    # chunk of a long prompt never costs less than the same chunk alone
    free = tuple(PrefillSample(n, k, -(-n // k) * a + b * n + c * (n * n - 2 * prior_units(n, k))
                               - (1e-8 * prior_units(n, k) if k == 256 else 0.0)) for n, k in rows)
    p = fit_prefill(free)[0]
    assert p.per_prior_unit_s == pytest.approx(-2 * p.per_token2_s, rel=1e-9) and p.per_token2_s > 0
    CostModel(fixed_s=p.step_s, per_token_s=p.per_token_s, per_token2_s=p.per_token2_s, step_fixed_s=0.01,
              step_per_seq_s=0.001, chunk_tokens=256, per_prior_unit_s=p.per_prior_unit_s)   # a valid cost model
    assert p.times(0.7).per_prior_unit_s == pytest.approx(-2 * p.times(0.7).per_token2_s)   # scaled, still valid
    with pytest.raises(ValueError, match=r"per_prior_unit_s must be >= -2 \* per_token2_s"):
        PrefillCoeffs(0.01, 1e-4, 1e-9, -2.1e-9)


def _with_decode(decode: tuple) -> object:
    profile = build_example_profile()
    return type(profile)(profile.hardware, profile.model, profile.engine, profile.prefill, decode, profile.kv_transfer)


GRID = [(b, b * c) for b in (1, 2, 4, 8, 16, 32) for c in (16, 128, 512, 1024)]


def test_a_step_that_costs_more_per_token_past_a_context_knee_is_fitted_with_the_knee():
    # 10 us per context token up to 2,048 tokens, 34 us past it (the KV no longer fits the caches)
    def step(b: int, ctx: int) -> float:
        return 0.029 + 0.002 * b + 10e-6 * ctx + 24e-6 * max(0, ctx - 2048)

    report = fit_perf_model(_with_decode(tuple(DecodeSample(b, ctx, step(b, ctx)) for b, ctx in GRID)))
    d = report.model.decode
    assert d.context_knee_tokens == 2048 and report.decode_mape < 1e-9
    assert (d.step_s, d.per_seq_s, d.per_context_token_s, d.per_context_token_past_knee_s) == pytest.approx(
        (0.029, 0.002, 10e-6, 24e-6), rel=1e-6)
    assert report.model.decode_step_s(16, 8000) == pytest.approx(step(16, 8000), rel=1e-9)
    assert any("(context - 2048)+" in line for line in report.lines())


def test_a_step_linear_in_context_gets_no_knee():
    report = fit_perf_model(_with_decode(tuple(DecodeSample(b, ctx, 0.01 + 0.001 * b + 5e-6 * ctx)
                                               for b, ctx in GRID)))
    d = report.model.decode
    assert d.per_context_token_past_knee_s == 0.0 and d.context_knee_tokens == 0
    assert d.per_context_token_s == pytest.approx(5e-6, rel=1e-6)


def test_fit_keeps_coefficients_non_negative():
    # y = 2x exactly, plus a column that would take a negative weight: it is dropped (0)
    x = np.array([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0], [4.0, 1.0]])
    y = np.array([1.9, 4.0, 6.0, 8.1])
    coef = fit_nonnegative(x, y)
    assert coef[1] == 0.0 and coef[0] > 0


def test_example_profile_fit_reports_its_error_and_matches_the_anchors():
    report = fit_perf_model(build_example_profile())
    model = report.model
    assert model.prefill_s(1024, 2048) == pytest.approx(0.30, rel=0.03)
    assert model.decode_step_s(1, 512) == pytest.approx(0.011, rel=0.05)
    assert model.decode_step_s(8, 8 * 512) == pytest.approx(0.022, rel=0.06)
    assert model.decode_step_s(32, 32 * 512) == pytest.approx(0.071, rel=0.08)
    assert model.transfer_s(2_000_000_000, "tcp") == pytest.approx(1.0, rel=0.02)
    assert report.prefill_mape < 0.02 and report.decode_mape < 0.05 and report.transfer_mape["tcp"] < 0.02
    assert any("MAPE" in line and "decode" in line for line in report.lines())
    with pytest.raises(KeyError, match="transport 'nccl' is not in the profile"):
        model.transfer_s(1, "nccl")


def test_the_fit_knows_how_far_its_profile_measured_and_says_what_lies_beyond():
    measured = fit_perf_model(build_example_profile()).measured
    assert measured == MeasuredRange(longest_prompt_tokens=2048, longest_sequence_tokens=1024, largest_batch=32)
    assert measured.beyond(2048, 1024, 32) == []   # the ends themselves were measured
    notes = measured.beyond(3000, 1100, 64)
    assert notes == ["prompts reach 3000 tokens; prefill was measured to 2048",
                     "sequences reach 1100 tokens; decode steps were measured with sequences of up to 1024",
                     "decode batches may reach 64; they were measured to 32"]


def _wide_tables(speedup_prefill: float, speedup_decode: float) -> dict:
    """A profile's one-device tables, and a wide engine's: the same rows, sped up."""
    profile = build_example_profile()
    return {"devices": 2,
            "prefill": [{"prompt_tokens": r.prompt_tokens, "chunk_tokens": r.chunk_tokens,
                         "prefill_s": r.prefill_s / speedup_prefill} for r in profile.prefill],
            "decode": [{"batch_size": r.batch_size, "context_tokens": r.context_tokens,
                        "step_s": r.step_s / speedup_decode} for r in profile.decode]}


def test_a_wide_engine_round_trips_and_gets_a_model_fitted_to_its_own_tables(tmp_path):
    data = profile_to_dict(build_example_profile()) | {"wide": [_wide_tables(1.9, 1.25)]}
    profile = profile_from_dict(data)
    path = tmp_path / "wide.json"
    save_profile(profile, path)
    assert load_profile(path) == profile and profile.wide[0].devices == 2
    report = fit_perf_model(profile)
    one, two = report.model, report.model.on_devices(2)
    assert report.model.widths == (1, 2) and one.on_devices(1) is one
    assert two.prefill_s(1024, 2048) == pytest.approx(one.prefill_s(1024, 2048) / 1.9, rel=1e-6)
    assert two.decode_step_s(8, 1024) == pytest.approx(one.decode_step_s(8, 1024) / 1.25, rel=1e-6)
    assert two.transfer == one.transfer and report.wide_mape[2] == pytest.approx(
        (report.prefill_mape, report.decode_mape), abs=1e-9)
    assert any("[one engine on 2 devices]" in line for line in report.lines())
    with pytest.raises(KeyError, match="no engine over 4 devices"):
        one.on_devices(4)


@pytest.mark.parametrize("wide, message", [
    ({"devices": 1}, "exactly the keys devices, prefill, decode"),
    ("x", "profile.wide must be a list"),
])
def test_a_malformed_wide_engine_is_refused(wide, message):
    data = profile_to_dict(build_example_profile()) | {"wide": wide if wide == "x" else [wide]}
    with pytest.raises(ProfileError, match=message):
        profile_from_dict(data)


def test_vllm_s_server_costs_round_trip_beside_the_wide_engine_they_were_measured_on(tmp_path):
    server = {"first_token_s": 0.012, "decode_step_s": 0.008, "decode_cpu_s_per_token": 2e-5,
              "decode_step_spread_s": [-0.002, 0.0, 0.004]}
    data = profile_to_dict(build_example_profile()) | {"wide": [_wide_tables(1.9, 1.25)], "vllm_server": server}
    profile = profile_from_dict(data)
    save_profile(profile, tmp_path / "p.json")
    loaded = load_profile(tmp_path / "p.json")
    assert loaded == profile and loaded.vllm_server.decode_step_s == 0.008
    assert loaded.vllm_server.decode_step_spread_s == (-0.002, 0.0, 0.004) and loaded.vllm_server.host_cores == 0
    assert load_profile(EXAMPLE_PROFILE_PATH).vllm_server is None   # a profile that did not measure it
    with pytest.raises(ProfileError, match="vllm_server is measured around the widest engine"):
        profile_from_dict(profile_to_dict(build_example_profile()) | {"vllm_server": server})
    with pytest.raises(ProfileError, match="profile.vllm_server.*decode_step_s must be a number >= 0"):
        profile_from_dict(data | {"vllm_server": server | {"decode_step_s": -1}})


def test_a_profile_names_the_product_its_speed_checks_timed_and_older_ones_timed_float32():
    example = build_example_profile()
    timed = replace(example, hardware=replace(example.hardware, machine_ms_start=2.7, machine_ms_end=2.8,
                                              machine_product="bfloat16"))
    assert profile_from_dict(profile_to_dict(timed)).hardware.machine_product == "bfloat16"
    older = profile_to_dict(example)
    for key in ("machine_product", "machine_wake_us_start", "machine_wake_us_end"):
        older["hardware"].pop(key)
    assert profile_from_dict(older).hardware.machine_product == "float32"
    assert profile_from_dict(older).hardware.machine_wake_us_start == 0.0   # not checked
    woken = replace(timed, hardware=replace(timed.hardware, machine_wake_us_start=70.0, machine_wake_us_end=81.0))
    assert profile_from_dict(profile_to_dict(woken)).hardware.machine_wake_us_end == 81.0
    wrong = profile_to_dict(example)
    wrong["hardware"]["machine_product"] = "int8"
    with pytest.raises(ProfileError, match="machine_product 'int8' is unknown"):
        profile_from_dict(wrong)


def test_a_wide_engine_needs_two_devices_and_enough_rows():
    narrow = _wide_tables(1.0, 1.0) | {"devices": 1}
    with pytest.raises(ProfileError, match="wide\\[\\].devices must be an integer >= 2"):
        profile_from_dict(profile_to_dict(build_example_profile()) | {"wide": [narrow]})
    short = _wide_tables(1.0, 1.0)
    short["prefill"] = short["prefill"][:2]
    with pytest.raises(ProfileError, match="wide\\[2 devices\\].prefill needs rows"):
        profile_from_dict(profile_to_dict(build_example_profile()) | {"wide": [short]})


def test_a_slower_machine_multiplies_every_compute_and_transfer_time():
    model = fit_perf_model(profile_from_dict(profile_to_dict(build_example_profile())
                                             | {"wide": [_wide_tables(1.9, 1.25)]})).model
    assert model.widths == (1, 2)
    slow = model.slower(1.25)
    assert slow.prefill_s(1000, 2048) == pytest.approx(1.25 * model.prefill_s(1000, 2048))
    assert slow.decode_step_s(16, 4096) == pytest.approx(1.25 * model.decode_step_s(16, 4096))
    assert slow.transfer_s(1 << 20, "tcp") == pytest.approx(1.25 * model.transfer_s(1 << 20, "tcp"))
    assert model.slower(1.0) is model
    for width, wide in model.wide:
        assert slow.on_devices(width).decode_step_s(4, 512) == pytest.approx(1.25 * wide.decode_step_s(4, 512))
    with pytest.raises(ValueError, match="finite number > 0"):
        model.slower(0.0)


def test_slower_decodes_multiply_the_decode_step_alone():
    model = fit_perf_model(profile_from_dict(profile_to_dict(build_example_profile())
                                             | {"wide": [_wide_tables(1.9, 1.25)]})).model
    slow = model.decodes_slower(1.5)
    for batch, context in ((1, 100), (16, 4096), (64, 20000)):
        assert slow.decode_step_s(batch, context) == pytest.approx(1.5 * model.decode_step_s(batch, context))
    assert slow.prefill_s(1000, 2048) == model.prefill_s(1000, 2048)
    assert slow.transfer_s(1 << 20, "tcp") == model.transfer_s(1 << 20, "tcp")
    assert model.decodes_slower(1.0) is model
    for width, wide in model.wide:
        assert slow.on_devices(width).decode_step_s(4, 512) == pytest.approx(1.5 * wide.decode_step_s(4, 512))
        assert slow.on_devices(width).prefill_s(512, 2048) == wide.prefill_s(512, 2048)
    with pytest.raises(ValueError, match="finite number > 0"):
        model.decodes_slower(0.0)


def test_a_profile_keeps_the_interpreters_speed_over_it_and_an_older_one_has_none():
    example = build_example_profile()
    sampled = replace(example, hardware=replace(example.hardware, machine_interp_ms=0.71))
    assert profile_from_dict(profile_to_dict(sampled)).hardware.machine_interp_ms == 0.71
    older = profile_to_dict(example)
    older["hardware"].pop("machine_interp_ms")
    assert profile_from_dict(older).hardware.machine_interp_ms == 0.0   # not sampled


def test_slower_prompts_multiply_the_prefill_alone():
    model = fit_perf_model(profile_from_dict(profile_to_dict(build_example_profile())
                                             | {"wide": [_wide_tables(1.9, 1.25)]})).model
    slow = model.prompts_slower(1.3)
    assert slow.prefill_s(1000, 2048) == pytest.approx(1.3 * model.prefill_s(1000, 2048))
    assert slow.prefill_s(100, 2048) == pytest.approx(1.3 * model.prefill_s(100, 2048))
    assert slow.decode_step_s(16, 4096) == model.decode_step_s(16, 4096)
    assert slow.transfer_s(1 << 20, "tcp") == model.transfer_s(1 << 20, "tcp")
    assert model.prompts_slower(1.0) is model
    assert model.widths == (1, 2)
    for width, wide in model.wide:
        assert slow.on_devices(width).prefill_s(512, 2048) == pytest.approx(1.3 * wide.prefill_s(512, 2048))
        assert slow.on_devices(width).decode_step_s(4, 512) == wide.decode_step_s(4, 512)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite number > 0"):
            model.prompts_slower(bad)


def test_the_profiles_summary_says_how_far_the_interpreter_moved_window_by_window():
    from io import StringIO

    from rich.console import Console

    from planner.profiler.summary import print_summary

    example = build_example_profile()
    series = ((0, (0.5, 0.5, 0.5, 0.5, 0.5)), (1, (0.5, 0.5, 1.0, 1.0, 1.0)))
    sampled = replace(example, hardware=replace(example.hardware, machine_interp_ms=0.7,
                                                machine_interp_series_ms=series))
    console = Console(file=StringIO(), width=400)
    print_summary(console, sampled, fit_perf_model(sampled))
    # ten windows: five of 0.5 on core 0, three of 1.0 and two of 0.5 on core 1
    assert ("interpreter: 0.700 ms of CPU a check loop, the mean over the profile on every core; its 1 s windows "
            "0.500-1.000 ms (p10-p90, 2.00x)") in console.file.getvalue()
