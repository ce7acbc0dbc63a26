"""Admission: admit, or refuse with how long until the queues would drain enough to meet the SLO;
with a TPOT SLO, refuse when the decode batch is full for it; predictions scaled by calibration."""

import pytest

from router.policies.admission import Admit, Refuse, Scale, admit, refusal_counts
from router.policies.placement import PlacementConfig, Prediction, RequestView

REQUEST = RequestView(num_prompt_tokens=1000, max_tokens=100, ttft_slo_s=1.0, tpot_slo_s=0.1)
LATE_OK = PlacementConfig(refuse_slack=1.0)   # admits up to twice the SLO


def _best(ttft_s, step_s=0.02):
    return Prediction(ttft_s=ttft_s, decode_stall_s=0.0, kv_transfer_s=0.0, decode_step_s=step_s)


@pytest.mark.parametrize("ttft_s, config, expected_retry_after_s", [
    (0.5, PlacementConfig(), None),                                      # within the SLO
    (1.0, PlacementConfig(), None),                                      # exactly at it
    (1.2, PlacementConfig(), 1.0),                                       # default slack 0: ceil(0.2) = 1
    (1.2, PlacementConfig(min_retry_after_s=5.0), 5.0),                  # never sooner than the floor
    (2.0, LATE_OK, None),                                                # late, exactly at slo * (1 + 1.0)
    (2.3, LATE_OK, 2.0),                                                 # ceil(2.3 - 1.0)
    (3.0, LATE_OK, 2.0),                                                 # 2 s of drain is 2 s, not 3
    (7.6, LATE_OK, 7.0),
])
def test_decision_table(ttft_s, config, expected_retry_after_s):
    decision = admit(_best(ttft_s), REQUEST, config)
    if expected_retry_after_s is None:
        assert decision == Admit()
    else:
        assert isinstance(decision, Refuse) and decision.retry_after_s == expected_retry_after_s


def test_request_that_cannot_meet_ttft_is_refused_with_drain_time():
    decision = admit(_best(4.5), REQUEST, LATE_OK)
    assert decision == Refuse(4.0, "predicted time to first token 4.50 s exceeds the limit of 2.00 s "
                                   "(SLO 1.00 s x 2)", "ttft")


def test_a_request_no_worker_can_take_is_refused_after_the_minimum_wait():
    decision = admit(None, REQUEST, PlacementConfig(min_retry_after_s=3.0))
    assert isinstance(decision, Refuse) and decision.retry_after_s == 3.0
    assert decision.reason.startswith("no worker can take the request now")


@pytest.mark.parametrize("ttft_s, scale, admitted", [
    (0.6, Scale(ttft=1.5), True),     # 0.9 s
    (0.6, Scale(ttft=2.0), False),    # 1.2 s: the model ran low lately
    (1.5, Scale(ttft=0.5), True),     # 0.75 s: the model ran high lately
])
def test_the_ttft_prediction_is_scaled_before_it_is_judged(ttft_s, scale, admitted):
    # "whole": all of it is scaled (the default, "wait", scales only its wait: below)
    decision = admit(_best(ttft_s), REQUEST, PlacementConfig(calibrate_ttft="whole"), scale)
    assert (decision == Admit()) is admitted
    if not admitted:
        assert decision.retry_after_s == 1.0 and "(x2.00, as recent requests saw" in decision.reason


@pytest.mark.parametrize("step_s, scale, judge_tpot, admitted", [
    (0.09, Scale(), True, True),
    (0.11, Scale(), True, False),          # the batch with it steps past the TPOT SLO
    (0.11, Scale(), False, True),          # no TPOT SLO set: never judged
    (0.06, Scale(tpot=2.0), True, False),  # 0.12 s once scaled
])
def test_a_full_decode_batch_refuses_on_tpot(step_s, scale, judge_tpot, admitted):
    decision = admit(_best(0.5, step_s), REQUEST, PlacementConfig(min_retry_after_s=2.0), scale, judge_tpot=judge_tpot)
    assert (decision == Admit()) is admitted
    if not admitted:
        assert decision.retry_after_s == 2.0 and "time per output token" in decision.reason


def test_without_a_ttft_slo_a_late_prediction_is_not_refused():
    assert admit(_best(50.0), REQUEST, PlacementConfig(), judge_ttft=False) == Admit()


def test_with_the_wait_calibrated_a_long_prompt_is_judged_on_its_own_prefill_as_predicted():
    # 1.6 s predicted: 1.0 s of own prefill, 0.6 s waiting for the prompts ahead; recent requests
    # waited 1.5x what was predicted. The whole TTFT scaled (2.4 s) misses a 2 s SLO; the wait
    # scaled (1.0 + 0.9, the default) does not. A request that waits nothing is not scaled at all.
    request = RequestView(num_prompt_tokens=2000, max_tokens=20, ttft_slo_s=2.0, tpot_slo_s=0.1)
    queued = Prediction(ttft_s=1.6, decode_stall_s=0.0, kv_transfer_s=0.0, decode_step_s=0.02, ttft_wait_s=0.6)
    whole = admit(queued, request, PlacementConfig(calibrate_ttft="whole"), Scale(ttft=1.5))
    assert isinstance(whole, Refuse) and "2.40 s (x1.50, as recent requests saw" in whole.reason
    assert admit(queued, request, PlacementConfig(), Scale(ttft=1.5)) == Admit()
    still_late = admit(queued, request, PlacementConfig(), Scale(ttft=2.0))
    assert isinstance(still_late, Refuse) and "2.20 s (its wait x2.00" in still_late.reason
    alone = Prediction(ttft_s=1.9, decode_stall_s=0.0, kv_transfer_s=0.0, decode_step_s=0.02)
    assert admit(alone, request, PlacementConfig(), Scale(ttft=4.0)) == Admit()
    assert isinstance(admit(alone, request, PlacementConfig(calibrate_ttft="whole"), Scale(ttft=4.0)), Refuse)


def test_each_refusal_says_what_decided_it_and_a_summary_counts_them_by_that():
    assert admit(None, REQUEST, PlacementConfig()).by == "no_worker"
    assert admit(_best(1.2), REQUEST, PlacementConfig()).by == "ttft"
    assert admit(_best(0.5, 0.11), REQUEST, PlacementConfig(), judge_tpot=True).by == "tpot"
    assert admit(_best(1.2, 0.11), REQUEST, PlacementConfig(), judge_tpot=True).by == "ttft"   # TTFT judged first
    assert refusal_counts({"tpot": 2, "ttft": 3}) == "5 request(s) (ttft 3, tpot 2)"
    assert refusal_counts({"no_worker": 1, "ttft": 0}) == "1 request(s) (no_worker 1)"
