"""pdserve past its knee, against vLLM: good requests per second at 1.5x and 2x the knee rate. Run `--help`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from rich.console import Console

from goodput_vs_vllm import run_all
from past_knee_options import add_run_options, run_config
from loadgen.comparison.admission import FEW_OBSERVATIONS, admitted_misses, describe_misses
from loadgen.comparison.budget import Budget
from loadgen.comparison.config import PLAN_PREFIX, CompareConfig
from loadgen.comparison.goodput import Measurement
from loadgen.comparison.overload import OverloadPoint, knee_rps, overload_points, overload_rates, verdicts
from loadgen.comparison.host_speed import speed_factors
from loadgen.comparison.report import (machine_speed_line, markdown_table, past_knee_run_json, plot_past_knee, rich_table,
                                      speed_cell)
DESCRIPTION = """\
Side by side, in one run, on the same two cores and the same `bench` model (as
bench/goodput_vs_vllm.py, whose systems, workload and noise guard this reuses):
  A      vLLM's own OpenAI server, colocated on both cores
  B-slo  pdserve 1 prefill + 1 decode worker, its router given the tight SLO pair: admission
         refuses at once (429 / RESOURCE_EXHAUSTED, with Retry-After) a request it predicts cannot
         meet the TTFT SLO, instead of queueing it to miss (--system picks another pdserve system)
  B*-<pair> (--plan DIR, instead of --system) the cluster `pdserve plan --write-router-config DIR`
         picked for the judged pair: its topology, cost model, placement policy and SLOs (its
         admission judges both the TTFT and the TPOT SLO)

Phase 1 sweeps --rates (ABBA, a system stops once it missed the target twice) and finds the pdserve
system's knee: the rate at which its SLO attainment under --pair first falls below 90%. Phase 2
offers both systems --multiples of that knee (default 1.5x and 2x). A request is good when it
meets the SLO pair; good req/s at a rate = the rate x the share of offered requests that were good
(refusals are misses), and attainment among admitted counts only the requests not refused.

Aims (issue 14): at 1.5x and 2x its knee pdserve keeps >= 0.9 of the peak good req/s it reached at or
below that rate, and >= 90% of the requests it admits meet the SLO pair. vLLM admits everything:
its curve shows what queueing past the knee does.

For a pdserve system the router's admission calibration is scraped through every run (its
/metrics, every 0.5 s: loadgen/comparison/admission.py) and each admitted request that missed the
pair is listed with the TTFT factor admission applied when it was sent, and how many recent
requests that factor was learned from (with none it is its prior, 1: the cost model alone decided).

Writes <out-dir>/<label>.json, <label>.md and <label>.png (good req/s and attainment among
admitted against the offered rate). About 25-35 minutes.
"""


def parse_args(argv: list[str] | None) -> tuple[CompareConfig, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--system", default="B-slo", help="the pdserve system (default %(default)s)")
    parser.add_argument("--rates", default="0.4,0.8,1.2,1.6,2.0,2.4",
                        help="phase 1's rates, req/s, ascending (default %(default)s)")
    parser.add_argument("--multiples", default="1.5,2", help="phase 2's offered rates as multiples of the knee")
    parser.add_argument("--pair", choices=("tight", "loose"), default="tight", help="the SLO pair judged")
    add_run_options(parser, num_requests=40, label="overload")
    parser.add_argument("--plan", type=Path, metavar="DIR",
                        help="run B*-<pair>, the cluster `pdserve plan --write-router-config DIR` picked, instead of "
                             "--system (plan it with this run's SLO pair and workload)")
    args = parser.parse_args(argv)
    plans = ((args.pair, args.plan),) if args.plan else ()
    if plans:
        args.system = PLAN_PREFIX + args.pair
    try:
        config = run_config(args, pdserve_systems=() if plans else (args.system,), plans=plans)
        args.multiples = tuple(float(k) for k in args.multiples.split(","))
    except ValueError as bad:
        parser.error(str(bad))
    return config, args


def main(argv: list[str] | None = None) -> int:
    config, args = parse_args(argv)
    console = Console() if sys.stdout.isatty() else Console(width=150)
    budget = Budget(config.budget_s)
    started = time.monotonic()
    system = args.system
    console.rule("phase 1: the knee")
    measured, skipped = run_all(config, console, budget)
    knee, bracketed = knee_rps(measured, system, args.pair, config.attainment_target)
    console.print(f"{system}'s knee under the {args.pair} pair: {knee:.3f} req/s"
                  + ("" if bracketed else " (not bracketed by the rates: widen --rates)"))
    if knee > 0:
        console.rule("phase 2: past the knee")
        past = replace(config, rates_rps=tuple(overload_rates(knee, args.multiples)), stop_after_failures=99,
                       seed=config.seed + 1)  # fresh prompts
        more, more_skipped = run_all(past, console, budget)
        measured, skipped = measured + more, skipped + more_skipped
    points = overload_points(measured, args.pair)
    found = verdicts(points, system, knee, args.multiples, target=config.attainment_target) if knee > 0 else []
    _report(config, args, measured, points, knee, bracketed, found, skipped, console, time.monotonic() - started)
    return 0


def _report(config, args, measured: list[Measurement], points: list[OverloadPoint], knee: float, bracketed: bool,
            found, skipped, console: Console, wall_s: float) -> None:
    headers = ["system", "rate (req/s)", "x knee", "good req/s", "attainment", "among admitted", "refused",
               "TTFT p90 ms", "machine speed", "other cores"]
    by_key = {(m.system, m.rate_rps): m for m in measured}
    factors = dict(zip(by_key, speed_factors([m.host_ms_per_product for m in by_key.values()])))
    rows = []
    for p in points:
        m = by_key[(p.system, p.rate_rps)]
        s = m.summaries[args.pair]
        factor = factors[(p.system, p.rate_rps)]
        rows.append([p.system, f"{p.rate_rps:g}", f"{p.rate_rps / knee:.2f}" if knee else "-", f"{p.good_rps:.3f}",
                     f"{p.attainment:.0%}", "-" if p.admitted_attainment is None else f"{p.admitted_attainment:.0%}",
                     f"{p.refused_share:.0%}", f"{s['p90_ttft_ms']:.0f}", speed_cell(factor),
                     f"{m.other_load_cores:.2f}"])
    verdict_headers = ["x knee", "rate (req/s)", "good req/s", "share of peak", "among admitted", "holds"]
    verdict_rows = [[f"{v.multiple:g}", f"{v.rate_rps:g}", f"{v.good_rps:.3f}", f"{v.share_of_peak:.2f}",
                     "-" if v.admitted_attainment is None else f"{v.admitted_attainment:.0%}",
                     "yes" if v.holds else "NO"] for v in found]
    console.print(rich_table(f"Runs under the {args.pair} pair", headers, rows))
    console.print(rich_table(f"{args.system} past its knee ({knee:.3f} req/s)", verdict_headers, verdict_rows))
    speed = machine_speed_line(measured)
    console.print(speed)
    pair = config.pair(args.pair)
    misses = {id(m): admitted_misses(m.result.records, m.admission, pair.slo) for m in measured if m.admission}
    admission = [f"{m.system} @ {m.rate_rps:g} req/s: {describe_misses(misses[id(m)], FEW_OBSERVATIONS)}"
                 for m in sorted(measured, key=lambda m: (m.system, m.rate_rps)) if m.admission]
    for line in admission:
        console.print(line)
    out = config.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{config.label}.md").write_text(
        f"SLO pair {args.pair}: {pair.describe()}; {config.num_requests} trace requests per run; "
        f"{args.system}'s knee {knee:.3f} req/s{'' if bracketed else ' (not bracketed)'}; wall {wall_s / 60:.1f} min\n\n"
        + markdown_table(headers, rows) + "\n" + markdown_table(verdict_headers, verdict_rows) + f"\n_{speed}_\n"
        + "".join(f"\nskipped {s.system} @ {s.rate_rps:g}: {s.reason}" for s in skipped)
        + "".join(f"\n- admission, {line}" for line in admission) + "\n")
    (out / f"{config.label}.json").write_text(json.dumps({
        "argv": sys.argv, "pair": args.pair, "knee_rps": knee, "knee_bracketed": bracketed, "wall_s": wall_s,
        "points": [asdict(p) for p in points], "verdicts": [asdict(v) for v in found],
        "skipped": [asdict(s) for s in skipped],
        "runs": [past_knee_run_json(m, args.pair, misses.get(id(m))) for m in measured]}, indent=2))
    plot_past_knee(points, args.pair, out / f"{config.label}.png", "Past the knee: pdserve's admission against vLLM's queue",
                   marker_lines=[k * knee for k in (1.0, *args.multiples)] if knee > 0 else (),
                   xlabel="offered rate (req/s); dotted: the knee and its multiples")
    console.print(f"wrote {out / config.label}.{{json,md,png}}")


if __name__ == "__main__":
    sys.exit(main())
