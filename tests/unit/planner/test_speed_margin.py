"""The robust pick's margin from a profile's own machine-speed checks (`planner.speed_margin`), with
plain values, and `pdserve plan`'s default reading it."""

from __future__ import annotations

import json

import pytest

from cli.main import main
from planner.profiles.example import EXAMPLE_PROFILE_PATH
from planner.speed_margin import (AUTO, MAX_AUTO_MARGIN, STEADY_DRIFT, SpeedMargin, margin_from_checks,
                                  parse_speed_margin, resolve_speed_margin)


@pytest.mark.parametrize("start_ms, end_ms, margin", [
    (0.916, 0.944, 0.0),      # the steady AVX-512 EPYC (1.03x): the nominal pick
    (1.666, 1.570, 0.0),      # the AVX2 EPYC (1.06x)
    (0.923, 1.194, 0.2936),   # the Xeon without BF16 that slowed during its profile (1.29x)
    (0.922, 0.748, 0.2326),   # the AMX VM that sped up during it (1.23x): it may slow as much again
    (1.0, 2.0, MAX_AUTO_MARGIN),   # moved 2x: capped
    (0.0, 1.0, 0.0),          # no checks (profiles before them)
    (1.0, 0.0, 0.0),
])
def test_the_margin_is_how_far_the_profiles_checks_moved_past_steady(start_ms, end_ms, margin):
    assert margin_from_checks(start_ms, end_ms).value == pytest.approx(margin, abs=1e-3)


def test_the_steady_bound_is_inclusive_and_the_reason_names_what_was_seen():
    assert margin_from_checks(1.0, STEADY_DRIFT).value == 0.0
    assert "steady" in margin_from_checks(1.0, STEADY_DRIFT).why
    moved = margin_from_checks(1.0, 1.2)
    assert moved.value == pytest.approx(0.2) and "moved 1.20x" in moved.why and "20% slower" in moved.why
    assert "re-profile" in margin_from_checks(1.0, 1.8).why and "re-profile" not in moved.why
    assert "no machine-speed checks" in margin_from_checks(0.0, 0.0).why


def test_a_given_margin_is_taken_as_given_and_auto_reads_the_checks():
    assert resolve_speed_margin(0.1, 1.0, 1.5).value == 0.1
    assert resolve_speed_margin(0.0, 1.0, 1.5).value == 0.0
    assert resolve_speed_margin(AUTO, 1.0, 1.3).value == pytest.approx(0.3)


@pytest.mark.parametrize("text, parsed", [("auto", AUTO), ("AUTO", AUTO), ("0", 0.0), ("0.25", 0.25)])
def test_the_cli_value_is_auto_or_a_fraction(text, parsed):
    assert parse_speed_margin(text) == parsed


@pytest.mark.parametrize("text", ["1", "-0.1", "fast", ""])
def test_anything_else_is_refused_with_what_is_accepted(text):
    with pytest.raises(ValueError):
        parse_speed_margin(text)
    with pytest.raises(ValueError, match="must be in"):
        SpeedMargin(1.0, "")


def _profile_that_moved(tmp_path, start_ms: float, end_ms: float):
    data = json.loads(EXAMPLE_PROFILE_PATH.read_text())
    data["hardware"] |= {"machine_ms_start": start_ms, "machine_ms_end": end_ms}
    path = tmp_path / "moved.json"
    path.write_text(json.dumps(data))
    return path


PLAN = ["plan", "--devices", "2", "--objective", "total", "--local-prefill-caps", "0", "--token-budgets", "0",
        "--num-prompts", "100", "--no-progress", "--tpot-slo-ms", "50", "--label", "t"]


def test_plan_by_default_ranks_by_the_goodput_on_a_machine_as_slow_as_its_profile_moved(tmp_path, capsys):
    profile = _profile_that_moved(tmp_path, 1.0, 1.3)
    assert main([*PLAN, "--profile", str(profile), "--output-dir", str(tmp_path / "auto")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    data = json.loads((tmp_path / "auto" / "t_search.json").read_text())
    assert data["speed_margin"] == pytest.approx(0.3) and "moved 1.30x" in data["speed_margin_why"]
    assert "speed margin 30%" in out and "picked by the rate 30% slower" in out
    assert any(r["robust_rate_rps"] is not None for r in data["results"])
    # the same profile planned at its measured speed when asked: no robust column, the nominal ranking
    assert main([*PLAN, "--profile", str(profile), "--speed-margin", "0", "--output-dir", str(tmp_path / "zero")]) == 0
    nominal = json.loads((tmp_path / "zero" / "t_search.json").read_text())
    assert nominal["speed_margin"] == 0.0 and all(r["robust_rate_rps"] is None for r in nominal["results"])


def test_plan_on_a_steady_profile_keeps_the_nominal_pick(tmp_path, capsys):
    profile = _profile_that_moved(tmp_path, 1.0, 1.04)
    assert main([*PLAN, "--profile", str(profile), "--output-dir", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "t_search.json").read_text())
    assert data["speed_margin"] == 0.0 and "steady" in data["speed_margin_why"]
    assert "speed margin 0%" in " ".join(capsys.readouterr().out.split())


def test_plan_refuses_a_margin_it_cannot_read(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([*PLAN, "--speed-margin", "lots", "--output-dir", str(tmp_path)])
    assert "expected 'auto' or a fraction" in capsys.readouterr().err
