"""bench/decode_step_under_load.py explains itself, alternates its phases and pools each phase's
traced steps over rounds (its pure parts, on plain values)."""

import argparse

import pytest

from bench_scripts import bench_functions, bench_help


def test_the_decode_step_bench_explains_itself():
    shown = bench_help("decode_step_under_load.py")
    assert "lone+matmul" in shown and "--load" in shown and "--analyse" in shown and "--profile" in shown
    assert "engine-worker" in shown and "--engine-phases" in shown and "--no-loads" in shown
    assert "engine-apart-long" in shown and "--only" in shown and "--batch" in shown and "--closed" in shown


def test_phases_alternate_abba_and_a_load_is_a_shape_at_a_rate():
    f = bench_functions("decode_step_under_load.py")
    first = f["phase_order"](0, [("long-short", 1.6)])
    assert first == ["lone", "lone-long", "lone+matmul", "lone+spin", "long-short@1.6"]
    assert f["phase_order"](1, [("long-short", 1.6)]) == first[::-1]
    with_engines = f["phase_order"](0, [("long-short", 1.6)], True)
    assert with_engines == ["lone", "lone-long", "lone+matmul", "lone+spin", "engine-apart", "engine-beside",
                            "engine-worker", "engine-apart-long", "engine-beside-long", "long-short@1.6"]
    assert f["phase_order"](1, [], True)[:3] == ["engine-beside-long", "engine-apart-long", "engine-worker"]
    only = ("lone", "engine-apart-long", "long-short@1.6")
    assert f["phase_order"](0, [("long-short", 1.6)], True, only) == list(only)
    assert f["phase_order"](1, [("long-short", 1.6)], True, only) == list(only)[::-1]
    assert f["phase_order"](0, [("short-long", 2.0)], False, (), (4,), ("long-short:2",)) == \
        ["lone", "lone-long", "lone+matmul", "lone+spin", "batch4", "closed:long-short:2", "short-long@2"]
    assert f["phase_order"](1, [], False, ("closed:long-short:2", "batch4"), (4,), ("long-short:2",)) == \
        ["closed:long-short:2", "batch4"]
    assert f["closed_arg"]("long-short:2") == ("long-short", 2)
    with pytest.raises(argparse.ArgumentTypeError, match="expected SHAPE:N"):
        f["closed_arg"]("long-short:0")
    ids = {"decode": "decode-1", "prefill": "prefill-0"}
    assert [f["trace_id"](phase, ids) for phase in ("lone", "engine-apart", "engine-beside-long", "engine-worker")] == \
        ["decode-1", "engine", "engine", f["WORKER_ENGINE_ID"]]
    assert f["load_arg"]("short-long@2") == ("short-long", 2.0)
    with pytest.raises(argparse.ArgumentTypeError, match="expected SHAPE@RATE"):
        f["load_arg"]("short-long")


def test_rounds_pool_into_one_row_per_phase_batch_and_join_weighted_by_steps():
    pooled = bench_functions("decode_step_under_load.py")["pooled"]
    row = lambda batch, joins, steps, step_ms, model_ms: {"batch": batch, "joins": joins, "steps": steps,  # noqa: E731
                                                          "step_ms": step_ms, "model_ms": model_ms}
    report = [{"phase": "lone", "rows": [row("1", False, 100, 4.0, 3.0), row("1", True, 2, 5.0, 3.0)]},
              {"phase": "lone", "rows": [row("1", False, 300, 6.0, 3.0)]},
              {"phase": "long-short@1.6", "rows": [row("2-3", False, 10, 8.0, None)]}]
    rows = {(r["phase"], r["batch"], r["joins"]): r for r in pooled(report)}
    assert rows[("lone", "1", False)] == {"phase": "lone", "batch": "1", "joins": False, "steps": 400,
                                          "step_ms": 5.5, "model_ms": 3.0}
    assert rows[("lone", "1", True)]["steps"] == 2
    assert rows[("long-short@1.6", "2-3", False)]["model_ms"] == 0.0   # no profile: no model step


def test_a_phase_reads_the_decode_workers_threads_in_cores_largest_first():
    thread_cores = bench_functions("decode_step_under_load.py")["thread_cores"]
    before = {"python/api": 1.0, "EngineCore/main": 2.0, "python/kv-pull": 0.5}
    after = {"python/api": 1.5, "EngineCore/main": 4.0, "python/kv-pull": 0.501, "python/new": 0.2}
    assert thread_cores(before, after, wall_s=2.0) == {"EngineCore/main": 1.0, "python/api": 0.25, "python/new": 0.1}
