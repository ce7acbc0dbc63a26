"""(run from the repo root: python bench/results/served_corun_zen4_s69/calibrate_on_light_load.py short-long both)
Offline what-if: calibrate decode/prompt step scales on one light-load run, apply to the rest."""
import sys, json, numpy as np, collections
from pathlib import Path
from dataclasses import replace
sys.path.insert(0, "bench")
from resimulate_kept import KEPT, RESULTS
from planner.validation_runs import load_earlier, _with_router
from planner.validation import verdict, Comparison
from planner.validation_runs import _comparison
from planner.simulator import SimSettings, simulate
from planner.profile import load_profile
from planner.perf_model import fit_perf_model

CAL_SHAPE = sys.argv[1] if len(sys.argv) > 1 else "short-long"
MODE = sys.argv[2] if len(sys.argv) > 2 else "both"

def sim_summary(run, topology, settings, model, slo):
    res = simulate(run.requests, topology, settings, model)
    return _comparison(run, "x", res, slo, {})

def calibrate(run, topology, settings, model, slo):
    kd = kp = 1.0
    for _ in range(3):
        c = sim_summary(run, topology, settings, model.decodes_slower(kd).prompts_slower(kp), slo)
        if MODE in ("both", "decode"):
            kd *= c.measured["median_tpot_ms"] / c.simulated["median_tpot_ms"]
        if MODE in ("both", "prompt"):
            kp *= c.measured["median_ttft_ms"] / c.simulated["median_ttft_ms"]
    return kd, kp

agg = collections.defaultdict(lambda: collections.defaultdict(list))
for kept in KEPT:
    root = RESULTS / kept.directory
    files = sorted(root.glob("*/*/validation.json"))
    if not files: continue
    prof = load_profile(RESULTS / kept.profile)
    model0 = fit_perf_model(prof).model
    loaded = [load_earlier(f, kept.transport) for f in files]
    cal = [(s, r) for s, r in loaded if s.workload.get("shape") == CAL_SHAPE]
    if not cal: continue
    s0, r0 = cal[0]
    low = min(r0, key=lambda r: r.rate_rps)
    settings0 = _with_router(SimSettings.from_profile(prof, kept.transport), s0.router)
    kd, kp = calibrate(low, s0.topology, settings0, model0, s0.slo)
    line = [f"{kept.name:22s} kd={kd:.2f} kp={kp:.2f}"]
    for setup, runs in loaded:
        shape = setup.workload.get("shape")
        settings = _with_router(SimSettings.from_profile(prof, kept.transport), setup.router)
        for name, model in (("base", model0), ("cal", model0.decodes_slower(kd).prompts_slower(kp))):
            comps = [replace(_comparison(run, name, simulate(run.requests, setup.topology, settings, model), setup.slo, {}), model=name) for run in runs]
            v = verdict(comps, shape, setup.topology.label, name)
            held_out = not (shape == CAL_SHAPE)
            g = v.goodput_error
            for k, e in v.bias_to_knee.items():
                agg[name][("held" if held_out else "cal") + ":" + k].append(e)
                agg[name][("held" if held_out else "cal") + ":|" + k + "|"].append(abs(v.errors_to_knee[k]))
            if g is not None:
                agg[name][("held" if held_out else "cal") + ":goodput"].append(g)
                agg[name][("held" if held_out else "cal") + ":|goodput|"].append(abs(g))
            line.append(f"{shape}:{name}:{'' if g is None else f'{g*100:+.0f}%'}")
    print("  ".join(line), flush=True)
for name, d in agg.items():
    print(name)
    for k, v in sorted(d.items()):
        print(f"   {k:28s} {np.mean(v)*100:+6.1f}%  n={len(v)}")
