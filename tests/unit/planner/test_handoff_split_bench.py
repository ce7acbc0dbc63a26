"""bench/handoff_split.py explains itself and sets runs' traced handoffs side by side (a benchmark's
reading of validations; here on a hand-made validation.json)."""

import json

import pytest

from bench_scripts import REPO, bench_functions, bench_help


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


def test_the_way_in_by_batch_explains_itself():
    assert "--profile" in bench_help("way_in_by_batch.py") and "--step-trace" in bench_help("way_in_by_batch.py")


def test_the_way_in_by_batch_from_a_runs_traces(tmp_path, capsys):
    from pdserve.engine_step_trace import JOIN_COLUMNS, STEP_COLUMNS

    steps_dir = tmp_path / "1P+1D" / "short-long" / "logs" / "steps"
    steps_dir.mkdir(parents=True)

    def write(name: str, columns, rows) -> None:
        (steps_dir / name).write_text("\n".join([",".join(columns)] + [",".join(str(v) for v in r) for r in rows]) + "\n")

    # the decode engine runs batch 10 from 1.0 to 2.0 (steps of 10 ms); a's prompt finishes at 0.5
    # (idle engine: batch 0), b's and c's at 1.2 and 1.5 (batch 10); their ways in 5, 9 and 11 ms
    write("steps-decode-1-5.csv", STEP_COLUMNS, [(1.0 + 0.01 * k, 1.01 + 0.01 * k, 0, 10, 10, 10, 1000)
                                                 for k in range(100)])
    firsts = {"a": (0.5, 0.005), "b": (1.2, 0.009), "c": (1.5, 0.011)}
    write("steps-prefill-0-6.csv", STEP_COLUMNS, [(t - 0.05, t, 1, 0, 100, 0, 100) for t, _ in firsts.values()])
    write("joins-prefill-0-6.csv", JOIN_COLUMNS, [(f"{r}-0a1b2c3d", 100, t - 0.1, t - 0.09, "nan", t - 0.05, t)
                                                  for r, (t, _) in firsts.items()])
    write("joins-decode-1-5.csv", JOIN_COLUMNS, [(f"{r}-9f8e7d6c", 100, t + w, t + w, t + w + 0.004, t + w + 0.005,
                                                  t + w + 0.009) for r, (t, w) in firsts.items()])
    profile = REPO / "planner" / "profiles" / "tiny_2cpu_served.json"
    main = bench_functions("way_in_by_batch.py")["main"]
    assert main(["--run", str(steps_dir.parent.parent), "--profile", str(profile)]) == 0
    out = capsys.readouterr().out
    assert "3 pulled requests" in out
    assert "| 0-0 | 1 | 5.0 | 5.0 |" in out and "| 8-15 | 2 | 10.0 | 10.0 |" in out
    # the prefill engine's steps (its join steps end as each prompt's way in starts): none stepped after
    assert "| none of it | 3 | 9.0 | 8.3 |" in out
    # and beside the hop models: the measured, and each model's charge (no prefill step after any
    # prompt: prefill-core is queued here; a finds no batch, b and c wait behind 10 streams' outputs)
    from planner.profile import load_profile
    serving = load_profile(profile).serving
    hop, wait = serving.handoff_s * 1e3, 10 * (serving.router_cpu_s_per_token + 2 * serving.decode_cpu_s_per_token) * 1e3
    assert "| measured | 9.0 | 8.3 | 10.6 |" in out
    assert f"| hops stretched (unloaded) | {hop:.1f} | {hop:.1f} | {hop:.1f} |" in out
    for name in ("queued", "prefill-core"):
        assert f"| hops {name} | {hop + wait:.1f} | {hop + 2 * wait / 3:.1f} | {hop + wait:.1f} |" in out
    # every prompt over the budget: nothing to set against the batch, said so
    assert main(["--run", str(steps_dir.parent.parent), "--profile", str(profile), "--token-budget", "50"]) == 0
    assert "no pulled request of at most 50 prompt tokens" in capsys.readouterr().out
