"""`prefill_load`: whether a rate found on a finite request set could last, with plain values.

ROUND_MODEL computes a 400-token prompt in 100-token chunks in 4 x 0.1 + 0.4 + 0.16 = 0.96 s."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
from rich.console import Console

from planner.perf_model import PrefillCoeffs
from planner.plan_job import _print_burst_only
from planner.simulator import Topology
from planner.sustained import prefill_load
from tests.unit.planner.planner_testkit import ROUND_MODEL, spec

ONE_PER_S = [spec(float(t), 400, 8) for t in range(5)]  # window 4 s x 5/4 = 5 s, work 5 x 0.96 s


@pytest.mark.parametrize("topology, load", [
    (Topology.disaggregated(1, 1), 0.96),  # one prefill engine
    (Topology.disaggregated(2, 1), 0.48),
    (Topology.hybrid(1, 1), 0.48),  # the decode worker may compute prompts too
    (Topology.aggregated(2), 0.48),
    (Topology.aggregated(1), 0.96),
])
def test_the_prompts_work_over_the_engines_that_compute_them_while_they_arrive(topology, load):
    assert prefill_load(ONE_PER_S, topology, ROUND_MODEL, chunk_tokens=100) == pytest.approx(load)


def test_twice_as_fast_arrivals_outrun_one_engine_and_a_wide_engine_counts_its_own_speed():
    fast = [replace(r, arrival_s=r.arrival_s / 2) for r in ONE_PER_S]
    assert prefill_load(fast, Topology.disaggregated(1, 1), ROUND_MODEL, 100) == pytest.approx(1.92)
    wide = replace(ROUND_MODEL, prefill=PrefillCoeffs(step_s=0.05, per_token_s=0.0005, per_token2_s=5e-7))
    model = replace(ROUND_MODEL, wide=((2, wide),))
    assert prefill_load(fast, Topology.aggregated(1, devices_per_instance=2), model, 100) == pytest.approx(0.96)


def test_the_chunk_size_and_degenerate_sets():
    # 400 tokens in one chunk: 0.1 + 0.4 + 0.16 = 0.66 s each
    assert prefill_load(ONE_PER_S, Topology.disaggregated(1, 1), ROUND_MODEL, 400) == pytest.approx(3.3 / 5)
    assert prefill_load(ONE_PER_S[:1], Topology.disaggregated(1, 1), ROUND_MODEL, 100) == 0.0
    same_instant = [spec(0.0, 400, 8)] * 3
    assert prefill_load(same_instant, Topology.disaggregated(1, 1), ROUND_MODEL, 100) == float("inf")


def test_plan_warns_only_where_the_load_passes_one():
    out = io.StringIO()
    _print_burst_only(Console(file=out, width=200), {"1P+1D @ 6.25": {"prefill_load": 1.44},
                                                      "2C @ 3.56": {"prefill_load": 0.61}}, num_requests=40)
    text = out.getvalue()
    assert "1P+1D @ 6.25 req/s" in text and "144%" in text and "40 requests" in text
    assert "2C @" not in text
