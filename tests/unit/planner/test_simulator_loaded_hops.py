"""A prefilled request's hop to its decode worker stretched by the load on its prefill core
(`SimSettings.hops` "loaded"): the stretch and the engine's busy share with plain values, and the
simulator on a hand schedule."""

from __future__ import annotations

import pytest

from planner.serving_costs import ServingCosts
from planner.simulator import SimulationError, Topology, simulate
from planner.simulator.core_share import BusyWindow
from planner.simulator.host import HOP_LOSS_PER_PREFILL_BUSY, HOP_LOSS_PER_UNBOUND_CORE, MAX_STOLEN, loaded_hop_stretch
from planner_testkit import ROUND_MODEL, round_settings, spec


def test_the_stretch_is_processor_sharing_against_the_weighted_loads_and_capped():
    assert loaded_hop_stretch(0.0, 0.0) == 1.0
    assert loaded_hop_stretch(0.5, 0.5) == pytest.approx(1 / (1 - 0.5 * HOP_LOSS_PER_UNBOUND_CORE
                                                                 - 0.5 * HOP_LOSS_PER_PREFILL_BUSY))
    assert loaded_hop_stretch(0.5, 0.5) > loaded_hop_stretch(0.5, 0.2) > loaded_hop_stretch(0.2, 0.2)
    assert loaded_hop_stretch(3.0, 1.0) == pytest.approx(1 / (1 - MAX_STOLEN))   # a saturated core stays finite
    assert loaded_hop_stretch(3.0, 1.0, most=0.5) == pytest.approx(2.0)
    for bad in ((-0.1, 0.0), (0.0, 1.5), (0.0, -0.1)):
        with pytest.raises(ValueError, match="busy share"):
            loaded_hop_stretch(*bad)


def test_the_busy_share_counts_the_steps_within_the_window_only():
    busy = BusyWindow(0.5)
    assert busy.busy_share(1.0) == 0.0
    busy.step(0.0, 0.2)                        # before the window (0.5, 1.0] at 1.0
    busy.step(0.6, 0.7)
    busy.step(0.9, 1.3)                        # running: counted up to now
    assert busy.busy_share(1.0) == pytest.approx((0.1 + 0.1) / 0.5)
    assert busy.busy_share(1.3) == pytest.approx(0.4 / 0.5)   # (0.8, 1.3]: the running step's 0.4
    assert busy.busy_share(2.0) == 0.0
    with pytest.raises(ValueError, match="before it starts"):
        busy.step(1.0, 0.9)
    with pytest.raises(ValueError, match="window_s"):
        BusyWindow(0.0)


def test_the_hop_takes_its_prefill_engines_recent_busy_share_and_the_first_token_does_not():
    """No host modelled (no unbound load): only the prefill engine's busy share over the 0.5 s window
    stretches the hop. a's prompt (100 tokens: 0.1 + 0.1 + 0.01 = 0.21 s) runs 0-0.21: busy 0.42 of
    the window at its end, its 20 ms hop x 1 / (1 - 0.4 x 0.42). b's runs 0.21-0.42 right after it:
    0.84 busy, x 1 / (1 - 0.4 x 0.84). The first token's delivery (4 ms) is the same either way."""
    costs = ServingCosts(first_token_s=0.004, handoff_s=0.02)
    requests = [spec(0.0, 100, 4), spec(0.1, 100, 4)]
    timelines = {}
    for model in ("stretched", "loaded"):
        result = simulate(requests, Topology.disaggregated(1, 1), round_settings(serving=costs, hops=model), ROUND_MODEL)
        t = result.timeline
        assert list(t["first_token_s"]) == pytest.approx([0.21, 0.42])
        timelines[model] = (list(t["handed_off_s"] - t["first_token_s"]), list(result.ttft_s))
    assert timelines["stretched"][0] == pytest.approx([0.02, 0.02])
    share = HOP_LOSS_PER_PREFILL_BUSY
    assert timelines["loaded"][0] == pytest.approx([0.02 / (1 - share * 0.42), 0.02 / (1 - share * 0.84)])
    assert timelines["loaded"][1] == pytest.approx(timelines["stretched"][1])


def test_an_unknown_hop_model_is_refused():
    with pytest.raises(SimulationError, match="hops"):
        round_settings(hops="busy")
