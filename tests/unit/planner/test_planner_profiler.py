"""`pdserve profile`'s pure parts (which points, host and model facts) and its transfer probe
(the real transports over loopback; no engine)."""

from __future__ import annotations

import json

import pytest

from kv_transfer.geometry import BlockGeometry
from planner.profiler.host import count_cores, model_info
from planner.profiler.plan import PlanError, make_plan
from planner.profiler.transfer_probe import measure_transfers


def test_full_plan_for_the_cluster_defaults():
    plan = make_plan(max_model_len=2048, max_num_seqs=64, kv_cache_tokens=131072, block_size=32)
    assert plan.prefill_prompt_tokens == (32, 64, 128, 256, 512, 1024, 2047)  # to the longest prompt
    assert {b for b, _ in plan.decode_points} == {1, 2, 4, 8, 16, 32, 64}
    assert (64, 1024) in plan.decode_points and plan.decode_steps == 32
    assert {c for _, c in plan.decode_points} == {16, 128, 512, 1024, 2015}  # 2015 + 33 steps = 2048
    assert (64, 2015) in plan.decode_points  # 64 x 2048 tokens: the whole KV cache
    assert plan.transfer_blocks == (1, 4, 16, 64)  # up to a whole 2048-token prompt


def test_prompts_are_measured_again_in_the_smallest_searched_budgets_chunks_but_not_in_a_quick_plan():
    bench = make_plan(max_model_len=4096, max_num_seqs=64, kv_cache_tokens=131072, block_size=32)
    assert (bench.chunked_budget, bench.chunked_prompt_tokens) == (256, (512, 1024, 2048))
    # the step must hold max_num_seqs tokens; prompts of at least two chunks, shorter than the context
    assert make_plan(max_model_len=4096, max_num_seqs=512, kv_cache_tokens=1 << 20,
                     block_size=32).chunked_prompt_tokens == (1024, 2048)
    assert make_plan(max_model_len=2048, max_num_seqs=64, kv_cache_tokens=131072,
                     block_size=32).chunked_prompt_tokens == (512, 1024)
    for plan in (make_plan(max_model_len=1000, max_num_seqs=64, kv_cache_tokens=131072, block_size=32),  # one row
                 make_plan(max_model_len=4096, max_num_seqs=64, kv_cache_tokens=131072, block_size=32, quick=True)):
        assert (plan.chunked_budget, plan.chunked_prompt_tokens) == (0, ())
    # progress: the chunked engine's start and its rows count as steps of the engine's tables
    assert bench.num_points == len(bench.prefill_prompt_tokens) + len(bench.decode_points) + 4


def test_quick_plan_is_the_fewest_points_the_fits_accept():
    plan = make_plan(max_model_len=2048, max_num_seqs=64, kv_cache_tokens=32768, block_size=32, quick=True)
    assert plan.prefill_prompt_tokens == (32, 256, 1024, 2047)
    # to the longest context (2031 + 17 steps = 2048) and the largest batch, where the KV cache holds them
    assert plan.decode_points == ((1, 16), (1, 64), (1, 512), (1, 2031), (4, 16), (4, 64), (4, 512), (4, 2031),
                                  (16, 16), (16, 64), (16, 512), (16, 2031), (64, 16), (64, 64))
    assert plan.transfer_blocks == (1, 64) and plan.num_points == 18


def test_points_that_do_not_fit_the_kv_cache_or_the_context_are_dropped():
    plan = make_plan(max_model_len=600, max_num_seqs=16, kv_cache_tokens=4000, block_size=32, quick=True)
    # 1024 does not fit: 1/16, 1/4, 1/2 of 600 instead, and the longest prompt
    assert plan.prefill_prompt_tokens == (37, 150, 300, 599)
    # 16 x 529 > 4000 KV tokens; 583 + 17 steps = 600
    assert plan.decode_points == ((1, 16), (1, 64), (1, 512), (1, 583), (4, 16), (4, 64), (4, 512), (4, 583),
                                  (16, 16), (16, 64))


def test_a_kv_cache_too_small_for_two_batch_sizes_is_refused_with_the_fix():
    with pytest.raises(PlanError, match="raise --kv-cache-mb or --max-num-seqs"):
        make_plan(max_model_len=2048, max_num_seqs=64, kv_cache_tokens=100, block_size=32, quick=True)


@pytest.mark.parametrize("spec, cores", [("0", 1), ("0-3", 4), ("0,2,4-5", 4)])
def test_count_cores(spec, cores):
    assert count_cores(spec) == cores


def test_count_cores_refuses_garbage():
    with pytest.raises(ValueError, match="not a core or a range"):
        count_cores("a-b")


def test_model_info_reads_head_dim_from_the_config(tmp_path):
    config = {"num_hidden_layers": 2, "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8,
              "head_dim": 128}
    (tmp_path / "config.json").write_text(json.dumps(config))
    info = model_info(tmp_path, "bfloat16", 32)
    assert info.kv_head_dim == 128  # not 1024 / 16
    assert info.kv_bytes_per_token == 2 * 2 * 8 * 128 * 2


def test_model_info_names_the_fix_for_a_missing_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="pdserve make-model"):
        model_info(tmp_path, "bfloat16", 32)


@pytest.mark.parametrize("transport", ["tcp", "torch", "shm"])
def test_transfer_probe_moves_whole_blocks_over_the_real_transport(transport, monkeypatch):
    from planner.profiler import transfer_probe

    made = []

    class Recorded(transfer_probe.Segment):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self.path)

    monkeypatch.setattr(transfer_probe, "Segment", Recorded)
    geometry = BlockGeometry(num_layers=2, num_kv_heads=2, head_dim=64, block_size=32, dtype="bfloat16")
    rows = list(measure_transfers(geometry, transport, (1, 8), repeats=2))
    assert [(r.transport, r.num_blocks, r.kv_bytes) for r in rows] == [
        (transport, 1, 2 * 2 * 32 * 128 * 2), (transport, 8, 8 * 2 * 2 * 32 * 128 * 2)]
    assert all(0 < r.transfer_s < 5 for r in rows)
    # shm's producer cache lived in a segment of its own, unlinked once measured; the others in none
    assert len(made) == (transport == "shm") and not any(path.exists() for path in made)


def test_the_serving_probe_batches_are_points_the_engine_table_measures():
    from planner.profiler.serving_fit import BATCHES, QUICK_BATCHES
    from planner.profiler.stream_fit import BATCH_PROMPT_TOKENS

    for quick, batches in ((False, BATCHES), (True, QUICK_BATCHES)):
        plan = make_plan(max_model_len=2048, max_num_seqs=128, kv_cache_tokens=1 << 20, block_size=32, quick=quick)
        assert {(b, BATCH_PROMPT_TOKENS) for b in batches} <= set(plan.decode_points)


def test_the_wide_engine_is_the_engine_on_both_cluster_cores_and_only_through_a_cluster():
    from pathlib import Path

    from pdserve.engine import EngineSettings
    from planner.profiler.job import ProfileJob, wide_engine_settings

    engine = EngineSettings(model="models/bench", cpu_cores="0")
    job = ProfileJob(engine=engine, out=Path("p.json"), path="cluster", cluster_cores=("2-3", "0"))
    assert wide_engine_settings(engine, job).cpu_cores == "0,2,3"
    assert wide_engine_settings(engine, ProfileJob(engine=engine, path="cluster", wide=False)) is None
    assert wide_engine_settings(engine, ProfileJob(engine=engine, path="engine")) is None
    assert wide_engine_settings(engine, ProfileJob(engine=engine, path="cluster", cluster_cores=("0", "0"))) is None
    assert ProfileJob(engine=engine, path="cluster", vllm_server=True).vllm_server
    for no_wide_engine in ({"path": "engine"}, {"path": "cluster", "wide": False}):
        with pytest.raises(ValueError, match="--vllm-server measures vLLM's server around the wide engine"):
            ProfileJob(engine=engine, vllm_server=True, **no_wide_engine)
