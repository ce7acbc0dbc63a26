"""Invariants of the simulator on random workloads: every request finishes exactly once, nothing
happens before it could, token and gap counts add up, runs are deterministic."""

from __future__ import annotations

import numpy as np
import pytest
from planner_testkit import ROUND_MODEL, round_settings

from loadgen.metrics import SLO
from loadgen.workload import combine, gamma, uniform_lengths
from planner.perf_model import fit_perf_model
from planner.profile import load_profile
from planner.profiles.example import EXAMPLE_PROFILE_PATH
from planner.simulator import SimSettings, Topology, simulate
from planner.simulator.result import TIMELINE

TOPOLOGIES = [Topology.disaggregated(1, 1), Topology.disaggregated(2, 3), Topology.disaggregated(3, 1),
              Topology.hybrid(1, 1), Topology.hybrid(2, 3, 64), Topology.colocated(1), Topology.colocated(3)]


def bursty_workload(n: int = 400, rate_rps: float = 3.0, seed: int = 7):
    return combine(gamma(rate_rps, 2.0, n, seed), uniform_lengths(n, 60, 20, 0.9, seed))


@pytest.mark.parametrize("topology", TOPOLOGIES, ids=lambda t: t.label)
@pytest.mark.parametrize("decode_pick", ["handoff", "arrival"])
def test_every_request_finishes_once_and_no_event_precedes_its_cause(topology, decode_pick):
    requests = bursty_workload()
    result = simulate(requests, topology, round_settings(num_kv_blocks=40, decode_pick=decode_pick), ROUND_MODEL)
    assert result.num_requests == len(requests)
    stacked = np.vstack([result.timeline[name] for name in TIMELINE])
    assert not np.isnan(stacked).any()
    assert (np.diff(stacked, axis=0) >= 0).all()  # arrival <= prefill start <= first token <= ... <= finish
    assert result.timeline["arrival_s"].tolist() == [r.arrival_s for r in requests]
    assert result.output_tokens.sum() == sum(r.output_tokens for r in requests)
    # one gap per token after the first: handoff gaps plus weighted decode steps
    assert len(result.itl_s) == sum(r.output_tokens - 1 for r in requests)
    assert (result.itl_s > 0).all()


def test_simulation_is_deterministic():
    requests = bursty_workload()
    first = simulate(requests, Topology.disaggregated(2, 2), round_settings(), ROUND_MODEL)
    second = simulate(requests, Topology.disaggregated(2, 2), round_settings(), ROUND_MODEL)
    for name in TIMELINE:
        assert first.timeline[name].tolist() == second.timeline[name].tolist()


def test_more_decode_instances_never_raise_tpot_p90_at_fixed_load():
    requests = bursty_workload(rate_rps=6.0)
    p90 = [np.nanpercentile(simulate(requests, Topology.disaggregated(2, m), round_settings(), ROUND_MODEL).tpot_s, 90)
           for m in (1, 2, 4)]
    assert p90[0] > p90[1] > p90[2]


def test_summary_uses_loadgen_keys_and_slo_attainment():
    requests = bursty_workload(n=50, rate_rps=0.5)
    result = simulate(requests, Topology.disaggregated(1, 1), round_settings(), ROUND_MODEL)
    slo = SLO(ttft_s=10.0, tpot_s=10.0)
    summary = result.summary(slo)
    assert summary["num_prompts"] == 50 and summary["completed"] == 50 and summary["failed"] == 0
    assert summary["slo_attainment"] == 1.0
    assert summary["mean_ttft_ms"] == pytest.approx(float(np.mean(result.ttft_s)) * 1000)
    assert result.attainment(SLO(ttft_s=1e-6)) == 0.0


def test_ten_thousand_requests_on_the_example_profile_simulate_in_seconds():
    profile = load_profile(EXAMPLE_PROFILE_PATH)
    model = fit_perf_model(profile).model
    requests = combine(gamma(4.0, 1.0, 10_000, 1), uniform_lengths(10_000, 512, 128, 0.5, 2))
    result = simulate(requests, Topology.disaggregated(2, 2), SimSettings.from_profile(profile), model)
    assert result.num_requests == 10_000
    assert np.isfinite(result.timeline["finish_s"]).all()
