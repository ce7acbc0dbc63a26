"""bench/resimulate_kept.py explains itself, scores a validation's rows as the text says, finds every
kept validation and its profile, and resimulates one for real (seconds: no cluster)."""

import json
from pathlib import Path

import pytest

from bench_scripts import bench_functions, bench_help

REPO = Path(__file__).resolve().parents[3]


def row(errors: dict, goodput_error=None, measured=10.0, simulated=10.0, measured_bracketed=True,
        simulated_bracketed=True) -> dict:
    return {"mean_abs_error_to_knee": errors, "goodput_error": goodput_error,
            "goodput_rps": {"measured": measured, "measured_bracketed": measured_bracketed, "simulated": simulated,
                            "simulated_bracketed": simulated_bracketed}}


def test_the_resimulation_of_every_kept_validation_explains_itself():
    shown = bench_help("resimulate_kept.py")
    assert "--variant" in shown and "--only" in shown and "optimistic" in shown


def test_variants_are_named_flags_and_a_name_twice_or_without_flags_is_refused():
    variants_of = bench_functions("resimulate_kept.py")["variants_of"]
    assert variants_of(["current=", "wake=--client-placement wake --hops queued"]) == {
        "current": [], "wake": ["--client-placement", "wake", "--hops", "queued"]}
    with pytest.raises(SystemExit, match="given twice"):
        variants_of(["a=", "a=--x"])
    with pytest.raises(SystemExit, match="NAME=FLAGS"):
        variants_of(["wake"])


def test_a_validation_scores_its_percentiles_its_goodput_and_its_optimistic_rows():
    fns = bench_functions("resimulate_kept.py")
    rows = [row({"median_ttft_ms": 0.1, "p90_ttft_ms": -0.3, "median_tpot_ms": 0.2, "p90_tpot_ms": None},
                goodput_error=0.2, measured=10, simulated=12),
            row({"median_ttft_ms": 0.0, "p90_ttft_ms": 0.0, "median_tpot_ms": 0.0, "p90_tpot_ms": 0.0},
                goodput_error=-0.3, measured=10, simulated=7),
            # the simulated past the grid: at least its top, 11.5 over 10: optimistic
            row({}, measured=10, simulated=11.5, simulated_bracketed=False),
            # the measured past the grid: nothing to say
            row({}, measured=12, simulated=20, measured_bracketed=False)]
    score = fns["score"](rows)
    assert score["rows"] == 4 and score["percentiles"] == 7
    assert score["percentile_error"] == pytest.approx(0.6 / 7)
    assert score["goodput_error"] == pytest.approx(0.25) and score["goodput_rows"] == 2
    assert score["optimistic_rows"] == 2
    pooled = fns["overall"]({"a": score, "b": fns["score"]([row({"median_ttft_ms": 0.5}, goodput_error=0.1)])})
    assert pooled["percentile_error"] == pytest.approx(1.1 / 8) and pooled["goodput_error"] == pytest.approx(0.6 / 3)
    assert pooled["rows"] == 5 and pooled["optimistic_rows"] == 2


def test_every_kept_validation_and_its_profile_are_in_the_repository():
    fns = bench_functions("resimulate_kept.py")
    results = fns["RESULTS"]
    for kept in fns["KEPT"]:
        assert list((results / kept.directory).glob("*/*/validation.json")), kept.name
        assert (results / kept.profile).is_file(), kept.name
    assert len({kept.name for kept in fns["KEPT"]}) == len(fns["KEPT"])


def test_one_kept_validation_resimulates_under_two_placements(tmp_path):
    main = bench_functions("resimulate_kept.py")["main"]
    assert main(["--variant", "room=--client-placement router-room", "--variant", "wake=--client-placement wake",
                 "--only", "amx167-cores-2", "--out", str(tmp_path)]) == 0
    written = json.loads((tmp_path / "resimulated_kept.json").read_text())
    room, wake = written["scores"]["room"], written["scores"]["wake"]
    assert set(room) == {"amx167-cores-2", "all"} and room["all"]["rows"] == 4
    # the run measured how much of the client ran on the decode core: the placement moves the errors
    assert room["amx167-cores-2"]["percentile_error"] != wake["amx167-cores-2"]["percentile_error"]
    assert (tmp_path / "resimulated_kept.png").exists() and "| amx167-cores-2 | 4 |" in (
        tmp_path / "resimulated_kept.md").read_text()
    with pytest.raises(SystemExit, match="not kept validations"):
        main(["--variant", "a=", "--only", "nowhere", "--out", str(tmp_path)])
