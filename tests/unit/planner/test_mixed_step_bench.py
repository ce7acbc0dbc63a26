"""bench/mixed_step.py explains itself, and predicts a prompt beside decodes chunk by chunk with the
perf model's mixed step (its runs start real engines: a benchmark, not a test)."""

import pytest

from bench_scripts import bench_functions, bench_help
from planner.perf_model import DecodeCoeffs, PerfModel, PrefillCoeffs


def test_the_mixed_step_bench_explains_itself():
    shown = bench_help("mixed_step.py")
    assert "mixed step" in shown and "--budgets" in shown and "--one" not in shown


def test_a_prompt_beside_decodes_is_its_chunks_each_a_mixed_step_in_the_budget_the_decodes_leave():
    model = PerfModel(PrefillCoeffs(step_s=0.01, per_token_s=0.001, per_token2_s=0.0),
                      DecodeCoeffs(step_s=0.02, per_seq_s=0.001, per_context_token_s=0.0))
    predicted = bench_functions("mixed_step.py")["predicted_ttft_s"]
    assert predicted(model, 1000, 512, 0, 0) == pytest.approx(2 * 0.01 + 1.0)          # alone: prefill_s
    # 12 decodes leave 500 tokens a step: two steps, each max(0.01, 0.02) + 0.5 + 12 * 0.001
    assert predicted(model, 1000, 512, 12, 3000) == pytest.approx(2 * (0.02 + 0.5 + 0.012))
    with pytest.raises(ValueError, match="leave nothing"):
        predicted(model, 1000, 16, 16, 0)
