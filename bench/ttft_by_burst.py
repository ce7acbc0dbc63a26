"""Where in a burst the simulator misses a validation's TTFT: each request's measured TTFT against
its simulated one, grouped by how many requests arrived in the `--within-ms` before it.

Reads a validation.json of bench/validate_planner.py (its requests as sent and the measured phases
per request), simulates the very requests with a profile as the validation does, and prints per
rate and group: the requests, the median measured and simulated TTFT, the median difference. A
miss that grows with the group is a cost the burst brings that the simulator does not charge
where it lands (BENCHMARKS, "How long a burst's CPU loads the router's core"). Takes seconds.

    .venv/bin/python bench/ttft_by_burst.py \\
        bench/results/validate_shapes_zen4_shm/later/tiny/1P+1D/bursty/validation.json \\
        --profile bench/results/validate_shapes_zen4_shm/later/tiny_2cpu_epyc_avx512_corun_served.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def arrivals_before(arrival_s: np.ndarray, within_s: float) -> np.ndarray:
    """For each request, how many others arrived in the `within_s` before it (ties count as before
    for the later index: requests sent at the same instant are one burst in send order)."""
    order = np.argsort(arrival_s, kind="stable")
    sorted_s = arrival_s[order]
    counts = np.empty(len(arrival_s), dtype=int)
    counts[order] = np.maximum(0, np.arange(len(sorted_s)) - np.searchsorted(sorted_s, sorted_s - within_s, side="right"))
    return counts


def by_group(groups: np.ndarray, measured_s: np.ndarray, simulated_s: np.ndarray) -> list[dict]:
    """Per group (ascending): requests, median measured, median simulated, median difference, in
    seconds; NaN entries (a request with no TTFT on either side) are left out."""
    rows = []
    for group in sorted(set(groups.tolist())):
        keep = (groups == group) & ~np.isnan(measured_s) & ~np.isnan(simulated_s)
        if keep.any():
            rows.append({"group": group, "requests": int(keep.sum()), "measured_s": float(np.median(measured_s[keep])),
                         "simulated_s": float(np.median(simulated_s[keep])),
                         "difference_s": float(np.median(measured_s[keep] - simulated_s[keep]))})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("validation", type=Path, help="a validation.json of bench/validate_planner.py (one shape)")
    p.add_argument("--profile", type=Path, required=True, help="the profile to simulate the requests with")
    p.add_argument("--within-ms", type=float, default=100.0, help="the burst window before a request (default 100)")
    p.add_argument("--host-window-s", type=float, default=0.5,
                   help="the simulator's host window (a what-if; default %(default)s, the simulator's own)")
    args = p.parse_args(argv)

    from planner.perf_model import fit_perf_model
    from planner.profile import load_profile
    from planner.simulator import SimSettings, simulate
    from planner.validation_phases import simulated_phases
    from planner.validation_runs import _with_router, load_earlier

    setup, runs = load_earlier(args.validation, "shm")
    profile = load_profile(args.profile)
    settings = _with_router(SimSettings.from_profile(profile, setup.transport, host_window_s=args.host_window_s),
                            setup.router)
    model = fit_perf_model(profile).model
    for run in runs:
        if run.phases is None:
            print(f"rate {run.rate_rps}: no measured phases kept")
            continue
        result = simulate(run.requests, setup.topology, settings, model)
        sim = simulated_phases(result.timeline, result.output_tokens, result.delivery_s)
        measured = np.array(run.phases["queue"], dtype=float) + np.array(run.phases["prefill"], dtype=float)
        simulated = np.asarray(sim["queue"], dtype=float) + np.asarray(sim["prefill"], dtype=float)
        groups = arrivals_before(np.array([r.arrival_s for r in run.requests]), args.within_ms / 1e3)
        print(f"rate {run.rate_rps} req/s, {len(run.requests)} requests: TTFT measured / simulated, by arrivals "
              f"in the {args.within_ms:g} ms before")
        for row in by_group(groups, measured, simulated):
            print(f"  {row['group']:3d} before: {row['requests']:3d} requests, {row['measured_s'] * 1e3:6.1f} / "
                  f"{row['simulated_s'] * 1e3:6.1f} ms, difference {row['difference_s'] * 1e3:+6.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
