"""The Decode call's way in against the decode engine's batch and the prefill engine's steps: per
pulled request, the time from its prefill engine's step to the decode worker's front end taking the
call, grouped by the batch the decode engine was running as that prefill step ended, beside what
the simulator charges for it (the profile's `handoff_s`, and with `--hops queued` the waits behind
that batch's outputs in the router and the decode worker's API process: `planner.simulator.host`);
grouped by the share of it the prefill engine spent stepping (the prefill worker's API process
and the router, which the call goes through, share that engine's core); and its median, mean and
p90 beside what each of the simulator's hop models (`--hops`) charges the same requests, given the
decode batch and the prefill engine's steps each met (a run of one prefill worker: with more,
their steps would be read as one engine's).

    .venv/bin/python bench/way_in_by_batch.py --run DIR [--run DIR ...] --profile PROFILE.json [--out table.md]

Each DIR is a `bench/validate_planner.py --step-trace` output directory of one shape and topology
(its engines' traces under logs/steps/, which a run keeps on the machine that ran it); prompts
the prefill engine cut into chunks are left out (their prefill join is their first chunk's:
`planner.validation_joins.one_step_prompts`).
Prints one
markdown table per run (milliseconds; medians over the requests in each batch group, the mean
beside them) and writes them to --out when given.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from pdserve.engine_step_trace import read_joins, read_steps
from planner.profile import load_profile
from planner.serving_costs import ServingCosts
from planner.simulator.core_share import HOP_SHARE_WHILE_STEPPING
from planner.simulator.host import decode_call_wait_s, router_outputs_wait_s
from planner.validation_joins import (in_start_order, matched_ways_in, one_step_prompts, served_by_s,
                                      way_in_by_batch, way_in_by_prefill_share)

BATCH_EDGES = (0, 1, 4, 8, 16, 32, 48, 64, 96, 129, 257)
SHARE_GROUPS = ((0.0, 0.01, "none"), (0.01, 0.5, "under half"), (0.5, 0.99, "half or more"), (0.99, 1.01, "all"))


def trace(run: Path, kind: str, role: str) -> list:
    read = read_steps if kind == "steps" else read_joins
    return [item for path in sorted((run / "logs" / "steps").glob(f"{kind}-{role}-*.csv")) for item in read(path)]


def charged_ms(serving: ServingCosts, batch: float) -> tuple[float, float]:
    """(stretched unloaded, queued) way in the simulator charges at `batch`, ms: the profile's hop, and
    that plus the waits behind the batch's outputs (a stepping engine)."""
    queued = serving.handoff_s + router_outputs_wait_s(round(batch), serving.router_cpu_s_per_token) \
        + decode_call_wait_s(round(batch), serving.decode_cpu_s_per_token, engine_stepping=batch > 0)
    return serving.handoff_s * 1e3, queued * 1e3


def modelled_ways_in_s(firsts_s: np.ndarray, batches: np.ndarray, prefill_steps: list,
                       serving: ServingCosts) -> dict[str, np.ndarray]:
    """Each request's way in as each of the simulator's hop models (`SimSettings.hops`) would charge
    it, given when its prompt finished (`firsts_s`), the decode batch then and the prefill engine's
    traced steps, seconds: "stretched" unloaded (the profile's hop; the router's load that stretches
    it is not in a trace), "queued" (plus the waits
    behind the batch's outputs), "prefill-core" (the hop beside the prefill engine's steps, at
    `HOP_SHARE_WHILE_STEPPING` of its core while one runs, then those waits)."""
    ordered, starts = in_start_order(prefill_steps)
    waits = np.array([router_outputs_wait_s(int(b), serving.router_cpu_s_per_token)
                      + decode_call_wait_s(int(b), serving.decode_cpu_s_per_token, engine_stepping=b > 0) for b in batches])
    beside = np.array([served_by_s(ordered, starts, first_s, serving.handoff_s, HOP_SHARE_WHILE_STEPPING) - first_s
                       for first_s in firsts_s])
    return {"stretched": np.full(len(firsts_s), serving.handoff_s), "queued": serving.handoff_s + waits,
            "prefill-core": beside + waits}


def prompts_in_one_step(run: Path) -> list:
    """The prefill workers' joins of prompts not cut into chunks (`one_step_prompts`), per worker."""
    paths = sorted((run / "logs" / "steps").glob("joins-prefill-*.csv"))
    return [join for path in paths
            for join in one_step_prompts(read_joins(path), read_steps(path.with_name(path.name.replace("joins-", "steps-", 1))))]


def table(run: Path, serving: ServingCosts, token_budget: int) -> str:
    prefill_joins = prompts_in_one_step(run)
    batches, ways = way_in_by_batch(prefill_joins, trace(run, "joins", "decode"),
                                    trace(run, "steps", "decode"), token_budget)
    if not len(ways):
        return (f"{run.parent.name} {run.name}: no pulled request of at most {token_budget} prompt tokens in both "
                "workers' join traces (validate_planner --step-trace writes them under logs/steps/)\n")
    lines = [f"{run.parent.name} {run.name}: {len(ways)} pulled requests", "",
             "| batch | requests | way in median | mean | handoff_s | queued at the median batch |",
             "|---|---|---|---|---|---|"]
    centers, medians, counts = [], [], []
    for lo, hi in zip(BATCH_EDGES, BATCH_EDGES[1:]):
        chosen = (batches >= lo) & (batches < hi)
        if not chosen.any():
            continue
        centers.append(float(np.median(batches[chosen])))
        medians.append(float(np.median(ways[chosen])))
        counts.append(int(chosen.sum()))
        plain, queued = charged_ms(serving, centers[-1])
        lines.append(f"| {lo}-{hi - 1} | {counts[-1]} | {medians[-1] * 1e3:.1f} | "
                     f"{ways[chosen].mean() * 1e3:.1f} | {plain:.1f} | {queued:.1f} |")
    if len(centers) > 1:   # through the groups' medians, each weighted by its requests: a chunked
        slope, intercept = np.polyfit(centers, medians, 1, w=np.sqrt(counts))   # prompt's outlier moves none
        lines += ["", f"through the groups' medians: way in = {intercept * 1e3:.2f} ms + {slope * 1e3:.3f} ms x batch; "
                  f"the queued model's slope {(2 * serving.decode_cpu_s_per_token + serving.router_cpu_s_per_token) * 1e3:.3f} ms"]
    shares, by_share = way_in_by_prefill_share(prefill_joins, trace(run, "joins", "decode"),
                                               trace(run, "steps", "prefill"), token_budget)
    lines += ["", "| the prefill engine stepped through | requests | way in median | mean |", "|---|---|---|---|"]
    for lo, hi, name in SHARE_GROUPS:
        chosen = (shares >= lo) & (shares < hi)
        if chosen.any():
            lines.append(f"| {name} of it | {int(chosen.sum())} | {np.median(by_share[chosen]) * 1e3:.1f} | "
                         f"{by_share[chosen].mean() * 1e3:.1f} |")
    firsts_s = np.array([first_s for first_s, _ in matched_ways_in(prefill_joins, trace(run, "joins", "decode"),
                                                                   token_budget)])
    lines += ["", "| the way in (ms) | median | mean | p90 |", "|---|---|---|---|",
              f"| measured | {np.median(ways) * 1e3:.1f} | {ways.mean() * 1e3:.1f} | {np.percentile(ways, 90) * 1e3:.1f} |"]
    for name, modelled in modelled_ways_in_s(firsts_s, batches, trace(run, "steps", "prefill"), serving).items():
        label = "hops stretched (unloaded)" if name == "stretched" else f"hops {name}"
        lines.append(f"| {label} | {np.median(modelled) * 1e3:.1f} | {modelled.mean() * 1e3:.1f} | "
                     f"{np.percentile(modelled, 90) * 1e3:.1f} |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True, type=Path,
                        help="a validate_planner --step-trace output directory of one shape and topology")
    parser.add_argument("--profile", required=True, type=Path, help="the profile whose serving costs to set beside")
    parser.add_argument("--token-budget", type=int,
                        help="prompts longer than this were computed in chunks and are left out (default: the "
                             "profile's engine's max_num_batched_tokens, what validate_planner runs)")
    parser.add_argument("--out", type=Path, help="also write the tables here")
    args = parser.parse_args(argv)
    profile = load_profile(args.profile)
    budget = args.token_budget or profile.engine.max_num_batched_tokens
    text = "\n".join(table(run, profile.serving, budget) for run in args.run)
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
