"""The fast-defaults benchmark's arithmetic and its variants' environments, with plain values."""

from __future__ import annotations

import pytest

from pdserve.preload import Preload
from planner.profiler.engine_speed import SpeedResult, Variant, median_result, speed_table, variant_env

FOUND = Preload(("/usr/lib/libtcmalloc_minimal.so.4", "/venv/lib/libiomp5.so"))


def test_a_variant_preloads_exactly_its_libraries_and_drops_the_callers():
    base = {"HOME": "/h", "LD_PRELOAD": "/x/libgomp.so"}
    assert variant_env(Variant("v", "bfloat16"), FOUND, base) == {"HOME": "/h"}
    assert variant_env(Variant("v", "bfloat16", ("iomp5",)), FOUND, base)["LD_PRELOAD"] == "/venv/lib/libiomp5.so"
    both = variant_env(Variant("v", "bfloat16", ("tcmalloc", "iomp5")), FOUND, base)
    assert both["LD_PRELOAD"] == "/usr/lib/libtcmalloc_minimal.so.4:/venv/lib/libiomp5.so"


def test_a_variant_needing_a_missing_library_is_refused_with_how_to_get_it():
    found = Preload(("/venv/lib/libiomp5.so",), {"tcmalloc": "apt-get install libtcmalloc-minimal4"})
    with pytest.raises(FileNotFoundError, match="apt-get install libtcmalloc-minimal4"):
        variant_env(Variant("v", "bfloat16", ("tcmalloc",)), found, {})


def test_speed_table_gives_each_time_and_its_speed_up_over_the_baseline():
    base = SpeedResult("vLLM defaults", "bfloat16", "", 0.400, {1: 0.020, 32: 0.080})
    ours = SpeedResult("pdserve defaults", "bfloat16", "x", 0.200, {1: 0.025, 32: 0.040})
    rows = speed_table([base, ours], baseline="vLLM defaults")
    assert rows[1] == pytest.approx({"variant": "pdserve defaults", "dtype": "bfloat16", "prefill_ms": 200.0,
                                     "prefill_speedup": 2.0, "decode_b1_ms": 25.0, "decode_b1_speedup": 0.8,
                                     "decode_b32_ms": 40.0, "decode_b32_speedup": 2.0})
    assert rows[0]["prefill_speedup"] == 1.0


def test_median_result_takes_each_times_median_and_refuses_mixed_variants():
    runs = [SpeedResult("a", "float32", "", s, {8: d}) for s, d in ((0.3, 0.05), (0.1, 0.03), (0.2, 0.04))]
    assert median_result(runs) == SpeedResult("a", "float32", "", 0.2, {8: 0.04})
    with pytest.raises(ValueError):
        median_result([runs[0], SpeedResult("b", "float32", "", 0.1, {8: 0.01})])


def test_results_survive_json():
    result = SpeedResult("a", "bfloat16", "/l.so", 0.25, {1: 0.01, 8: 0.02})
    assert SpeedResult.from_dict(result.to_dict()) == result
