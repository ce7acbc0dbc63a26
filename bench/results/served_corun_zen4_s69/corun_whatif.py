# One-off what-if (run from the repo root): every kept validation resimulated with its profile as kept and with
# corun_decode_stretch raised to at least argv[1]; the mean signed errors by shape. Output: corun_whatif_1.17.txt.
import sys, json, numpy as np, collections
from dataclasses import replace
sys.path.insert(0, "bench")
from resimulate_kept import KEPT, RESULTS
from planner.validation_runs import load_earlier, _with_router, _comparison
from planner.validation import verdict
from planner.simulator import SimSettings, simulate
from planner.profile import load_profile
from planner.perf_model import fit_perf_model
STRETCH = float(sys.argv[1])
agg = collections.defaultdict(lambda: collections.defaultdict(list))
for kept in KEPT:
    files = sorted((RESULTS / kept.directory).glob("*/*/validation.json"))
    prof0 = load_profile(RESULTS / kept.profile)
    variants = {"base": prof0, "corun": replace(prof0, serving=replace(prof0.serving, corun_decode_stretch=max(STRETCH, prof0.serving.corun_decode_stretch)))}
    line = [f"{kept.name:22s} base corun {prof0.serving.corun_decode_stretch:.3f}"]
    for f in files:
        setup, runs = load_earlier(f, kept.transport)
        shape = setup.workload.get("shape")
        for name, prof in variants.items():
            settings = _with_router(SimSettings.from_profile(prof, kept.transport), setup.router)
            model = fit_perf_model(prof).model
            comps = [replace(_comparison(run, name, simulate(run.requests, setup.topology, settings, model), setup.slo, {}), model=name) for run in runs]
            v = verdict(comps, shape, setup.topology.label, name)
            g = v.goodput_error
            for k, e in v.bias_to_knee.items():
                agg[name][(shape, k)].append(e)
                agg[name][("all", k)].append(e)
                agg[name][("all", "|" + k + "|")].append(abs(v.errors_to_knee[k]))
            if g is not None:
                agg[name][(shape, "goodput")].append(g); agg[name][("all", "goodput")].append(g); agg[name][("all", "|goodput|")].append(abs(g))
            line.append(f"{shape}:{name}:{'' if g is None else f'{g*100:+.0f}%'}")
    print("  ".join(line), flush=True)
keys = sorted(agg["base"])
for k in keys:
    b, c = agg["base"][k], agg["corun"][k]
    print(f"{str(k):45s} base {np.mean(b)*100:+6.1f}%  corun {np.mean(c)*100:+6.1f}%  n={len(b)}")
