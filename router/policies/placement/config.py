"""The placement policy as data: scorer weights, caps, admission slack, SLO classes.

An operator writes it (JSON, or YAML when PyYAML is installed); `from_dict` / `from_file` refuse an
unknown key, a wrong type or a bad value with a message naming the key and how to fix it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path as FilePath
from types import MappingProxyType
from typing import Any

from router.policies.calibration import CalibrationConfig
from router.policies.placement.scorers import DEFAULT_WEIGHTS, SCORERS

DEFAULT_CLASS_RANK: Mapping[str, int] = {"interactive": 0, "": 1, "batch": 2}
_TOKEN_KEYS = ("local_prefill_max_tokens", "max_queued_prefill_tokens_per_worker")
_INT_KEYS = _TOKEN_KEYS + ("calibration_prior_weight", "calibration_min_observations")
_FLOAT_KEYS = ("refuse_slack", "min_retry_after_s", "class_gap_s", "calibration_quantile", "calibration_prior")
CALIBRATE_TTFT = ("whole", "wait")  # what the TTFT calibration scales (PlacementConfig.calibrate_ttft)


@dataclass(frozen=True)
class PlacementConfig:
    """`weights`: scorer name -> weight >= 0; the scorers listed are the whole mix (an unlisted one
    weighs 0). `local_prefill_max_tokens`: the most uncached tokens a decode worker computes itself
    (0: no cap). `refuse_slack`: admission refuses when the best predicted TTFT exceeds
    ttft_slo * (1 + refuse_slack) (and the decode step, with a TPOT SLO, tpot_slo * (1 + slack)).
    `calibration_quantile`: admission scales its predictions by that quantile of recent requests'
    observed / predicted ratios (`router.policies.calibration`; 0: no scaling). `class_rank`: SLO class -> rank, 0 first; a class not listed
    ranks as "" (or last if "" is not listed). `class_gap_s`: seconds of waiting that make up one
    rank. `max_queued_prefill_tokens_per_worker`: the dispatch gate (0: no gate).
    `calibrate_ttft`: what the TTFT calibration scales: "wait" (the default), only the prediction's
    wait for the prompts ahead (`Prediction.ttft_wait_s`), learned from queued requests alone, so a
    long prompt's own prefill, which the model predicts well, is not scaled by the error of the
    queue; or "whole", the whole predicted TTFT (the default before it was measured side by side:
    see router.policies.calibration).
    `calibration_prior`, `calibration_prior_weight`, `calibration_min_observations`: the factor before
    evidence, how many pseudo-observations of it are pooled with the ratios, and the fewest ratios
    kept before they count at all (`CalibrationConfig`: prior_factor, prior_weight, min_observations)."""

    weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    local_prefill_max_tokens: int = 0
    refuse_slack: float = 0.0
    min_retry_after_s: float = 1.0
    class_rank: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_CLASS_RANK))
    class_gap_s: float = 2.0
    max_queued_prefill_tokens_per_worker: int = 4096
    calibration_quantile: float = 0.75
    calibrate_ttft: str = "wait"
    calibration_prior: float = CalibrationConfig.prior_factor
    calibration_prior_weight: int = CalibrationConfig.prior_weight
    calibration_min_observations: int = CalibrationConfig.min_observations

    def __post_init__(self) -> None:
        object.__setattr__(self, "weights", MappingProxyType(dict(self.weights)))
        object.__setattr__(self, "class_rank", MappingProxyType(dict(self.class_rank)))
        unknown = sorted(set(self.weights) - set(SCORERS))
        if unknown:
            raise ValueError(f"weights: unknown scorer(s) {unknown}; known: {sorted(SCORERS)}")
        if any(not (math.isfinite(w) and w >= 0) for w in self.weights.values()) or not any(self.weights.values()):
            raise ValueError(f"weights: need finite weights >= 0 with at least one > 0, got {dict(self.weights)}")
        if not self.class_rank or any(r < 0 for r in self.class_rank.values()):
            raise ValueError(f"class_rank: need at least one class and ranks >= 0 (0 goes first), "
                             f"got {dict(self.class_rank)}")
        for name in _INT_KEYS + _FLOAT_KEYS:
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.calibrate_ttft not in CALIBRATE_TTFT:
            raise ValueError(f"calibrate_ttft must be one of {', '.join(CALIBRATE_TTFT)}, got {self.calibrate_ttft!r}")
        if self.calibration_quantile >= 1.0:
            raise ValueError(f"calibration_quantile must be below 1 (0.75: cover 3 in 4 recent requests; 0: off), "
                             f"got {self.calibration_quantile}")
        try:
            self.calibration()   # checked whether on or off: turning the quantile on later must not fail
        except ValueError as error:
            raise ValueError(f"the admission calibration: {_calibration_keys(str(error))}") from None

    def calibration(self) -> CalibrationConfig:
        """The admission calibration this policy asks for (used when `calibration_quantile` > 0; with
        0, the same settings at the default quantile)."""
        return CalibrationConfig(quantile=self.calibration_quantile or CalibrationConfig.quantile,
                                 prior_factor=self.calibration_prior,
                                 prior_weight=self.calibration_prior_weight,
                                 min_observations=self.calibration_min_observations)

    def rank_of(self, slo_class: str) -> int:
        """The rank of `slo_class`; an unknown class ranks as the default class "" (never refused
        here: the edge decides whether to reject unknown classes)."""
        if slo_class in self.class_rank:
            return self.class_rank[slo_class]
        return self.class_rank.get("", max(self.class_rank.values()))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlacementConfig:
        if not isinstance(data, Mapping):
            raise ValueError(f"a placement config is a mapping of keys to values, got {type(data).__name__}")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"unknown key(s) {unknown}; known: {known}")
        for key, value in data.items():
            _check_type(key, value)
        return cls(**data)

    @classmethod
    def from_file(cls, path: str | FilePath) -> PlacementConfig:
        """Reads JSON (.json) or YAML (.yaml/.yml; needs PyYAML); errors are prefixed with the path."""
        path = FilePath(path)
        text = path.read_text()
        try:
            if path.suffix in (".yaml", ".yml"):
                data = _load_yaml(text)
            elif path.suffix == ".json":
                data = json.loads(text)
            else:
                raise ValueError(f"unknown extension {path.suffix!r}: write the config as .json, .yaml or .yml")
            return cls.from_dict(data)
        except ValueError as error:  # json.JSONDecodeError is one
            raise ValueError(f"{path}: {error}") from error


# CalibrationConfig's fields as placement.json names them
_CALIBRATION_KEYS = {"min_observations": "calibration_min_observations", "prior_weight": "calibration_prior_weight",
                     "prior_factor": "calibration_prior"}


def _calibration_keys(message: str) -> str:
    """A CalibrationConfig error in the words of placement.json: its keys, not the fields."""
    for field_name, key in _CALIBRATION_KEYS.items():
        message = message.replace(field_name, key)
    return message


def _load_yaml(text: str) -> Any:
    try:
        import yaml
    except ImportError as error:
        raise ValueError("YAML needs PyYAML (pip install pyyaml); or write the config as .json") from error
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ValueError(f"not valid YAML: {error}") from error


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_int(value) or isinstance(value, float)


def _check_type(key: str, value: Any) -> None:
    if key in _INT_KEYS and not _is_int(value):
        raise ValueError(f"{key}: expected a whole number{' of tokens' if key in _TOKEN_KEYS else ''}, got {value!r}")
    if key in _FLOAT_KEYS and not _is_number(value):
        raise ValueError(f"{key}: expected a number, got {value!r}")
    if key == "calibrate_ttft" and not isinstance(value, str):
        raise ValueError(f"{key}: expected one of {', '.join(CALIBRATE_TTFT)}, got {value!r}")
    if key in ("weights", "class_rank"):
        check, kind = (_is_number, "a number") if key == "weights" else (_is_int, "a whole number")
        if not isinstance(value, Mapping):
            raise ValueError(f"{key}: expected a mapping of name -> {kind}, got {value!r}")
        for name, item in value.items():
            if not isinstance(name, str) or not check(item):
                raise ValueError(f"{key}.{name}: expected {kind}, got {item!r}")
