"""Admission: admit, or refuse with how long until the queues would drain enough to meet the SLO."""

import pytest

from router.policies.admission import Admit, Refuse, admit
from router.policies.placement import PlacementConfig, Prediction, RequestView

REQUEST = RequestView(num_prompt_tokens=1000, max_tokens=100, ttft_slo_s=1.0, tpot_slo_s=0.1)


def _best(ttft_s):
    return Prediction(ttft_s=ttft_s, decode_stall_s=0.0, kv_transfer_s=0.0, decode_step_s=0.02)


@pytest.mark.parametrize("ttft_s, config, expected_retry_after_s", [
    (0.5, PlacementConfig(), None),                                      # within the SLO
    (2.0, PlacementConfig(), None),                                      # late, exactly at slo * (1 + 1.0)
    (2.3, PlacementConfig(), 2.0),                                       # ceil(2.3 - 1.0)
    (3.0, PlacementConfig(), 2.0),                                       # 2 s of drain is 2 s, not 3
    (7.6, PlacementConfig(), 7.0),
    (1.2, PlacementConfig(refuse_slack=0.0), 1.0),                       # ceil(0.2) = 1
    (1.2, PlacementConfig(refuse_slack=0.0, min_retry_after_s=5.0), 5.0),  # never sooner than the floor
    (1.0, PlacementConfig(refuse_slack=0.0), None),
])
def test_decision_table(ttft_s, config, expected_retry_after_s):
    decision = admit(_best(ttft_s), REQUEST, config)
    if expected_retry_after_s is None:
        assert decision == Admit()
    else:
        assert isinstance(decision, Refuse) and decision.retry_after_s == expected_retry_after_s


def test_request_that_cannot_meet_ttft_is_refused_with_drain_time():
    decision = admit(_best(4.5), REQUEST, PlacementConfig())
    assert decision == Refuse(4.0, "predicted time to first token 4.50 s exceeds the limit of 2.00 s "
                                   "(SLO 1.00 s x 2)")


def test_a_request_no_worker_can_take_is_refused_after_the_minimum_wait():
    decision = admit(None, REQUEST, PlacementConfig(min_retry_after_s=3.0))
    assert isinstance(decision, Refuse) and decision.retry_after_s == 3.0
    assert decision.reason.startswith("no worker can take the request now")
