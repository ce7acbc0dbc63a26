"""`pdserve plan` end to end on the example profile (small workloads, so it stays fast)."""

from __future__ import annotations

import json

import pytest

from cli.main import main

SMALL = ["--num-prompts", "200", "--no-progress", "--tpot-slo-ms", "50"]


def test_plan_prints_the_best_split_and_writes_plot_and_json(tmp_path, capsys):
    assert main(["plan", "--devices", "3", "--output-dir", str(tmp_path), "--label", "t", *SMALL]) == 0
    out = capsys.readouterr().out
    data = json.loads((tmp_path / "t_search.json").read_text())
    assert (tmp_path / "t_search.png").stat().st_size > 10_000
    assert [r["topology"] for r in data["results"]] == ["1P+1D", "1P+2D", "2P+1D", "1C", "2C", "3C"]
    best = max((r for r in data["results"] if r["num_colocated"] == 0), key=lambda r: r["goodput_per_device"])
    assert data["best"] == best["topology"]
    assert all(r["attainment"] >= 0.9 for r in data["results"] if r["max_rate_rps"] > 0)
    assert f"recommended: {best['num_prefill']} prefill + {best['num_decode']} decode" in out
    assert "colocated alternative" in out and "MAPE" in out


def test_plan_answers_the_fewest_devices_question(tmp_path, capsys):
    assert main(["plan", "--min-devices-for-rate", "2", "--output-dir", str(tmp_path), "--label", "r", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "fewest devices" in out and "1P+1D" in out
    assert (tmp_path / "r_fewest_devices.png").exists()


def test_plan_refuses_a_budget_too_small_for_a_split(tmp_path):
    with pytest.raises(SystemExit, match="--devices must be >= 2"):
        main(["plan", "--devices", "1", "--output-dir", str(tmp_path), *SMALL])


def test_plan_refuses_an_unreadable_profile(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "pdserve-profile", "version": 0}')
    with pytest.raises(SystemExit, match="profile version 0 is not readable"):
        main(["plan", "--profile", str(bad), "--output-dir", str(tmp_path), *SMALL])
