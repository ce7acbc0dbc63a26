"""The placement policy as an operator writes it: defaults, files, and errors that name the key."""

import json

import pytest

from router.policies.placement.config import PlacementConfig


def test_defaults():
    config = PlacementConfig()
    assert dict(config.weights) == {"ttft_headroom": 1.0, "tpot_headroom": 1.0, "prefix_hit": 0.25,
                                    "decode_balance": 0.25, "prefill_balance": 0.25}
    assert dict(config.class_rank) == {"interactive": 0, "": 1, "batch": 2}
    assert (config.local_prefill_max_tokens, config.refuse_slack, config.min_retry_after_s, config.class_gap_s,
            config.max_queued_prefill_tokens_per_worker, config.calibration_quantile) == (0, 0.0, 1.0, 2.0, 4096, 0.75)
    assert config.calibrate_ttft == "wait"
    assert PlacementConfig.from_dict({"calibrate_ttft": "whole"}).calibrate_ttft == "whole"
    assert (config.calibration_prior, config.calibration_prior_weight, config.calibration_min_observations) == (1.0, 4, 1)


def test_the_calibration_keys_make_the_routers_calibration():
    config = PlacementConfig.from_dict({"calibration_quantile": 0.9, "calibration_prior": 1.2,
                                        "calibration_prior_weight": 0, "calibration_min_observations": 16})
    calibration = config.calibration()
    assert (calibration.quantile, calibration.prior_factor, calibration.prior_weight,
            calibration.min_observations) == (0.9, 1.2, 0, 16)


def test_listed_weights_are_the_whole_mix_and_cannot_be_changed_afterwards():
    weights = {"ttft_headroom": 2.0}
    config = PlacementConfig.from_dict({"weights": weights})
    weights["prefix_hit"] = 1.0
    assert dict(config.weights) == {"ttft_headroom": 2.0}
    with pytest.raises(TypeError):
        config.weights["prefix_hit"] = 1.0
    assert config == PlacementConfig(weights={"ttft_headroom": 2.0})


def test_an_unknown_scorer_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"weights: unknown scorer\(s\) \['ttft'\]; known: \['decode_balance', "
                                         r"'prefill_balance', 'prefix_hit', 'tpot_headroom', 'ttft_headroom'\]"):
        PlacementConfig.from_dict({"weights": {"ttft": 1.0}})


@pytest.mark.parametrize("data, message", [
    ({"refuse_slak": 1.0}, r"unknown key\(s\) \['refuse_slak'\]; known: \['weights', "),
    ({"refuse_slack": "1"}, r"refuse_slack: expected a number, got '1'"),
    ({"local_prefill_max_tokens": 10.5}, r"local_prefill_max_tokens: expected a whole number of tokens, got 10.5"),
    ({"max_queued_prefill_tokens_per_worker": True}, r"max_queued_prefill_tokens_per_worker: expected a whole"),
    ({"class_rank": {"batch": 1.5}}, r"class_rank.batch: expected a whole number, got 1.5"),
    ({"weights": [1.0]}, r"weights: expected a mapping of name -> a number"),
    ({"weights": {"prefix_hit": -1.0}}, r"weights: need finite weights >= 0 with at least one > 0"),
    ({"weights": {"prefix_hit": 0.0}}, r"weights: need finite weights >= 0 with at least one > 0"),
    ({"class_rank": {}}, r"class_rank: need at least one class"),
    ({"min_retry_after_s": -1}, r"min_retry_after_s must be a finite number >= 0, got -1"),
        ({"class_gap_s": float("inf")}, r"class_gap_s must be a finite number >= 0, got inf"),
    ({"calibrate_ttft": 1}, r"calibrate_ttft: expected one of whole, wait, got 1"),
    ({"calibrate_ttft": "queue"}, r"calibrate_ttft must be one of whole, wait, got 'queue'"),
    ({"calibration_prior_weight": 2.5}, r"calibration_prior_weight: expected a whole number, got 2.5"),
    ({"calibration_prior": 9.0}, r"the admission calibration: calibration_prior must be within .* = \[0.25, 4\], got 9"),
    ({"calibration_min_observations": 0}, r"the admission calibration: calibration_min_observations must be a whole "
                                          r"number within 1..64 \(the window\), got 0"),
    ({"calibration_prior_weight": 1000}, r"calibration_prior_weight must be a whole number within 0..64"),
    # checked with the calibration off too: turning it on later must not be what fails
    ({"calibration_quantile": 0, "calibration_prior": 50.0}, r"the admission calibration: calibration_prior must be"),
])
def test_a_bad_value_is_refused_naming_its_key(data, message):
    with pytest.raises(ValueError, match=message):
        PlacementConfig.from_dict(data)


def test_an_unknown_class_ranks_as_the_default_class_or_last():
    assert [PlacementConfig().rank_of(c) for c in ("interactive", "", "batch", "gold")] == [0, 1, 2, 1]
    assert PlacementConfig(class_rank={"a": 0, "b": 3}).rank_of("gold") == 3


def test_from_a_json_file(tmp_path):
    path = tmp_path / "placement.json"
    path.write_text(json.dumps({"local_prefill_max_tokens": 512, "class_gap_s": 5}))
    config = PlacementConfig.from_file(path)
    assert (config.local_prefill_max_tokens, config.class_gap_s) == (512, 5)


def test_from_a_yaml_file(tmp_path):
    pytest.importorskip("yaml")
    path = tmp_path / "placement.yaml"
    path.write_text("weights:\n  ttft_headroom: 1.0\n  prefix_hit: 0.5\nclass_rank:\n  interactive: 0\n  batch: 1\n")
    config = PlacementConfig.from_file(path)
    assert dict(config.weights) == {"ttft_headroom": 1.0, "prefix_hit": 0.5}
    assert dict(config.class_rank) == {"interactive": 0, "batch": 1}


def test_file_errors_name_the_file_and_the_key(tmp_path):
    path = tmp_path / "placement.json"
    path.write_text(json.dumps({"refuse_slack": -0.5}))
    with pytest.raises(ValueError, match=r"placement.json: refuse_slack must be a finite number >= 0, got -0.5"):
        PlacementConfig.from_file(path)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"placement.json: a placement config is a mapping"):
        PlacementConfig.from_file(path)
    other = tmp_path / "placement.toml"
    other.write_text("")
    with pytest.raises(ValueError, match=r"placement.toml: unknown extension '.toml'"):
        PlacementConfig.from_file(other)
