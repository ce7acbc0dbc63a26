"""The benchmarks' pdserve clusters as specs (nothing is started): which worker gets which core."""

from pathlib import Path

import pytest

from launch.comparison_systems import PdserveCluster
from pdserve.engine import EngineSettings

SETTINGS = EngineSettings(model="models/bench", kv_cache_bytes=512 << 20)


@pytest.mark.parametrize("topology, prefill, decode, cores", [
    ("disaggregated", 1, 1, {"prefill": "0", "decode": "1"}),
    ("hybrid", 1, 1, {"prefill": "0", "decode": "1"}),
    ("aggregated", 0, 2, {"prefill": "", "decode": "0,1"}),   # the launcher splits the pool: one core each
    ("aggregated", 0, 1, {"prefill": "", "decode": "0"}),     # one device, as the planner counted it
])
def test_a_sized_cluster_gives_each_worker_one_core_prefill_first(topology, prefill, decode, cores):
    cluster = PdserveCluster.sized(SETTINGS, "0", "1", Path("/tmp/logs"), "auto", "B*-tight", topology, prefill,
                                   decode, ("--slo-ttft-ms", "3000"))
    spec = cluster.spec
    assert (spec.num_prefill, spec.num_decode, spec.topology, spec.cpu_cores) == (prefill, decode, topology, cores)
    assert spec.router_flags == ("--slo-ttft-ms", "3000") and spec.engine == SETTINGS
    if decode == 2:
        assert [spec.cores_of("decode", i, 2) for i in range(2)] == ["0", "1"]


def test_a_cluster_with_more_workers_than_cores_is_refused():
    with pytest.raises(ValueError, match="B\\*-loose runs 3 workers of 1 cores, the comparison has 2 cores"):
        PdserveCluster.sized(SETTINGS, "0", "1", Path("/tmp/logs"), "auto", "B*-loose", "disaggregated", 1, 2)
    with pytest.raises(ValueError, match="runs 2 workers of 2 cores, the comparison has 2 cores"):
        PdserveCluster.sized(SETTINGS, "0", "1", Path("/tmp/logs"), "auto", "B*", "aggregated", 0, 2, (), 2)
    with pytest.raises(ValueError, match="only aggregated workers span cores"):
        PdserveCluster.sized(SETTINGS, "0", "1,2,3", Path("/tmp/logs"), "auto", "B*", "hybrid", 1, 1, (), 2)


def test_a_wide_worker_gets_both_cores_and_the_kv_cache_of_both():
    cluster = PdserveCluster.sized(SETTINGS, "0", "1", Path("/tmp/logs"), "auto", "B*", "aggregated", 0, 1, (), 2)
    spec = cluster.spec
    assert spec.cpu_cores == {"prefill": "", "decode": "0,1"} and spec.cores_of("decode", 0, 1) == "0,1"
    assert spec.engine.kv_cache_bytes == 2 * SETTINGS.kv_cache_bytes
