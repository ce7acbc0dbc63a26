"""`pdserve plan` end to end on the example profile (small workloads, so it stays fast)."""

from __future__ import annotations

import json

import pytest

from cli.main import main
from router.policies.placement import CostModel, PlacementConfig

SMALL = ["--num-prompts", "100", "--no-progress", "--tpot-slo-ms", "50"]


def test_plan_prints_each_kinds_best_and_the_pick_and_writes_plot_json_and_router_files(tmp_path, capsys):
    router_dir = tmp_path / "router"
    assert main(["plan", "--devices", "3", "--output-dir", str(tmp_path), "--label", "t", "--local-prefill-caps",
                 "0,256", "--token-budgets", "0,512", "--write-router-config", str(router_dir), *SMALL]) == 0
    out = capsys.readouterr().out
    data = json.loads((tmp_path / "t_search.json").read_text())
    assert (tmp_path / "t_search.png").stat().st_size > 10_000
    assert [r["topology"] for r in data["results"]] == [
        "1P+1D", "1P+2D", "2P+1D",
        "1P+1H", "1P+1H@512", "1P+1H/256", "1P+1H/256@512", "1P+2H", "1P+2H@512", "1P+2H/256", "1P+2H/256@512",
        "2P+1H", "2P+1H@512", "2P+1H/256", "2P+1H/256@512", "1C", "1C@512", "2C", "2C@512", "3C", "3C@512"]
    by_label = {r["topology"]: r for r in data["results"]}
    picked = by_label[data["best"]]
    assert picked["goodput_per_device"] == max(r["goodput_per_device"] for r in data["results"])
    assert list(data["best_by_kind"]) == ["disaggregated", "hybrid", "aggregated"]
    assert all(r["attainment"] >= 0.9 for r in data["results"] if r["max_rate_rps"] > 0)
    for kind, label in data["best_by_kind"].items():
        assert f"{kind}: best {label}:" in out
    assert "recommended:" in out and "MAPE" in out
    placement = PlacementConfig.from_file(router_dir / "placement.json")
    assert placement.local_prefill_max_tokens == picked["local_prefill_max_tokens"]
    cost = CostModel(**json.loads((router_dir / "cost.json").read_text()))
    assert cost.per_token_s > 0 and cost.step_fixed_s > 0 and cost.transfer_per_token_s > 0
    assert f"pdserve up --model MODEL_DIR --topology {picked['kind']}" in out
    planned = json.loads((router_dir / "cluster.json").read_text())
    assert planned["topology"]["kind"] == picked["kind"] and planned["objective"] == "per-device"
    assert planned["topology"]["token_budget"] == picked["token_budget"]
    assert ("--max-num-batched-tokens 512" in out) == (picked["token_budget"] == 512)
    assert planned["predicted_goodput_rps"] == picked["max_rate_rps"]


def test_plan_with_the_total_objective_picks_the_most_goodput_within_the_devices(tmp_path, capsys):
    assert main(["plan", "--devices", "2", "--objective", "total", "--output-dir", str(tmp_path), "--label", "t",
                 "--local-prefill-caps", "0", "--token-budgets", "0", *SMALL]) == 0
    data = json.loads((tmp_path / "t_search.json").read_text())
    picked = next(r for r in data["results"] if r["topology"] == data["best"])
    assert picked["max_rate_rps"] == max(r["max_rate_rps"] for r in data["results"])
    assert "; in all " in capsys.readouterr().out   # the pick against each other kind's best, in req/s


def test_plan_answers_the_fewest_devices_question(tmp_path, capsys):
    assert main(["plan", "--min-devices-for-rate", "2", "--output-dir", str(tmp_path), "--label", "r", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "fewest devices" in out and "1P+1D" in out
    assert (tmp_path / "r_fewest_devices.png").exists()


def test_plan_refuses_a_budget_too_small_for_a_split(tmp_path):
    with pytest.raises(SystemExit, match="--devices must be >= 2"):
        main(["plan", "--devices", "1", "--output-dir", str(tmp_path), *SMALL])


def test_plan_refuses_an_unknown_topology_kind(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--topologies", "disaggregated,colocated", "--output-dir", str(tmp_path), *SMALL])
    assert "a comma-separated list of disaggregated, hybrid, aggregated" in capsys.readouterr().err


def test_plan_refuses_an_unreadable_profile(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "pdserve-profile", "version": 0}')
    with pytest.raises(SystemExit, match="profile version 0 is not readable"):
        main(["plan", "--profile", str(bad), "--output-dir", str(tmp_path), *SMALL])


def test_plan_says_where_the_workload_leaves_the_profiles_measured_range(tmp_path, capsys):
    """The example profile measured decode sequences to 1,024 tokens: 1.5k-token prompts leave it."""
    assert main(["plan", "--devices", "2", "--output-dir", str(tmp_path), "--label", "t", "--local-prefill-caps", "0",
                 "--topologies", "disaggregated", "--workload", "random", "--input-len", "1536", "--output-len", "24",
                 "--range-ratio", "0.3", *SMALL]) == 0
    out = " ".join(capsys.readouterr().out.split())   # rich wraps long lines
    assert "outside the profile: sequences reach" in out and "measured with sequences of up to 1024" in out
    assert "prompts reach" not in out   # 1.5k +- 30% stays under the 2,048 measured


def test_plan_calibrates_admission_by_default_and_says_so_when_told_not_to(tmp_path, capsys):
    common = ["--devices", "2", "--objective", "total", "--topologies", "hybrid", "--local-prefill-caps", "0",
              "--token-budgets", "0", "--output-dir", str(tmp_path), *SMALL]
    assert main(["plan", "--label", "cal", *common]) == 0
    assert "admission uncalibrated" not in capsys.readouterr().out
    assert main(["plan", "--label", "plain", "--no-calibrated-admission", *common]) == 0
    assert "admission uncalibrated" in capsys.readouterr().out
    assert json.loads((tmp_path / "plain_search.json").read_text())["calibrated_admission"] is False
    assert json.loads((tmp_path / "cal_search.json").read_text())["calibrated_admission"] is True
    router_dir = tmp_path / "router"
    assert main(["plan", "--label", "w", "--no-calibrated-admission", "--write-router-config", str(router_dir), *common]) == 0
    assert json.loads((router_dir / "cluster.json").read_text())["calibrated_admission"] is False
