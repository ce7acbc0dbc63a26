"""Admission's calibration from a cold start: a plan's router as written against variants of its
placement policy, every run on a fresh cluster. Run `--help`."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

from rich.console import Console

from goodput_vs_vllm import run_all
from past_knee_options import add_run_options, run_config
from loadgen.comparison.admission import (FEW_OBSERVATIONS, OLD_RULE, admission_totals, admitted_misses,
                                          describe_misses)
from loadgen.comparison.budget import Budget
from loadgen.comparison.config import PLAN_PREFIX, CompareConfig
from loadgen.comparison.goodput import Measurement, Skipped
from loadgen.comparison.overload import overload_points
from loadgen.comparison.report import (machine_speed_line, markdown_table, past_knee_run_json, plot_past_knee,
                                      rich_table)
from planner.router_config import PLACEMENT_FILE
from router.policies.placement import PlacementConfig

DESCRIPTION = f"""\
Does the router's admission decide well before its calibration has seen many requests? The
calibration scales admission's predicted TTFT and TPOT by what recent requests saw against theirs
(router/policies/calibration.py); a fresh router, or one after a quiet minute, has seen nothing.
This runs the cluster `pdserve plan --write-router-config DIR` picked (B*-<pair>, its placement.json
as written) beside copies of it whose placement.json differs by --variant NAME=JSON (B*-<pair>-NAME;
default: min16={json.dumps(OLD_RULE)}, the rule before the prior: the factor 1 until 16 relevant
requests are kept), at each of --rates, --repeats times, on the same two cores and the `bench`
model, with the workload and noise guard of bench/goodput_vs_vllm.py.

Every run starts its cluster afresh (its router's calibration empty), so every run is a cold
start into the offered load; which system goes first alternates from one (repeat, rate) to the
next and between repeats at the same rate (the order rotates with more than two). Pick rates past the
plan's knee (bench/overload.py finds it): that is where admission decides and where a
prediction that runs low admits requests that then miss.

Reported per system and rate (and totalled over the runs): good req/s, attainment among the
admitted, refusals, and each admitted miss with the TTFT calibration when it was sent (the
router's /metrics, sampled every 0.5 s): how many were sent while it held fewer than
{FEW_OBSERVATIONS} observations. Writes <out-dir>/<label>.json, .md and .png. A run takes about
N / rate seconds plus a minute to start the cluster and warm it.
"""


def parse_args(argv: list[str] | None) -> tuple[CompareConfig, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", type=Path, metavar="DIR", required=True,
                        help="the plan's directory (`pdserve plan --write-router-config DIR`)")
    parser.add_argument("--pair", choices=("tight", "loose"), default="tight",
                        help="the SLO pair the plan was made for and the runs are judged by (default %(default)s)")
    parser.add_argument("--variant", action="append", metavar="NAME=JSON", default=[],
                        help="a copy of the plan with these placement.json keys changed, e.g. "
                             "q90='{\"calibration_quantile\": 0.9}'; repeatable (default: min16, the old rule)")
    parser.add_argument("--rates", default="1.2,1.5,2.0", help="offered rates, req/s, ascending (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per system and rate, fresh prompts each (default %(default)s)")
    add_run_options(parser, num_requests=60, label="calibration_warmup")
    args = parser.parse_args(argv)
    try:
        args.variants = parse_variants(args.variant or [f"min16={json.dumps(OLD_RULE)}"])
        if args.repeats < 1:
            raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
        config = run_config(args, pdserve_systems=(), plans=((args.pair, args.plan),), with_a=False,
                            stop_after_failures=10**6)
    except ValueError as bad:
        parser.error(str(bad))
    return config, args


def parse_variants(specs: list[str]) -> dict[str, dict]:
    """NAME=JSON -> {name: placement keys to change}; each must make a valid placement policy."""
    variants = {}
    for spec in specs:
        name, _, text = spec.partition("=")
        if not name or not name.replace("_", "").isalnum() or name in variants:
            raise ValueError(f"--variant needs a distinct NAME of letters, digits or _ before '=', got {spec!r}")
        try:
            changes = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"--variant {name}: not JSON after '=': {error}") from None
        if not isinstance(changes, dict):
            raise ValueError(f"--variant {name}: expected a JSON object of placement.json keys, got {text!r}")
        PlacementConfig.from_dict(changes)   # names the bad key
        variants[name] = changes
    return variants


def variant_plan(plan: Path, changes: dict, into: Path) -> Path:
    """A copy of the plan's directory whose placement.json has `changes` applied."""
    shutil.copytree(plan, into)
    placement = json.loads((into / PLACEMENT_FILE).read_text())
    (into / PLACEMENT_FILE).write_text(json.dumps({**placement, **changes}, indent=1, sort_keys=True))
    PlacementConfig.from_file(into / PLACEMENT_FILE)
    return into


def main(argv: list[str] | None = None) -> int:
    config, args = parse_args(argv)
    console = Console() if sys.stdout.isatty() else Console(width=150)
    budget = Budget(config.budget_s)
    started = time.monotonic()
    copies = Path(tempfile.mkdtemp(prefix=f"{config.label}-plans-"))
    measured: list[Measurement] = []
    skipped: list[Skipped] = []
    try:
        plans = [(args.pair, args.plan)] + [(f"{args.pair}-{name}", variant_plan(args.plan, changes, copies / name))
                                             for name, changes in args.variants.items()]
        runs = [(repeat, i, rate) for repeat in range(args.repeats) for i, rate in enumerate(config.rates_rps)]
        for step, (repeat, i, rate) in enumerate(runs):
            turn = (repeat + i) % len(plans)
            order = plans[turn:] + plans[:turn]
            console.rule(f"[{step + 1}/{len(runs)}] {rate:g} req/s, repeat {repeat + 1}: {', '.join(n for n, _ in order)}")
            one = replace(config, rates_rps=(rate,), plans=tuple(order), seed=config.seed + repeat)
            more, cut = run_all(one, console, budget)   # a fresh cluster per system: every run a cold start
            measured += more
            skipped += cut
    finally:
        shutil.rmtree(copies, ignore_errors=True)
    _report(config, args, measured, skipped, console, time.monotonic() - started)
    return 0


def _report(config: CompareConfig, args, measured: list[Measurement], skipped: list[Skipped], console: Console,
            wall_s: float) -> None:
    pair = config.pair(args.pair)
    ordered = sorted(measured, key=lambda m: (m.system, m.rate_rps))
    misses = {id(m): admitted_misses(m.result.records, m.admission, pair.slo) for m in ordered}
    points = {id(m): overload_points([m], args.pair)[0] for m in ordered}
    headers = ["system", "rate (req/s)", "good req/s", "among admitted", "refused", "admitted misses", "TTFT p90 ms"]
    rows = [[m.system, f"{m.rate_rps:g}", f"{points[id(m)].good_rps:.3f}",
             "-" if points[id(m)].admitted_attainment is None else f"{points[id(m)].admitted_attainment:.0%}",
             f"{points[id(m)].refused_share:.0%}", describe_misses(misses[id(m)], FEW_OBSERVATIONS),
             f"{m.summaries[args.pair]['p90_ttft_ms']:.0f}"] for m in ordered]
    totals = admission_totals([(m.system, m.result.records, misses[id(m)]) for m in ordered], pair.slo, FEW_OBSERVATIONS)
    total_headers = ["system", "runs", "offered", "refused", "admitted met", "among admitted", "good share",
                     f"admitted misses (sent at < {FEW_OBSERVATIONS} observations)"]
    total_rows = [[t.system, str(t.runs), str(t.offered), str(t.refused), str(t.admitted_met),
                   "-" if t.among_admitted is None else f"{t.among_admitted:.1%}", f"{t.good_share:.1%}",
                   f"{t.admitted_missed} ({t.missed_early})"] for t in totals]
    speed = machine_speed_line(measured)
    console.print(rich_table(f"Runs under the {args.pair} pair, each a cold start", headers, rows))
    console.print(rich_table("Totals", total_headers, total_rows))
    console.print(speed)
    for s in skipped:
        console.print(f"[yellow]skipped {s.system} @ {s.rate_rps:g}: {s.reason}")
    out = config.out_dir
    out.mkdir(parents=True, exist_ok=True)
    variants = ", ".join(f"{PLAN_PREFIX}{args.pair}-{name}: {json.dumps(changes)}" for name, changes in args.variants.items())
    (out / f"{config.label}.md").write_text(
        f"SLO pair {args.pair}: {pair.describe()}; {config.num_requests} trace requests per run, every run a fresh "
        f"cluster; {PLAN_PREFIX}{args.pair}: the plan's placement.json as written; {variants}; wall {wall_s / 60:.1f} min\n\n"
        + markdown_table(headers, rows) + "\n\n" + markdown_table(total_headers, total_rows) + f"\n\n_{speed}_\n"
        + "".join(f"\nskipped {s.system} @ {s.rate_rps:g}: {s.reason}" for s in skipped) + "\n")
    (out / f"{config.label}.json").write_text(json.dumps({
        "argv": sys.argv, "pair": args.pair, "variants": args.variants, "wall_s": wall_s,
        "points": [asdict(points[id(m)]) for m in ordered], "skipped": [asdict(s) for s in skipped],
        "totals": [{**asdict(t), "admitted_missed": t.admitted_missed, "among_admitted": t.among_admitted,
                    "good_share": t.good_share} for t in totals],
        "runs": [past_knee_run_json(m, args.pair, misses[id(m)]) for m in ordered]}, indent=2))
    plot_past_knee(list(points.values()), args.pair, out / f"{config.label}.png",
                   "Admission from a cold start: the plan's router against variants of its placement policy",
                   labels=legends(args.pair, args.variants), connect=False,
                   xlabel="offered rate (req/s); one dot per run, each a cold start")
    console.print(f"wrote {out / config.label}.{{json,md,png}}")


def legends(pair: str, variants: dict[str, dict]) -> dict[str, str]:
    """System -> what it runs: the plan as written, or the keys its copy changed."""
    return {PLAN_PREFIX + pair: f"{PLAN_PREFIX}{pair}: placement.json as planned",
            **{f"{PLAN_PREFIX}{pair}-{name}": f"{PLAN_PREFIX}{pair}-{name}: {json.dumps(changes)}"
               for name, changes in variants.items()}}


if __name__ == "__main__":
    sys.exit(main())
