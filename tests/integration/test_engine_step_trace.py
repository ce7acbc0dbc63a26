"""The engine step trace (pdserve.engine_step_trace) on a real vLLM engine: every step the engine
ran, with the tokens it computed, lined up in time; and its pure parts with plain values."""

from __future__ import annotations

from types import SimpleNamespace

import cluster_helpers
import pytest
from openai_reference import reference_engine

from pdserve.engine_step_trace import (JOIN_COLUMNS, STEP_COLUMNS, STEP_TRACE_ENV, StepShape, engine_joins, engine_steps,
                                       read_steps, trace_files)


def test_a_traced_engine_writes_each_step_it_ran_with_the_tokens_it_computed(tiny_model, tmp_path, monkeypatch):
    trace_dir = tmp_path / "trace"
    monkeypatch.setenv(STEP_TRACE_ENV, str(trace_dir))
    with reference_engine(cluster_helpers.engine_settings(tiny_model), tmp_path) as engine:
        first = engine.answer(list(range(100, 140)), max_tokens=6, ignore_eos=True, temperature=0)
        second = engine.answer(list(range(200, 270)), max_tokens=4, ignore_eos=True, temperature=0)
    assert len(first["token_ids"]) == 6 and len(second["token_ids"]) == 4
    files = trace_files(trace_dir, "engine")   # no connector: the engine has no id of its own
    assert len(files) == 1, list(trace_dir.iterdir())
    steps = read_steps(files[0])
    # one at a time: each prompt in a step of its own (its first token), then a step per later token
    assert [(s.joined, s.continuing, s.tokens, s.decoding) for s in steps] == \
        [(1, 0, 40, 0)] + [(0, 1, 1, 1)] * 5 + [(1, 0, 70, 0)] + [(0, 1, 1, 1)] * 3
    assert [s.context_tokens for s in steps[:3]] == [40, 41, 42]   # what attention read, the step's own included
    assert all(s.duration_s > 0 for s in steps)
    assert all(later.start_s >= earlier.end_s for earlier, later in zip(steps, steps[1:]))


def test_a_steps_shape_counts_joins_decodes_and_the_context_read():
    output = SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(num_computed_tokens=96)],     # a pulled prompt's last token
        scheduled_cached_reqs=SimpleNamespace(req_ids=["a", "b"], num_computed_tokens=[130, 40]),
        num_scheduled_tokens={"new": 1, "a": 1, "b": 32}, total_num_scheduled_tokens=34)
    assert StepShape.of(output) == StepShape(joined=1, continuing=2, tokens=34, decoding=2,
                                             context_tokens=96 + 130 + 40 + 34)


def test_reading_a_trace_skips_a_line_cut_short_and_refuses_another_file(tmp_path):
    good = tmp_path / "steps-w-1.csv"
    good.write_text(",".join(STEP_COLUMNS) + "\n1.0,1.01,1,0,40,0,40\n1.02,1.03,0,1,1,1,41\n1.04,1.0")
    steps = read_steps(good)
    assert [s.batch for s in steps] == [1, 1] and steps[0].duration_s == pytest.approx(0.01)
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a step trace"):
        read_steps(other)
    empty = tmp_path / "steps-w-2.csv"
    empty.write_text("")   # a process that stopped before its header was flushed
    assert read_steps(empty) == []


def test_an_engines_trace_files_are_its_own_and_not_another_whose_id_starts_alike(tmp_path):
    for name in ("steps-decode-1-41.csv", "steps-decode-1-42.csv", "steps-decode-10-43.csv", "steps-decode-1-x.csv"):
        (tmp_path / name).write_text(",".join(STEP_COLUMNS) + "\n")
    assert [path.name for path in trace_files(tmp_path, "decode-1")] == ["steps-decode-1-41.csv", "steps-decode-1-42.csv"]
    assert [path.name for path in trace_files(tmp_path, "decode-10")] == ["steps-decode-10-43.csv"]


def test_an_engines_steps_are_read_over_its_processes_in_start_order_and_its_joins_file_by_file(tmp_path):
    (tmp_path / "steps-decode-1-41.csv").write_text(",".join(STEP_COLUMNS) + "\n2.0,2.01,0,1,1,1,41\n")
    (tmp_path / "steps-decode-1-42.csv").write_text(",".join(STEP_COLUMNS) + "\n1.0,1.01,1,0,40,0,40\n3.0,3.01,0,1,1,1,42\n")
    (tmp_path / "steps-decode-10-43.csv").write_text(",".join(STEP_COLUMNS) + "\n0.5,0.51,1,0,9,0,9\n")
    assert [s.start_s for s in engine_steps(tmp_path, "decode-1")] == [1.0, 2.0, 3.0]
    (tmp_path / "joins-decode-1-41.csv").write_text(",".join(JOIN_COLUMNS) + "\nb,40,1.0,1.1,1.2,1.3,1.4\n")
    (tmp_path / "joins-decode-1-42.csv").write_text(",".join(JOIN_COLUMNS) + "\na,9,0.1,0.2,nan,0.3,0.4\n")
    assert [j.request_id for j in engine_joins(tmp_path, "decode-1")] == ["b", "a"]
    assert engine_steps(tmp_path, "prefill-0") == [] and engine_joins(tmp_path, "prefill-0") == []
