"""`pdserve plan --write-router-config`: the router's files for the picked cluster."""

from __future__ import annotations

import json

from loadgen.metrics import SLO
from planner.router_config import router_files, up_flags, write_router_config
from planner.simulator import Topology
from router.policies.placement import CostModel, PlacementConfig

COST = CostModel(fixed_s=0.01, per_token_s=0.00025, step_fixed_s=0.0095, step_per_seq_s=0.0014,
                 per_token2_s=3.5e-8, transfer_fixed_s=0.001, transfer_per_token_s=6e-6,
                 local_interference_per_decode=0.01, chunk_tokens=256, per_chunk_s=0.004, per_prior_unit_s=1e-7)


def test_router_files_carry_every_cost_and_placement_field():
    files = router_files(PlacementConfig(local_prefill_max_tokens=256), COST)
    assert files["cost.json"] == {
        "fixed_s": 0.01, "per_token_s": 0.00025, "step_fixed_s": 0.0095, "step_per_seq_s": 0.0014,
        "per_token2_s": 3.5e-8, "transfer_fixed_s": 0.001, "transfer_per_token_s": 6e-6,
        "local_interference_per_decode": 0.01, "chunk_tokens": 256, "per_chunk_s": 0.004, "per_prior_unit_s": 1e-7}
    assert files["placement.json"]["local_prefill_max_tokens"] == 256
    assert files["placement.json"]["weights"] == dict(PlacementConfig().weights)


def test_written_files_read_back_with_the_routers_loaders(tmp_path):
    placement = PlacementConfig(local_prefill_max_tokens=1024, max_queued_prefill_tokens_per_worker=2048)
    paths = write_router_config(tmp_path / "router", placement, COST)
    assert [p.name for p in paths] == ["cost.json", "placement.json"]
    assert PlacementConfig.from_file(tmp_path / "router" / "placement.json") == placement
    assert CostModel(**json.loads((tmp_path / "router" / "cost.json").read_text())) == COST


def test_up_flags_name_the_topology_pools_files_and_slos(tmp_path):
    assert up_flags(Topology.hybrid(1, 3, 256), tmp_path, SLO(ttft_s=1.0, tpot_s=0.05)) == [
        "--topology", "hybrid", "--prefill", "1", "--decode", "3", "--cost-model", str(tmp_path / "cost.json"),
        "--placement-config", str(tmp_path / "placement.json"), "--slo-ttft-ms", "1000", "--slo-tpot-ms", "50"]
    aggregated = up_flags(Topology.aggregated(4), tmp_path, SLO(ttft_s=2.0))
    assert aggregated[:7] == ["--topology", "aggregated", "--prefill", "0", "--decode", "4", "--cost-model"]
    assert aggregated[-2:] == ["--slo-ttft-ms", "2000"]
    chunked = up_flags(Topology.aggregated(2, token_budget=512), tmp_path, SLO(ttft_s=2.0))
    assert chunked[:8] == ["--topology", "aggregated", "--prefill", "0", "--decode", "2",
                           "--max-num-batched-tokens", "512"]
    assert "--decode-cores" not in chunked and "--kv-cache-mb" not in chunked


def test_up_flags_give_a_wide_worker_its_devices_cores_and_their_kv_cache(tmp_path):
    from cli.commands.cluster_options import cluster_spec
    from cli.main import build_parser

    write_router_config(tmp_path, PlacementConfig(), COST)
    flags = up_flags(Topology.aggregated(1, devices_per_instance=2), tmp_path, SLO(ttft_s=2.0), kv_cache_mb_per_device=512)
    assert flags[:10] == ["--topology", "aggregated", "--prefill", "0", "--decode", "1",
                          "--decode-cores", "0-1", "--kv-cache-mb", "1024"]
    no_model = str(tmp_path / "no-model")  # no config.json: the dtype stays auto, no probe runs
    spec = cluster_spec(build_parser().parse_args(["up", "--model", no_model, *flags]))
    assert spec.cores_of("decode", 0, 1) == "0-1" and spec.engine.kv_cache_bytes == 1024 << 20
    two = up_flags(Topology.aggregated(2, devices_per_instance=2), tmp_path, SLO(ttft_s=2.0))
    spec = cluster_spec(build_parser().parse_args(["up", "--model", no_model, *two]))
    assert [spec.cores_of("decode", i, 2) for i in range(2)] == ["0,1", "2,3"]


def test_pdserve_up_reads_the_written_files_and_flags_as_the_planner_meant(tmp_path):
    from cli.commands.placement_options import scheduler_config
    from cli.main import build_parser

    placement = PlacementConfig(local_prefill_max_tokens=256)
    write_router_config(tmp_path, placement, COST)
    args = build_parser().parse_args(["up", "--model", "models/bench", *up_flags(Topology.hybrid(2, 3, 256, 512),
                                                      tmp_path, SLO(ttft_s=1.5, tpot_s=0.04))])
    assert (args.topology, args.prefill, args.decode, args.max_num_batched_tokens) == ("hybrid", 2, 3, 512)
    config = scheduler_config(args)
    assert config.placement == placement and config.cost_prior == COST
    assert (config.slo.ttft_s, config.slo.tpot_s) == (1.5, 0.04)


def test_the_planned_cluster_reads_back_with_its_prediction_and_router_flags(tmp_path):
    from planner.router_config import read_planned_cluster, write_planned_cluster

    path = write_planned_cluster(tmp_path, Topology.hybrid(1, 1, 256, 512), SLO(ttft_s=3.0, tpot_s=0.035), 2.5,
                                 0.93, "total", "trace/trace, 60 requests")
    assert path == tmp_path / "cluster.json"
    plan = read_planned_cluster(tmp_path)
    assert plan.topology == Topology.hybrid(1, 1, 256, 512) and plan.slo == SLO(ttft_s=3.0, tpot_s=0.035)
    assert (plan.predicted_goodput_rps, plan.predicted_attainment, plan.objective) == (2.5, 0.93, "total")
    assert plan.router_flags() == ["--cost-model", str(tmp_path / "cost.json"), "--placement-config",
                                   str(tmp_path / "placement.json"), "--slo-ttft-ms", "3000", "--slo-tpot-ms", "35"]


def test_a_directory_without_a_plan_is_named_in_the_error(tmp_path):
    import pytest

    from planner.router_config import read_planned_cluster

    with pytest.raises(ValueError, match=r"cluster.json: not a plan written by `pdserve plan"):
        read_planned_cluster(tmp_path)
    (tmp_path / "cluster.json").write_text('{"topology": {"kind": "mesh"}}')
    with pytest.raises(ValueError, match="not a plan"):
        read_planned_cluster(tmp_path)
