"""bench/handoff_split.py explains itself and sets runs' traced handoffs side by side (a benchmark's
reading of validations; here on a hand-made validation.json)."""

import json

import pytest

from bench_scripts import bench_functions, bench_help


def test_the_handoff_split_explains_itself():
    shown = bench_help("handoff_split.py")
    assert "--run" in shown and "--step-trace" in shown and "pull 2 steps" in shown


def validation(shape: str, rate: float, two_step_share: float, way_in: bool = False) -> dict:
    handoff = {"requests": 20, "client_first_gap_ms": 50.0, "hops_ms": 8.0, "inside_ms": 42.0, "behind_step_ms": 5.0,
               "pull_ms": 20.0, "join_step_ms": 17.0,
               "pull_steps_share": {"0": 0.0, "1": 1 - two_step_share, "2": two_step_share, "3+": 0.0}}
    return {"workload": {"shape": shape},
            "engine_steps": {str(rate): {"workers": {"decode-1": {"handoff": handoff}}}},
            "runs": [{"rate_rps": rate, "model": "p", "measured": {"median_tpot_ms": 20.0},
                      "simulated": {"median_tpot_ms": 18.0},
                      "handoff_ms": {"measured": {"hops": 8.0, "inside": 42.0} | ({"hop_in": 4.5} if way_in else {}),
                                     "simulated": {"hops": 7.0, "inside": 30.0, "hop_in": 6.5}}}]}


def test_runs_side_by_side_one_row_a_traced_rate(tmp_path, capsys):
    for name, share in (("before", 0.9), ("after", 0.1)):
        (tmp_path / name / "short-long").mkdir(parents=True)
        (tmp_path / name / "short-long" / "validation.json").write_text(
            json.dumps(validation("short-long", 2.0, share, way_in=name == "after")))
    main = bench_functions("handoff_split.py")["main"]
    out = tmp_path / "table.md"
    assert main(["--run", f"A={tmp_path / 'before'}", "--run", f"B={tmp_path / 'after'}", "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    # a run traced before the prefill joins were matched has no way in
    assert lines[2] == "| A | short-long | 2.00 | 50.0 | 8.0 / 7.0 | - | 42.0 / 30.0 | 5.0 | 20.0 | 90% | 17.0 | 20.0 / 18.0 |"
    assert lines[3].startswith("| B | short-long | 2.00 | 50.0 | 8.0 / 7.0 | 4.5 / 6.5 |") and "| 10% |" in lines[3]
    assert capsys.readouterr().out == out.read_text()


def test_a_run_without_traced_handoffs_is_refused(tmp_path):
    main = bench_functions("handoff_split.py")["main"]
    with pytest.raises(SystemExit, match="no validation.json"):
        main(["--run", f"A={tmp_path}"])
    untraced = validation("trace", 1.0, 0.5)
    del untraced["runs"][0]["handoff_ms"]
    (tmp_path / "validation.json").write_text(json.dumps(untraced))
    with pytest.raises(SystemExit, match="no traced handoffs"):
        main(["--run", f"A={tmp_path}"])
