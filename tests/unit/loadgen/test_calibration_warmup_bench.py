"""bench/calibration_warmup.py's pure parts: the variants of a plan it runs beside the plan, and the
totals it reports (loadgen/comparison/admission.py), on plain values and a plan directory."""

import sys
from pathlib import Path

import pytest

from loadgen.comparison.admission import AdmissionSample, admission_totals, admitted_misses
from loadgen.comparison.config import CompareConfig
from loadgen.metrics import SLO
from loadgen.runner import RequestRecord
from planner.router_config import PLACEMENT_FILE, write_router_config
from router.policies.placement import PlacementConfig
from router.scheduler import DEFAULT_COST

REPO = Path(__file__).resolve().parents[3]
SLO_PAIR = SLO(ttft_s=1.0, tpot_s=0.05)


def _bench():
    sys.path.insert(0, str(REPO / "bench"))
    import calibration_warmup

    return calibration_warmup


def _record(index, sent_s, ttft_s, status="ok"):
    chunks = () if status != "ok" else tuple(ttft_s + i * 0.01 for i in range(5))
    return RequestRecord(index=index, scheduled_s=sent_s, sent_s=sent_s, client_queue_s=0.0, prompt_tokens=100,
                         requested_output_tokens=5, status=status, output_tokens=len(chunks), chunk_times_s=chunks)


def test_totals_add_up_each_systems_runs_and_count_the_misses_sent_on_little_evidence():
    early, late = (AdmissionSample(0.0, {"ttft": (1.0, 2)}),), (AdmissionSample(0.0, {"ttft": (1.3, 20)}),)
    unsampled = (AdmissionSample(5.0, {"ttft": (1.3, 20)}),)     # its first sample after the miss was sent
    runs = [
        ("B*-tight", [_record(0, 0.1, 0.5), _record(1, 0.2, 1.5), _record(2, 0.3, 0.0, "refused")], early),
        ("B*-tight", [_record(0, 0.1, 0.5), _record(1, 0.2, 1.2)], late),
        ("B*-tight-min16", [_record(0, 0.1, 0.5), _record(1, 0.2, 0.0, "error")], early),
        ("B*-tight-min16", [_record(0, 0.1, 1.5)], unsampled),
    ]
    tight, old = admission_totals([(system, records, admitted_misses(records, samples, SLO_PAIR))
                                   for system, records, samples in runs], SLO_PAIR, few=16)
    assert (tight.system, tight.runs, tight.offered, tight.refused, tight.admitted_met) == ("B*-tight", 2, 5, 1, 2)
    assert (tight.admitted_missed, tight.missed_early) == (2, 1)       # 1.5 s at 2 observations, 1.2 s at 20
    assert tight.among_admitted == pytest.approx(0.5) and tight.good_share == pytest.approx(0.4)
    # a failure is a miss; one sent before the run's first sample counts as early
    assert (old.runs, old.admitted_met, old.admitted_missed, old.missed_early) == (2, 1, 2, 2)
    (none,) = admission_totals([("B", [_record(0, 0.1, 0.0, "refused")], ())], SLO_PAIR, few=16)
    assert none.among_admitted is None and none.good_share == 0.0


def test_a_variant_is_a_copy_of_the_plan_with_its_placement_keys_changed(tmp_path):
    bench = _bench()
    write_router_config(tmp_path / "plan", PlacementConfig(local_prefill_max_tokens=256), DEFAULT_COST)
    copy = bench.variant_plan(tmp_path / "plan", bench.OLD_RULE, tmp_path / "min16")
    placement = PlacementConfig.from_file(copy / PLACEMENT_FILE)
    assert (placement.calibration_prior_weight, placement.calibration_min_observations) == (0, 16)
    assert placement.local_prefill_max_tokens == 256                  # the rest as planned
    assert PlacementConfig.from_file(tmp_path / "plan" / PLACEMENT_FILE).calibration_prior_weight == 4  # untouched


@pytest.mark.parametrize("spec, message", [
    ("=1", "a distinct NAME"), ("a b={}", "a distinct NAME"), ("q={", "not JSON"), ("q=[1]", "a JSON object"),
    ('q={"calibration_quantile": 2}', "calibration_quantile must be below 1"),
    ('q={"calibration_quantil": 0.5}', r"unknown key\(s\) \['calibration_quantil'\]"),
])
def test_a_bad_variant_is_refused_naming_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=message):
        _bench().parse_variants([spec])


def test_the_variants_default_to_the_old_rule_and_vllm_is_not_run(tmp_path):
    bench = _bench()
    config, args = bench.parse_args(["--plan", str(tmp_path), "--rates", "1,2"])
    assert args.variants == {"min16": bench.OLD_RULE}
    assert config.systems == ("B*-tight",) and not config.with_a
    assert bench.OLD_RULE == {"calibration_prior": 1.0, "calibration_prior_weight": 0, "calibration_min_observations": 16}
    old = PlacementConfig.from_dict(bench.OLD_RULE).calibration()
    assert (old.prior_factor, old.prior_weight, old.min_observations) == (1.0, 0, 16)
    assert CompareConfig().systems[0] == "A"
