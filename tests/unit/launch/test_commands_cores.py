"""How a cluster's cores are dealt to the workers of a pool (`ClusterSpec.cores_of`)."""

from launch.commands import ClusterSpec
from pdserve.engine import EngineSettings


def _spec(cores: dict[str, str]) -> ClusterSpec:
    return ClusterSpec(engine=EngineSettings(model="/m"), num_prefill=0, topology="aggregated", cpu_cores=cores)


def test_a_pools_cores_are_split_evenly_among_its_workers_when_there_are_enough():
    spec = _spec({"decode": "0-3"})
    assert [spec.cores_of("decode", i, 2) for i in range(2)] == ["0,1", "2,3"]
    assert [spec.cores_of("decode", i, 3) for i in range(3)] == ["0,1", "2", "3"]   # the first take the remainder
    assert spec.cores_of("decode", 0, 1) == "0-3"


def test_workers_share_the_pools_cores_when_there_are_fewer_cores_than_workers_or_none_given():
    assert [_spec({"decode": "0-1"}).cores_of("decode", i, 3) for i in range(3)] == ["0-1"] * 3
    assert _spec({}).cores_of("decode", 0, 2) == ""


def test_the_router_runs_on_the_prefill_cores_when_they_are_apart_from_the_decode_cores():
    from launch.commands import router_cores_for

    assert router_cores_for({"prefill": "0", "decode": "1"}, num_prefill=1) == "0"
    assert router_cores_for({"prefill": "0-1", "decode": "2-3"}, num_prefill=2) == "0-1"
    assert router_cores_for({"prefill": "0", "decode": "1"}, num_prefill=0) == ""      # no prefill pool runs
    assert router_cores_for({"prefill": "0-1", "decode": "1-2"}, num_prefill=1) == ""  # shared core: anywhere
    assert router_cores_for({"decode": "0-1"}, num_prefill=0) == ""                    # aggregated
    assert router_cores_for({}, num_prefill=1) == ""                                   # nothing bound
    assert router_cores_for({"prefill": "0"}, num_prefill=1) == "0"                    # decode unbound


def test_the_router_argv_carries_its_cores_unless_told_any_core():
    from dataclasses import replace

    spec = ClusterSpec(engine=EngineSettings(model="/m"), cpu_cores={"prefill": "0", "decode": "1"})
    argv = spec.router_argv("redis://127.0.0.1:1/0")
    assert argv[argv.index("--cpu-cores") + 1] == "0"
    assert "--cpu-cores" not in replace(spec, router_cores="").router_argv("redis://127.0.0.1:1/0")
    argv = replace(spec, router_cores="1").router_argv("redis://127.0.0.1:1/0")
    assert argv[argv.index("--cpu-cores") + 1] == "1"
    assert "--cpu-cores" not in _spec({"decode": "0-1"}).router_argv("redis://127.0.0.1:1/0")


def test_pdserve_up_takes_the_routers_cores():
    from cli.commands.cluster_options import cluster_spec
    from cli.main import build_parser

    args = build_parser().parse_args(["up", "--model", "/m", "--prefill-cores", "0", "--decode-cores", "1"])
    assert cluster_spec(args).router_cpu_cores == "0"
    args = build_parser().parse_args(["up", "--model", "/m", "--prefill-cores", "0", "--decode-cores", "1",
                                      "--router-cores", ""])
    assert cluster_spec(args).router_cpu_cores == ""
