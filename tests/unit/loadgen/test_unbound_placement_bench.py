"""The pure parts of bench/unbound_placement.py (loadgen/comparison/unbound.py, loadgen/proc_cpu.py):
its variants, the per-core busy shares it reports, and the medians over its runs."""

from __future__ import annotations

import pytest

from loadgen.comparison.unbound import VLLM_SPIN, Variant, parse_variant, variant_medians
from loadgen.proc_cpu import core_busy_shares, per_core_ticks


def test_variants_name_where_the_unbound_processes_run_and_the_spin_cap():
    assert parse_variant("floating") == Variant("floating", False, False, None)
    assert parse_variant("router") == Variant("router", True, False, None)
    assert parse_variant(" pinned ") == Variant("pinned", True, True, None)
    assert parse_variant("spin5") == Variant("spin5", True, False, 5.0)
    assert parse_variant("spin0.5").spin_ms == 0.5
    assert parse_variant("spinvllm").spin_ms == VLLM_SPIN < 0       # the engine option for vLLM's own spin
    for bad in ("", "spin", "pinned2", "spin-1"):
        with pytest.raises(ValueError, match="say floating, router, pinned, spinN"):
            parse_variant(bad)


STAT_BEFORE = """cpu  300 0 100 1000 0 0 0 0 0 0
cpu0 100 0 50 500 0 0 0 0 0 0
cpu1 200 0 50 500 0 0 0 0 0 0
intr 12345
"""
STAT_AFTER = """cpu  600 0 200 1200 0 0 0 0 0 0
cpu0 150 0 60 590 0 0 0 0 0 0
cpu1 390 0 60 510 0 0 0 0 0 0
intr 12399
"""


def test_each_cores_busy_share_between_two_readings():
    before, after = per_core_ticks(STAT_BEFORE), per_core_ticks(STAT_AFTER)
    assert set(after) == {"cpu0", "cpu1"}                      # the machine total is not a core
    assert after["cpu0"] == (210, 800)
    shares = core_busy_shares(before, after)
    assert shares["cpu0"] == pytest.approx(60 / 150)           # 60 busy of 150 ticks
    assert shares["cpu1"] == pytest.approx(200 / 210)


def row(variant: str, ttft: float, first_gap: float | None, decode_cpu: float) -> dict:
    return {"variant": variant, "ttft_p50_ms": ttft, "ttft_p90_ms": 2 * ttft, "tpot_p50_ms": 5.0, "tpot_p90_ms": None,
            "slo_attainment": 1.0, "phases_ms": {"first_gap": [first_gap, None]},
            "cpu_cores": {"decode worker": decode_cpu}, "core_busy": {"cpu1": 0.9}}


def test_medians_per_variant_skip_what_no_run_measured():
    rows = [row("floating", 30, 20, 0.9), row("pinned", 20, 10, 0.8), row("pinned", 24, None, 0.7),
            row("floating", 34, 40, 1.0)]
    out = variant_medians(rows, ["first_gap"])
    assert list(out) == ["floating", "pinned"] and out["pinned"]["runs"] == 2
    assert out["floating"]["ttft_p50_ms"] == 32 and out["pinned"]["ttft_p90_ms"] == 44
    assert out["pinned"]["phases_ms"]["first_gap"] == [10, None]
    assert out["floating"]["tpot_p90_ms"] is None
    assert out["pinned"]["cpu_cores"]["decode worker"] == pytest.approx(0.75)
