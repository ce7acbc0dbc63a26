"""The planner's prediction for every point of a goodput comparison. Run `--help`."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from loadgen.comparison.config import CompareConfig, workload
from loadgen.comparison.goodput import format_goodput
from loadgen.metrics import SLO
from loadgen.sweep import goodput_on_grid
from planner.goodput_replay import modelled_system, run_speed_factor, sent_requests, simulated
from planner.perf_model import fit_perf_model
from planner.profile import load_profile
from planner.router_config import read_planned_cluster
from planner.simulator import SimSettings

DESCRIPTION = """\
Replays a goodput comparison (`bench/goodput_vs_vllm.py`'s result JSON) through the simulator:
every system as the planner models it (vLLM's server as one engine over both cores, B as 1P+1D,
B-agg as one pdserve worker over both cores, each B*-<pair> as its plan says; see
planner/goodput_replay.py), on the very requests each run sent, with a profile's fitted model.
Prints, per system and rate, measured against simulated TTFT and TPOT (p50, p90) and attainment
under each SLO pair, and each system's goodput both ways on the comparison's grid of rates.
No cluster runs: it takes seconds.

vLLM's server (A, A-<n>) is charged vLLM's own serving costs where the profile measured them
(`pdserve profile --through cluster --vllm-server`), else pdserve's (the profile's `serving`, as
replays before that measurement did); --baseline-costs pdserve forces the latter, to compare.

--at-run-speed replays each run with the profile's prompts slowed (or sped up) by how much slower
the machine computed just before that run than while it was profiled: the run's speed check over
the profile's, where both timed the same product (the engines' dtype's; `loadgen.host_probe`).
The rest of the model (decode steps, transfers) is the profile's. Compare a replay with it and one
without to see how much of the plan's error the machine's own drift explains.

Writes <result stem>_predicted.json (or --label's), .md (tables for BENCHMARKS.md) and .png
(attainment against rate per SLO pair: measured solid, simulated dashed).
"""

EPILOG = """\
example:
  .venv/bin/python bench/goodput_predictions.py bench/results/goodput_bstar_epyc_wide.json \\
      --profile planner/profiles/bench_2cpu_epyc_avx512_wide_served.json
"""

LATENCIES = (("median_ttft_ms", "TTFT p50"), ("p90_ttft_ms", "TTFT p90"),
             ("median_tpot_ms", "TPOT p50"), ("p90_tpot_ms", "TPOT p90"))


def main() -> int:
    parser = argparse.ArgumentParser(description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result", type=Path, help="a goodput comparison's result JSON")
    parser.add_argument("--profile", type=Path, required=True, help="the profile whose fitted model predicts")
    parser.add_argument("--transport", default="tcp",
                        help="the profile's KV transport the simulator charges (default tcp; the comparison's "
                             "shared memory is not profiled and costs less)")
    parser.add_argument("--baseline-costs", choices=("vllm", "pdserve"), default="vllm",
                        help="serving costs charged to vLLM's server: its own, from the profile's vllm_server "
                             "section (default; pdserve's when the profile has none), or pdserve's")
    parser.add_argument("--at-run-speed", action="store_true",
                        help="slow each run's prompts by the machine's speed before it over its speed at the profile "
                             "(where both checks timed the same product; other runs replay at the profile's speed)")
    parser.add_argument("--calibrated-admission", action=argparse.BooleanOptionalAction, default=True,
                        help="the simulated routers scale admission's predictions by a calibration learned from the "
                             "simulated requests, as the live routers do (`RouterSettings.calibrated`, the default); "
                             "--no-calibrated-admission judges them as they are (a what-if)")
    parser.add_argument("--label", help="output file stem, beside the result (default <result stem>_predicted)")
    args = parser.parse_args()
    result = json.loads(args.result.read_text())
    slo_pairs = {pair: SLO(ttft_s=ms["ttft"] / 1e3, tpot_s=ms["tpot"] / 1e3) for pair, ms in result["slo_pairs"].items()}
    plans = {pair: read_planned_cluster(Path(directory)) for pair, directory in result["config"].get("plans", [])}
    profile = load_profile(args.profile)
    settings, model = SimSettings.from_profile(profile, args.transport), fit_perf_model(profile).model
    settings = replace(settings, router=replace(settings.router, calibrated=args.calibrated_admission))
    vllm_server = profile.vllm_server if args.baseline_costs == "vllm" else None
    console = Console()
    charged = ("its own serving costs (the profile's vllm_server)" if vllm_server
               else "pdserve's serving costs (--baseline-costs pdserve)" if args.baseline_costs == "pdserve"
               else "pdserve's serving costs (the profile did not measure vLLM's server)")
    console.print(f"vLLM's server is charged {charged}")
    config = result["config"]
    target = config["attainment_target"]
    workload_config = CompareConfig(  # what the comparison's workload is built from
        num_requests=config["num_requests"], max_model_len=config["max_model_len"], seed=config["seed"],
        max_prompt_tokens=config["max_prompt_tokens"], max_output_tokens=config["max_output_tokens"],
        shape=config.get("shape", "trace"), trace_path=config["trace_path"] and Path(config["trace_path"]))

    rows, curves = [], {}
    for run in result["runs"]:
        system = modelled_system(run["system"], slo_pairs["tight"], plans, vllm_server)
        if system is None:
            continue
        specs = workload(workload_config, run["rate_rps"])
        factor = run_speed_factor(run, profile.hardware) if args.at_run_speed else None
        at_speed = model.prompts_slower(factor) if factor else model
        predicted = simulated(sent_requests(specs, run["requests"]), system, settings, at_speed, slo_pairs)
        rows.append({"system": run["system"], "topology": system.topology.label, "rate_rps": run["rate_rps"],
                     "prompt_speed_factor": factor,
                     "measured": {pair: _kept(s) for pair, s in run["summaries"].items()},
                     "simulated": {pair: _kept(s) for pair, s in predicted.items()}})
        for pair in slo_pairs:
            for side in ("measured", "simulated"):
                curves.setdefault((pair, run["system"], side), []).append(
                    (run["rate_rps"], rows[-1][side][pair]["slo_attainment"]))
    if args.at_run_speed:
        console.print(speed_line(rows, profile.hardware.machine_product))
    rates = sorted({row["rate_rps"] for row in rows})
    goodput = {pair: {system: {side: goodput_on_grid(curves[(pair, system, side)], target)
                               for side in ("measured", "simulated")}
                      for (p, system, side) in curves if p == pair and side == "measured"} for pair in slo_pairs}

    latency_table, goodput_table = _latency_table(rows, slo_pairs), Table(title="goodput (req/s) on the comparison's grid")
    for column in ("SLO pair", "system", "topology", "measured", "simulated", "error"):
        goodput_table.add_column(column)
    topology = {row["system"]: row["topology"] for row in rows}
    for pair, systems in goodput.items():
        for system, sides in systems.items():
            measured, simulated_ = sides["measured"], sides["simulated"]
            error = (f"{(simulated_[0] - measured[0]) / measured[0]:+.0%}"
                     if measured[1] and simulated_[1] and measured[0] > 0 else "bound")
            goodput_table.add_row(pair, system, topology[system], format_goodput(measured, rates),
                                  format_goodput(simulated_, rates), error)
    console.print(latency_table)
    console.print(goodput_table)

    stem = args.result.with_name(args.label or args.result.stem + "_predicted")
    stem.with_suffix(".json").write_text(json.dumps(
        {"result": str(args.result), "profile": str(args.profile), "transport": args.transport,
         "at_run_speed": args.at_run_speed, "calibrated_admission": args.calibrated_admission,
         "vllm_server_costs": "vllm" if vllm_server else "pdserve", "rows": rows,
         "goodput_rps": {pair: {system: {side: {"goodput_rps": value, "bracketed": bracketed}
                                         for side, (value, bracketed) in sides.items()}
                                for system, sides in systems.items()} for pair, systems in goodput.items()}},
        indent=1))
    stem.with_suffix(".md").write_text(_markdown(rows, slo_pairs, goodput, topology, rates))
    png = _plot(curves, slo_pairs, stem.with_suffix(".png"), target)
    console.print(f"wrote {stem.with_suffix('.json')}, {stem.with_suffix('.md')}, {png}")
    return 0


def speed_line(rows: list[dict], product: str) -> str:
    """How the runs were replayed under --at-run-speed: how many at their own speed, and the spread."""
    factors = sorted(row["prompt_speed_factor"] for row in rows if row["prompt_speed_factor"])
    if not factors:
        return (f"--at-run-speed: no run has a speed check of the profile's product ({product}): every run was "
                "replayed at the profile's speed")
    return (f"--at-run-speed: {len(factors)} of {len(rows)} runs replayed with their prompts x{factors[0]:.2f}-"
            f"x{factors[-1]:.2f} (median x{factors[len(factors) // 2]:.2f}) of the profile's ({product} checks)")


def _kept(summary: dict) -> dict:
    return {key: summary.get(key) for key in ("slo_attainment", *(k for k, _ in LATENCIES))}


def _cell(measured, simulated) -> str:
    if measured is None or simulated is None:
        return "-"
    error = f" ({(simulated - measured) / measured:+.0%})" if measured else ""
    return f"{measured:.0f} / {simulated:.0f}{error}"


def _latency_table(rows: list[dict], slo_pairs: dict) -> Table:
    table = Table(title="measured / simulated (error), ms; attainment in %")
    for column in ("system", "req/s", *(name for _, name in LATENCIES), *(f"attain {pair}" for pair in slo_pairs)):
        table.add_column(column, justify="right")
    for row in rows:
        first = next(iter(slo_pairs))
        m, s = row["measured"][first], row["simulated"][first]
        table.add_row(row["system"], f"{row['rate_rps']:g}", *(_cell(m[k], s[k]) for k, _ in LATENCIES),
                      *(f"{row['measured'][p]['slo_attainment']:.0%} / {row['simulated'][p]['slo_attainment']:.0%}"
                        for p in slo_pairs))
    return table


def _markdown(rows: list[dict], slo_pairs: dict, goodput: dict, topology: dict, rates: list[float]) -> str:
    head = ["system", "req/s", *(name for _, name in LATENCIES), *(f"attainment {pair}" for pair in slo_pairs)]
    lines = ["Measured / simulated (relative error); latencies in ms.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    first = next(iter(slo_pairs))
    for row in rows:
        m, s = row["measured"][first], row["simulated"][first]
        lines.append("| " + " | ".join([row["system"], f"{row['rate_rps']:g}", *(_cell(m[k], s[k]) for k, _ in LATENCIES),
                                        *(f"{row['measured'][p]['slo_attainment']:.0%} / "
                                          f"{row['simulated'][p]['slo_attainment']:.0%}" for p in slo_pairs)]) + " |")
    lines += ["", "| SLO pair | system | topology | goodput measured | goodput simulated |", "|---|---|---|---|---|"]
    for pair, systems in goodput.items():
        for system, sides in systems.items():
            lines.append(f"| {pair} | {system} | {topology[system]} | {format_goodput(sides['measured'], rates)} | "
                         f"{format_goodput(sides['simulated'], rates)} |")
    return "\n".join(lines) + "\n"


def _plot(curves: dict, slo_pairs: dict, path: Path, target: float) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(slo_pairs), figsize=(6 * len(slo_pairs), 4.5), squeeze=False)
    systems = sorted({system for _, system, _ in curves})
    colors = {system: f"C{i}" for i, system in enumerate(systems)}
    for ax, pair in zip(axes[0], slo_pairs):
        for system in systems:
            for side, style in (("measured", "-o"), ("simulated", "--x")):
                points = sorted(curves.get((pair, system, side), []))
                if points:
                    ax.plot(*zip(*points), style, color=colors[system], label=f"{system} {side}")
        ax.axhline(target, color="gray", linestyle=":")
        ax.set_title(f"{pair} SLO pair")
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel("share meeting the SLOs")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    raise SystemExit(main())
