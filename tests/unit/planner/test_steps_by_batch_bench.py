"""bench/steps_by_batch.py explains itself, reads each rate's measured and simulated prompt and
decode steps by batch, and sums each side up by shape, bucket and host kind."""

import pytest

from bench_scripts import bench_functions, bench_help

BENCH = bench_functions("steps_by_batch.py")


def test_the_script_explains_itself():
    shown = bench_help("steps_by_batch.py")
    assert "--resimulated" in shown and "--plot" in shown and "resimulate_kept.py" in shown


def test_a_validation_gives_one_pair_per_bucket_and_side_both_read_and_the_summary_weighs_them():
    validation = {
        "workload": {"shape": "bursty"},
        "runs": [{"rate_rps": 5.0, "prompt_stretch": {"0": {"measured": 1.6, "simulated": 1.2},
                                                      "8-15": {"measured": 4.0, "simulated": 2.0},
                                                      "16-31": {"measured": 3.7, "simulated": None}},
                  "decode_stretch": {"1": {"measured": 1.4, "simulated": 1.05}}},
                 {"rate_rps": 10.0, "prompt_stretch": {"8-15": {"measured": 3.0, "simulated": 3.3}}},
                 {"rate_rps": 12.0}],    # its workers untraced
    }
    pairs = BENCH["step_pairs"]("zen3-s72", validation)
    prompts = [p for p in pairs if p.side == "prompt"]
    assert [(p.rate_rps, p.bucket) for p in prompts] == [(5.0, "0"), (5.0, "8-15"), (10.0, "8-15")]
    assert [(p.side, p.bucket, p.error) for p in pairs if p.side == "decode"] == [("decode", "1", pytest.approx(-0.25))]
    assert prompts[0].kind == "zen3" and prompts[1].error == pytest.approx(-0.5) and prompts[2].error == pytest.approx(0.1)
    lines = BENCH["summary_lines"]("current", prompts)
    # all three: errors -25%, -50%, +10%: mean -22%, |mean| 28%
    assert "| all | 3 | 2.87 | 2.17 | -22% | 28% |" in lines
    assert "| bursty, batch 8-15 | 2 | 3.50 | 2.65 | -20% | 30% |" in lines
    assert lines.index("| bursty, batch 0 | 1 | 1.60 | 1.20 | -25% | 25% |") < lines.index(
        "| bursty, batch 8-15 | 2 | 3.50 | 2.65 | -20% | 30% |")
    assert "| zen3 | 3 | 2.87 | 2.17 | -22% | 28% |" in lines
