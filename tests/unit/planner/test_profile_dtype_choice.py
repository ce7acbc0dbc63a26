"""A profile records how its engine's dtype was chosen: the probe's decision, or that it was given."""

from pdserve import dtype_probe
from pdserve.dtype_choice import DtypeDecision
from planner.profiler.host import dtype_choice

DECISION = DtypeDecision("bfloat16", "fastest on this host", "kind", "h8-i16-a2-kv2-d4", 1,
                         {"bfloat16": {"gemm": 1.0}, "float32": {"gemm": 4.0}})


def test_the_probes_decision_is_recorded_with_its_timings(monkeypatch):
    monkeypatch.setattr(dtype_probe, "cached_decision", lambda model, cores: DECISION)
    assert dtype_choice("models/x", "1", "bfloat16") == DECISION.summary()
    assert "float32 4.0 ms" in DECISION.summary()


def test_a_dtype_given_against_the_probe_says_so(monkeypatch):
    monkeypatch.setattr(dtype_probe, "cached_decision", lambda model, cores: DECISION)
    assert dtype_choice("models/x", "1", "float32") == "float32: given explicitly (the probe chose bfloat16)"


def test_no_probe_on_this_host_kind_is_said_too(monkeypatch):
    monkeypatch.setattr(dtype_probe, "cached_decision", lambda model, cores: None)
    assert dtype_choice("models/x", "1", "float32") == "float32: not probed on this host kind"
