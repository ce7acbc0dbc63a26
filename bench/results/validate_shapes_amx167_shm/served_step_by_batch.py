"""A profile's kept batched runs: served step, its host stretch, engine step, residual, and the fitted line's charge."""
import sys
from planner.profile import load_profile
from planner.profiler.stream_fit import StreamCpu, kept_batch_runs, engine_step_s
from planner.perf_model import fit_perf_model

p = load_profile(sys.argv[1])
model = fit_perf_model(p).model
c = p.serving
stream = StreamCpu.of(c)
print(f"fitted: {c.decode_step_s*1e3:.3f} ms + {c.decode_cpu_s_per_token*1e6:.0f} us x batch")
for run in kept_batch_runs(c):
    stretch = stream.decode_stretch(run.tokens_per_s, run.batch, c.host_cores, 1.0)
    eng = engine_step_s(run.batch, run.context_tokens, model, p.decode)
    res = run.step_s / stretch - eng
    charge = (eng + c.decode_step_s + run.batch * c.decode_cpu_s_per_token) * stretch
    print(f"b{run.batch:3d} ctx {run.context_tokens:6.0f} served {run.step_s*1e3:6.2f} stretch {stretch:.3f} engine {eng*1e3:5.2f}"
          f" residual {res*1e3:5.2f} ({res/run.batch*1e6:5.0f} us/seq) charge {charge*1e3:6.2f} err {charge/run.step_s-1:+.0%}")
