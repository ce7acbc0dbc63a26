"""Workload configuration as the CLI and the sweep build it."""

from pathlib import Path

import pytest

from loadgen.harness import WorkloadConfig, requests_for_duration
from loadgen.workload import azure_trace

TRACE = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"


@pytest.mark.skipif(not TRACE.is_file(), reason="the shared Azure trace is not present")
def test_trace_at_a_rate_keeps_its_lengths_and_spans_n_over_rate():
    config = WorkloadConfig(kind="trace", arrival="trace", rate_rps=None, num_requests=50, max_prompt_tokens=1024)
    original = config.build()
    at_2rps = config.build(rate_rps=2.0)
    assert [(s.prompt_tokens, s.output_tokens) for s in at_2rps] == [(s.prompt_tokens, s.output_tokens) for s in original]
    assert at_2rps[-1].arrival_s == pytest.approx(25.0)
    assert original == azure_trace(TRACE, max_prompt_tokens=1024, limit=50)


@pytest.mark.skipif(not TRACE.is_file(), reason="the shared Azure trace is not present")
def test_trace_lengths_on_poisson_arrivals():
    specs = WorkloadConfig(kind="trace", arrival="poisson", rate_rps=4.0, num_requests=20).build()
    assert [s.prompt_tokens for s in specs][:4] == [374, 396, 879, 91]
    assert specs != azure_trace(TRACE, limit=20)


def test_random_and_shared_prefix_workloads_follow_their_config():
    random = WorkloadConfig(rate_rps=5.0, num_requests=30, prompt_mean=100, output_mean=10).build()
    assert len(random) == 30 and {(s.prompt_tokens, s.output_tokens) for s in random} == {(100, 10)}
    shared = WorkloadConfig(kind="shared-prefix", arrival="constant", rate_rps=10.0, num_requests=8,
                            prompt_mean=20, output_mean=4, num_groups=2, prefix_tokens=64).build(num_requests=12)
    assert len(shared) == 12 and {s.prompt_tokens for s in shared} == {84}
    assert [s.arrival_s for s in shared][:3] == [0.1, 0.2, 0.3]  # constant: one gap, then every 0.1 s


def test_config_mistakes_are_explained():
    with pytest.raises(ValueError, match="use it with kind 'trace'"):
        WorkloadConfig(arrival="trace")
    with pytest.raises(ValueError, match="need a rate"):
        WorkloadConfig(rate_rps=None)


def test_duration_runs_get_enough_requests():
    assert requests_for_duration(2.0, 50.0) == 170  # 100 expected + 6*10 + 10
