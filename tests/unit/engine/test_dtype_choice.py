"""`--dtype auto` by measurement: the choice from recorded probe timings, and its cache per host kind."""

from __future__ import annotations

import pytest

from pdserve.dtype_choice import (DtypeDecision, ModelShape, cache_path, choose_dtype, host_kind, load_decision,
                                  save_decision)

# Probe timings (ms) recorded on the hosts the issue names, one worker thread, the bench model's shape.
AMX_XEON = {"bfloat16": {"gemm_prefill": 1.51, "gemm_decode": 0.31, "attention_prefill": 0.24},
            "float32": {"gemm_prefill": 9.88, "gemm_decode": 0.65, "attention_prefill": 0.52}}
AVX512_BF16_NO_AMX = {"bfloat16": {"gemm_prefill": 5.78, "gemm_decode": 0.61, "attention_prefill": 0.70},
                      "float32": {"gemm_prefill": 3.27, "gemm_decode": 0.40, "attention_prefill": 0.45}}
AVX2_ONLY = {"bfloat16": {"gemm_prefill": 82.0, "gemm_decode": 6.1, "attention_prefill": 9.0},
             "float32": {"gemm_prefill": 2.2, "gemm_decode": 0.3, "attention_prefill": 0.6}}
SAPPHIRE_FLAGS = "model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile amx_bf16\n"
EPYC_FLAGS = "model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx2\n"


def test_amx_host_runs_bfloat16():
    assert choose_dtype(AMX_XEON)[0] == "bfloat16"


def test_avx512_bf16_host_without_amx_runs_float32_because_it_measured_faster():
    dtype, reason = choose_dtype(AVX512_BF16_NO_AMX)
    assert dtype == "float32" and "1.7x ahead of bfloat16 7.1 ms" in reason


def test_avx2_host_runs_float32():
    assert choose_dtype(AVX2_ONLY)[0] == "float32"


def test_bfloat16_is_kept_when_float32_is_only_marginally_faster():
    timings = {"bfloat16": {"gemm": 10.0}, "float32": {"gemm": 9.5}}
    dtype, reason = choose_dtype(timings)
    assert dtype == "bfloat16" and "twice the tokens" in reason
    assert choose_dtype({"bfloat16": {"gemm": 10.0}, "float32": {"gemm": 8.9}})[0] == "float32"


def test_a_dtype_that_did_not_finish_every_probe_loses():
    timings = {"bfloat16": {"gemm": 1.0}, "float32": {"gemm": 5.0, "attention": 1.0}}
    assert choose_dtype(timings)[0] == "float32"
    with pytest.raises(ValueError, match="nothing to choose"):
        choose_dtype({})


def test_host_kind_names_the_cpu_its_kernel_flags_and_the_library_versions():
    kind = host_kind(SAPPHIRE_FLAGS, "2.13.0+cpu", "0.32.0")
    assert kind.startswith("intel-r-xeon-r-platinum-8480_avx2+avx512f+avx512_bf16+amx_tile+amx_bf16_")
    assert host_kind(SAPPHIRE_FLAGS, "2.13.0+cpu", "0.33.0") != kind  # another vLLM: other kernels
    assert host_kind(EPYC_FLAGS, "2.13.0+cpu", "0.32.0").startswith("amd-epyc-7b13_avx2_")


def test_host_kind_tells_apart_cpu_families_a_vm_shows_under_one_model_name():
    """Two 2-vCPU VMs of this project's hosts: "AMD EPYC" both, the same kernel flags, a Zen 4 and a Zen 5."""
    flags = "flags\t\t: fpu avx2 avx512f avx512_bf16\n"
    zen4 = host_kind(f"cpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n{flags}", "2.13.0+cpu", "0.32.0")
    zen5 = host_kind(f"cpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n{flags}", "2.13.0+cpu", "0.32.0")
    assert zen4.startswith("amd-epyc-f25m17_avx2+avx512f+avx512_bf16_")
    assert zen5.startswith("amd-epyc-f26m2_avx2+avx512f+avx512_bf16_")
    # the second processor's lines repeat the first's; a model line without a number is not one
    assert host_kind("cpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\ncpu family\t: 25\nmodel\t\t: 17\n"
                     + flags, "t", "v").startswith("amd-epyc-f26m2_")
    assert host_kind("cpu family\t: 6\nmodel\t\t: unknown\nmodel name\t: X\n", "t", "v").startswith("x_noflags_")


def test_model_shape_from_a_hugging_face_config():
    shape = ModelShape.from_config({"hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12,
                                    "num_key_value_heads": 4})
    assert (shape.head_dim, shape.key) == (64, "h768-i3072-a12-kv4-d64")
    with pytest.raises(ValueError, match="no intermediate_size"):
        ModelShape.from_config({"hidden_size": 8, "num_attention_heads": 2})


def test_the_cache_is_reused_on_the_same_host_kind_and_ignored_on_another(tmp_path):
    shape = ModelShape(768, 3072, 12, 4, 64)
    kind = host_kind(SAPPHIRE_FLAGS, "2.13.0+cpu", "0.32.0")
    path = cache_path(tmp_path, kind, shape, threads=1)
    decision = DtypeDecision("bfloat16", "fastest", kind, shape.key, 1, AMX_XEON)
    save_decision(path, decision)
    assert load_decision(path, kind) == decision
    other = host_kind(EPYC_FLAGS, "2.13.0+cpu", "0.32.0")
    assert load_decision(path, other) is None                       # a file carried to another host kind
    assert cache_path(tmp_path, other, shape, 1) != path            # and another kind looks elsewhere
    assert cache_path(tmp_path, kind, shape, 2) != path             # as does another thread count
    path.write_text("{not json")
    assert load_decision(path, kind) is None
