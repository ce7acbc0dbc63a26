"""`--dtype auto` measures once per host kind, then reuses the decision; `pdserve` prints it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pdserve import dtype_probe
from pdserve.dtype_choice import CANDIDATES

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def probed(tiny_model, tmp_path_factory):
    """A cache directory and the decision its one probe wrote there (the probe takes ~10 s: once)."""
    cache = tmp_path_factory.mktemp("dtype-cache")
    return cache, dtype_probe.resolve_auto_dtype(str(tiny_model), "0", cache)


def no_second_probe(*args):
    raise AssertionError("probed again although the decision was cached")


def test_the_probe_measures_every_candidate_once_then_the_cache_answers(tiny_model, probed, monkeypatch):
    cache, first = probed
    assert first.dtype in CANDIDATES and first.threads == 1
    assert set(first.timings_ms) == set(CANDIDATES)
    assert all(ms > 0 for ops in first.timings_ms.values() for ms in ops.values())
    assert len(list(cache.glob("dtype-*.json"))) == 1
    monkeypatch.setattr(dtype_probe, "_probe_in_child", no_second_probe)
    assert dtype_probe.resolve_auto_dtype(str(tiny_model), "0", cache) == first


def test_the_cli_resolves_auto_to_the_cached_decision_and_prints_it(tiny_model, probed, monkeypatch):
    cache, decision = probed
    monkeypatch.setattr(dtype_probe, "_probe_in_child", no_second_probe)   # answered from the cache
    assert dtype_probe.resolve_auto_dtype(str(tiny_model), "0", cache) == decision
    code = ("import argparse, sys; from cli.commands.engine_options import add_engine_options, engine_settings;"
            "p = argparse.ArgumentParser(); add_engine_options(p);"
            f"a = p.parse_args(['--model', {str(tiny_model)!r}, '--cache-dir', {str(cache)!r}]);"
            "print(engine_settings(a, '0').dtype)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == decision.dtype
    assert f"pdserve: dtype {decision.dtype}: {decision.reason}" in run.stderr
