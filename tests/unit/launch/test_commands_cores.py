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
