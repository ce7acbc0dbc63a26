"""Trace replay on the real Azure conversation trace (`<repo>/../shared/data/traces/`)."""

from pathlib import Path

import pytest

from loadgen.workload import azure_trace, default_shared_dir

REPO = Path(__file__).resolve().parents[3]
TRACE = REPO.parent / "shared" / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
pytestmark = pytest.mark.skipif(not TRACE.is_file(), reason="the shared Azure trace is not present")


def test_default_path_is_the_shared_dir_next_to_the_repo():
    assert default_shared_dir() == REPO.parent / "shared"


def test_first_rows_parse_to_exact_arrivals_and_lengths():
    specs = azure_trace(limit=4)
    # 18:15:46.6805900, 18:15:50.9951690, 18:15:51.2224670, 18:15:51.3910170
    assert [round(s.arrival_s, 6) for s in specs] == [0.0, 4.314579, 4.541877, 4.710427]
    assert [(s.prompt_tokens, s.output_tokens) for s in specs] == [(374, 44), (396, 109), (879, 55), (91, 16)]


def test_time_scale_and_caps_apply():
    specs = azure_trace(TRACE, time_scale=0.5, max_prompt_tokens=300, max_output_tokens=50, limit=4)
    assert round(specs[1].arrival_s, 7) == 2.1572895
    assert [(s.prompt_tokens, s.output_tokens) for s in specs] == [(300, 44), (300, 50), (300, 50), (91, 16)]


def test_whole_trace_is_sorted_and_complete():
    specs = azure_trace()
    assert len(specs) == 19_366
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(specs, specs[1:]))


def test_missing_trace_names_the_path():
    with pytest.raises(FileNotFoundError, match="nowhere.csv"):
        azure_trace("nowhere.csv")
