"""By hand, for a validation run before `interp_start_s` was kept: each rate's start recovered from
the prefill worker's joins (its requests' `accepted_s` against their send offsets), then the decode
worker's steps against its core's interpreter series (planner.validation_speed). Kept as run:

    .venv/bin/python bench/results/validate_zen5_s65/elasticity_by_hand.py \
        bench/results/validate_zen5_s65/tiny_zen5.json /tmp/s65/val/run1 /tmp/s65/val/run2

(the runs' logs/steps traces are not kept in the repository)."""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from pdserve.engine_step_trace import engine_joins, engine_steps
from planner.profile import load_profile
from planner.validation_speed import InterpreterSeries, worker_elasticity
from planner.validation_step_report import model_and_served

profile = load_profile(sys.argv[1])
model, _ = model_and_served(profile)
for root in sys.argv[2:]:
    for vj in sorted(Path(root).glob("*/*/validation.json")):
        data = json.loads(vj.read_text())
        steps_dir = vj.parent / "logs" / "steps"
        accepted = np.sort([j.accepted_s for j in engine_joins(steps_dir, "prefill-0") if j.accepted_s == j.accepted_s])
        decode = engine_steps(steps_dir, "decode-1")
        for rate, rows in data["requests"].items():
            machine = data["machine"].get(rate, {})
            loads = data.get("core_loads", {}).get(rate) or []
            if "interp_series_ms" not in machine or not loads:
                continue
            sent = np.array([r[0] for r in rows])   # arrival_s as sent, from the run's start
            best = (0, None)
            for j in range(len(accepted)):
                offset = accepted[j] - sent[0]
                lo = np.searchsorted(accepted, offset + sent - 0.001)
                hits = np.sum((lo < len(accepted)) & (accepted[np.minimum(lo, len(accepted) - 1)] <= offset + sent + 0.05))
                if hits > best[0]:
                    best = (hits, offset)
            hits, start = best
            series = InterpreterSeries({int(c): v for c, v in machine["interp_series_ms"].items()}, start, 1.0,
                                       {row["worker"]: tuple(row["cores"]) for row in loads})
            e = worker_elasticity(decode, model.decode_step_s, series, "decode-1")
            what = "none" if e is None else (f"elasticity {e.slope:.2f} corr {e.correlation:.2f} windows {e.windows}; "
                                              f"loop slow/fast {e.interp_slow_over_fast:.2f} step {e.step_slow_over_fast:.2f}")
            print(f"{vj.parent.parent.parent.name} {vj.parent.name} {rate}: start matched {hits}/{len(sent)}; {what}", flush=True)
