"""Fit a profile's served decode step again from the batched runs it kept, as `pdserve profile`
fits it now, without measuring again.

    python bench/refit_served_step.py --profile planner/profiles/tiny_2cpu_served.json \\
        --out out/tiny_2cpu_served_table.json

A profile taken through a cluster keeps the batched runs its served step was fitted on
(`serving.served_batch_runs`, since 9571884). This writes a copy of it whose serving costs (and
vLLM's server's, where the profile has them) hold the served step's extra over the engine's at
each batch measured (`serving.served_step_extra_s`, which the simulator interpolates instead of
the fitted line; `planner.profiler.served_refit.with_served_table`), and prints what each form
charges for the runs against the step measured. A profile that kept no runs is refused: it has
nothing to refit. Resimulate a validation with both to compare them:

    python bench/validate_planner.py --resimulate DIR --profile OLD --profile NEW --transport shm --out-dir OUT

Seconds; nothing is run but the fit.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from planner.perf_model import fit_perf_model
from planner.profile import load_profile, save_profile
from planner.profiler.served_refit import with_served_table
from planner.profiler.summary import served_step_line


def refit(path: Path, out: Path) -> list[str]:
    """Writes `path`'s profile with its served steps refitted to `out`; returns what was said about each."""
    profile = load_profile(path)
    if not profile.serving.served_batch_runs:
        raise SystemExit(f"{path}: the profile kept no batched runs (serving.served_batch_runs); "
                         "take it again with `pdserve profile --through cluster`")
    fit = fit_perf_model(profile)
    serving = with_served_table(profile.serving, fit.model, profile.decode)
    said = [f"cluster: {served_step_line(serving, fit.model, profile.decode)}"]
    server = profile.vllm_server
    if server is not None and server.served_batch_runs and profile.wide:
        wide = profile.wide[0]   # the engine `pdserve profile --vllm-server` measured the server around
        wide_model = dict(fit.model.wide)[wide.devices]
        cores = server.host_cores or wide.devices
        server = with_served_table(server, wide_model, wide.decode, cores)
        said.append(f"vLLM's server: {served_step_line(server, wide_model, wide.decode, cores)}")
    save_profile(replace(profile, serving=serving, vllm_server=server), out)
    return said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=Path, required=True, help="the profile to refit (it is not changed)")
    parser.add_argument("--out", type=Path, required=True, help="where to write the refitted profile")
    args = parser.parse_args(argv)
    for line in refit(args.profile, args.out):
        print(line)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
