"""The prefill worker's prompt steps by the batch the decode worker was streaming, per shape, read
from a validation's kept step traces (gzipped beside each shape's validation.json): each bucket's
median stretch over the profile's engine step and, where the steps' lengths span 2x, its line
(lost ms + slope x the step; `planner.validation_steps.prompt_stretch_by_decode_batch`), then the
rows over idle the profile's probe keeps (`planner.profiler.prompt_loss_fit.loss_over_idle`).

    python bench/results/validate_zen4_s67/stretch_by_batch.py bench/results/validate_zen4_s67/first \
        bench/results/validate_zen4_s67/tiny_zen4.json
"""
import gzip
import shutil
import sys
import tempfile
from pathlib import Path

from pdserve.engine_step_trace import engine_steps
from planner.perf_model import fit_perf_model
from planner.profile import load_profile
from planner.profiler.prompt_loss_fit import loss_over_idle
from planner.validation_steps import prompt_stretch_by_decode_batch

root, model = Path(sys.argv[1]), fit_perf_model(load_profile(sys.argv[2])).model
for shape_dir in sorted((root / "1P+1D").iterdir()):
    with tempfile.TemporaryDirectory() as trace:
        for packed in (shape_dir / "steps").glob("*.csv.gz"):
            with gzip.open(packed) as source, open(Path(trace) / packed.stem, "wb") as target:
                shutil.copyfileobj(source, target)
        prefill, decode = engine_steps(Path(trace), "prefill-0"), engine_steps(Path(trace), "decode-1")
    rows = prompt_stretch_by_decode_batch(prefill, decode, float("-inf"), float("inf"), model.prefill_step_s)
    print(f"{shape_dir.name}: " + ", ".join(
        f"{label}: {row['median_stretch']:.2f} ({row['steps']}"
        + (f"; {row['lost_ms']:+.1f} ms + {row['slope']:.2f}x" if "lost_ms" in row else "") + ")"
        for label, row in rows.items()))
    print("   over idle (batch, stretch, lost s):", loss_over_idle(rows))
