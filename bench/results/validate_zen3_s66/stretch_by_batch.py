"""The prefill worker's prompt-step stretch by the batch the decode worker was streaming, per shape,
read from a validation's step traces (`planner.validation_steps.prompt_stretch_by_decode_batch`,
which the step report prints from this session on; this run predates it). The traces are not
kept (logs/ is left out of bench/results); the output is, beside this file.

    python bench/results/validate_zen3_s66/stretch_by_batch.py <validation out-dir, with its logs/> <its profile>
"""
import json
import sys
from pathlib import Path

from pdserve.engine_step_trace import engine_steps
from planner.perf_model import fit_perf_model
from planner.profile import load_profile
from planner.validation_steps import prompt_stretch_by_decode_batch

root, model = Path(sys.argv[1]), fit_perf_model(load_profile(sys.argv[2])).model
for shape_dir in sorted((root / "1P+1D").iterdir()):
    trace = shape_dir / "logs" / "steps"
    prefill, decode = engine_steps(trace, "prefill-0"), engine_steps(trace, "decode-1")
    rows = prompt_stretch_by_decode_batch(prefill, decode, float("-inf"), float("inf"), model.prefill_step_s)
    print(f"{shape_dir.name}: " + ", ".join(f"{label}: {row['median_stretch']:.2f} ({row['steps']})"
                                          for label, row in rows.items()))
    print("  " + json.dumps(rows))
