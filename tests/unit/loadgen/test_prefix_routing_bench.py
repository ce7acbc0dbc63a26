"""The pure parts of bench/prefix_routing.py (loadgen/comparison/prefix_routing.py): the two
policies as placement configs, one run's figures, the medians, the ABBA order."""

import pytest

from loadgen.comparison.prefix_routing import POLICIES, abba, policy_medians, prefix_run
from loadgen.metrics import SLO
from loadgen.runner import RequestRecord
from router.policies.placement import PlacementConfig


def _record(index, prompt_tokens, ttft_s):
    return RequestRecord(index=index, scheduled_s=0.0, sent_s=0.0, client_queue_s=0.0, prompt_tokens=prompt_tokens,
                         requested_output_tokens=2, status="ok", output_tokens=2, chunk_times_s=(ttft_s, ttft_s + 0.02))


def test_both_policies_are_valid_placement_configs_and_least_loaded_ignores_prefixes():
    configs = {name: PlacementConfig.from_dict(data) for name, data in POLICIES.items()}
    assert configs["prefix-aware"].weights["prefix_hit"] > 0
    assert set(configs["least-loaded"].weights) == {"prefill_balance", "decode_balance"}


def test_a_run_counts_the_share_of_prompt_tokens_the_engines_computed():
    records = [_record(0, 1000, 0.1), _record(1, 1000, 0.3), _record(2, 1000, 2.0)]
    run = prefix_run("prefix-aware", 0, records, 10.0, computed_tokens=1200, slo=SLO(ttft_s=1.0, tpot_s=0.05),
                     other_load_cores=0.01)
    assert run.computed_share == pytest.approx(0.4)
    assert run.ttft_p50_ms == pytest.approx(300.0) and run.attainment == pytest.approx(2 / 3)


def test_medians_per_policy_and_abba_order():
    runs = [prefix_run(p, i, [_record(0, 100, t)], 1.0, c, SLO(ttft_s=1.0), 0.0)
            for p, i, t, c in (("prefix-aware", 0, 0.1, 20), ("least-loaded", 0, 0.5, 90),
                               ("least-loaded", 1, 0.7, 100), ("prefix-aware", 1, 0.3, 40))]
    medians = policy_medians(runs)
    assert medians["prefix-aware"]["computed_share"] == pytest.approx(0.3)
    assert medians["least-loaded"]["ttft_p50_ms"] == pytest.approx(600.0) and medians["least-loaded"]["runs"] == 2
    assert abba(["a", "b"], 2) == [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2), ("b", 2), ("b", 3), ("a", 3)]


def test_a_refusal_is_counted_apart_from_a_failure():
    refused = RequestRecord(index=1, scheduled_s=0.0, sent_s=0.0, client_queue_s=0.0, prompt_tokens=1000,
                            requested_output_tokens=2, status="refused", error="429 predicted TTFT over the SLO")
    failed = RequestRecord(index=2, scheduled_s=0.0, sent_s=0.0, client_queue_s=0.0, prompt_tokens=1000,
                           requested_output_tokens=2, status="error", error="500 boom")
    run = prefix_run("prefix-aware", 0, [_record(0, 1000, 0.1), refused, failed], 10.0, computed_tokens=1000,
                     slo=SLO(ttft_s=1.0), other_load_cores=0.0)
    assert (run.refused, run.failed) == (1, 1)
