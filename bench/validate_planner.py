"""Do the planner's predictions hold on workloads it was not tuned on? Run the real cluster under
loadgen at several rates, for each workload shape and topology, and compare measured with
simulated p50/p90 TTFT and TPOT, SLO attainment and goodput, per profile.

    python bench/validate_planner.py --model models/tiny --profile planner/profiles/tiny_2cpu_amx_served.json \\
        --shape uniform --shape short-long --shape long-short --shape trace --shape bursty \\
        --topology 1P+1D --topology 2C --duration-s 45 --out-dir bench/results/validate_shapes_amx

For each topology (`1P+1D`, `1P+1H` hybrid, `2C` two aggregated workers; one core per worker, the
engine settings of the first profile, prefix caching off) and each shape (planner/validation_shapes.py:
uniform, short-long, long-short, trace, bursty), a real cluster serves the shape at each rate; the
very same request list (arrivals as sent, lengths) is simulated through the same topology with each
profile's fitted model, the simulated router placing with the real router's cost model and policy.
Without --rates, the rates are 30/60/90/120% of the first profile's simulated goodput for that
shape and topology; then (--refine, default 2) a rate halfway between the last whose measured
attainment met 90% and the first that missed, twice: the goodput each side puts on that grid is
known to a quarter of the bracket, not anywhere in it. Where every rate met 90% (or none did) the
grid is first stepped past its top (or below its bottom) by 30%, so that the knee is measured, not
bounded. Writes <out-dir>/<topology>/<shape>/validation.{json,png} (just <out-dir>/ for
one shape on one topology) and, for several, <out-dir>/summary.{json,md,png}: per shape and
topology the mean |error| of each latency percentile up to the measured knee and the goodput each
side puts where attainment crosses 90% on the same grid.

Before each rate the machine is checked (`loadgen.host_probe`: a product in the first profile's
dtype on every core, and a cross-core wake-up round trip), and over each rate a fixed Python loop
is timed every 0.15 s on every core (`InterpreterSampler`: what small decode steps and the
serving hops run at; validation.json keeps each core's second by second); each is printed against
the profile's own: a VM that runs slower than it was profiled shows there, not only in the errors.
--at-run-speed simulates each rate at that speed (mean: its mean; series: the decode worker's
core second by second).

With --step-trace every engine core writes its steps (`pdserve.engine_step_trace`) under
<out-dir>/.../logs/steps, and each rate prints what the decode worker's gap was made of
(`planner.validation_steps`): the clients' steady gap beside the engine's cycle (its step, the
profile's model of that step, the engine core's time between steps) and what the simulator adds
to the model's step; where the handoff's time went (`planner.validation_joins`: the hops outside
the decode worker, and inside it the step running when the request came, the pull and the steps it
spanned, the join step), set against the simulator's split of the same; and the prefill worker's
prompt steps against the model's (their stretch on the core the router shares). validation.json
keeps them under `engine_steps`, by rate (and each comparison's handoff split under `handoff_ms`).

validation.json keeps each rate's requests as sent, so a change to the simulator or the model can
be checked against the same real runs without running the cluster again (a directory of one run,
or of several as written above):

    python bench/validate_planner.py --resimulate bench/results/validate_shapes_amx \\
        --profile planner/profiles/tiny_2cpu_amx_served.json --out-dir out/resimulated

One run cannot tell a model's error from the host's drift (a shared VM moved one shape's knee by a
third within an hour). --repeats N runs every shape N times in turn and writes
<out-dir>/repeats.{json,md,png} (`planner.validation_repeats`): per shape and topology each run's
goodput, their spread, the simulator's error against their mean and what one run would have said;
each latency percentile's error against the runs' mean beside the runs' own spread. Several
--resimulate DIRs (each a pass) are taken together the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from rich.console import Console

from loadgen.metrics import SLO
from loadgen.sweep import GRID_STEP
from planner.profile import load_profile
from planner.simulator import SimSettings, SimulationError, Topology
from planner.simulator.config import (CORUN_SOURCES, HOP_MODELS, JOIN_WARMUPS, PROMPT_LOSS_SOURCES, SERVED_STEP_FORMS,
                                      STEP_SPREADS)
from planner.simulator.host import CLIENT_PLACEMENTS, ROUTER_CHARGES
from planner.validation import (decode_step_table, error_table, handoff_table, phase_table, prompt_step_table, verdict,
                                verdict_table, write_summary)
from planner.validation_cluster import ClusterPlan, model_config, run_shape
from planner.validation_repeats import repeats, repeats_table, write_repeats_files
from planner.validation_runs import (NoRateMeetsSlos, ValidationSetup, compare, load_earlier, planned_router,
                                     recorded_path, write_validation)
from planner.validation_shapes import SHAPE_NAMES, Shape, Uniform, validation_shapes
from planner.validation_speed import RUN_SPEEDS

REPO = Path(__file__).resolve().parent.parent
ROUTER_SAMPLE_REQUESTS = 200  # the sample whose mean lengths set the router's cost model


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="checkpoint the cluster serves (the profiles' model); "
                   "required unless --resimulate")
    p.add_argument("--resimulate", type=Path, metavar="DIR", action="append",
                   help="no cluster: simulate the requests of an earlier run (DIR/validation.json, or every "
                        "DIR/<topology>/<shape>/validation.json) with --profile and compare with what it measured; "
                        "repeat for the passes of one validation (or repeated ones) to take them together as --repeats does "
                        "(a --repeats run: give each of its run<k> directories)")
    p.add_argument("--repeats", type=int, default=1, metavar="N",
                   help="run every shape and topology N times, in turn (A B C D, A B C D: a drift of the host lands "
                        "on every shape alike), each pass under <out-dir>/run<k>/; then <out-dir>/repeats.{json,md,png} "
                        "set the simulator's error against the runs' own spread (default 1)")
    p.add_argument("--profile", type=Path, action="append", required=True,
                   help="profile to simulate with; repeat to compare several (e.g. --through engine and cluster)")
    p.add_argument("--shape", action="append", choices=SHAPE_NAMES,
                   help="workload shape; repeat for several (default: uniform)")
    p.add_argument("--topology", action="append", type=topology_arg,
                   help="1P+1D, 1P+1H (hybrid: the decode worker may prefill), 2C (two aggregated workers); "
                        "one core per worker; repeat for several (default: 1P+1D)")
    p.add_argument("--rates", help="comma-separated offered rates, req/s, for every shape and topology "
                                   "(default: from the first profile, per shape and topology)")
    p.add_argument("--refine", type=int, default=2, metavar="N",
                   help=f"after the rates, up to N more: {GRID_STEP:g} times the highest while every rate's "
                        "attainment met 90%% (the goodput lies past the grid), the lowest over "
                        f"{GRID_STEP:g} while none did, else halving the bracket between the last rate that met 90%% "
                        "and the first that missed, where the goodput is interpolated (a grid 30%% apart across a "
                        "cliff in attainment leaves it anywhere in the bracket); 0: the rates alone (default 2)")
    p.add_argument("--duration-s", type=float, default=60.0, help="seconds of arrivals per rate (default 60)")
    p.add_argument("--min-requests", type=int, default=40, help="at least this many requests per rate (default 40)")
    p.add_argument("--input-len", type=int, default=128, help="uniform shape: mean prompt tokens (default 128)")
    p.add_argument("--output-len", type=int, default=64, help="uniform shape: mean output tokens (default 64)")
    p.add_argument("--range-ratio", type=float, default=0.5,
                   help="uniform shape: lengths uniform in mean x (1 +- r) (default 0.5)")
    p.add_argument("--max-model-len", type=int,
                   help="the engines' context, which the shapes' lengths are sized to (default: the model's "
                        "max_position_embeddings)")
    p.add_argument("--trace", type=Path,
                   help="trace CSV of the trace shape (default <repo>/../shared/data/traces/AzureLLMInferenceTrace_conv.csv)")
    p.add_argument("--ttft-slo-ms", type=float, default=200.0, help="TTFT SLO (default 200)")
    p.add_argument("--tpot-slo-ms", type=float, default=20.0, help="TPOT SLO (default 20)")
    p.add_argument("--transport", default="tcp", choices=["shm", "tcp", "torch"],
                   help="the cluster's KV transport, which the profiles must have measured (default tcp; "
                        "`pdserve up` serves over shm on one host)")
    p.add_argument("--host-window-s", type=float, default=SimSettings.host_window_s,
                   help="a what-if for the simulated side: how long the host's CPU from an arrival, a handoff "
                        "or emitted tokens loads the cores (default %(default)s, the simulator's own)")
    p.add_argument("--router-cpu-charge", default=SimSettings.router_cpu_charge, choices=ROUTER_CHARGES,
                   help="a what-if for the simulated side: the bound router's CPU as a load over the host "
                        "window (window, the simulator's own) or as work queued on its cores (backlog)")
    p.add_argument("--at-run-speed", nargs="?", const="mean", default=None, choices=RUN_SPEEDS,
                   help="a what-if for the simulated side: each rate at the machine's speed over it, the profile's "
                        "prompts slower by the rate's compute check over the profile's and its decode steps by the "
                        "rate's interpreter loop over the profile's (runs and profiles that sampled it): its mean "
                        "over the rate (mean, the default), or the decode worker's core second by second (series: "
                        "runs that kept it; the others at their mean)")
    p.add_argument("--speed-from-profile", action="store_true",
                   help="a what-if for the simulated side: the decode steps at speeds drawn from the profile's own "
                        "interpreter series (10 s blocks of it, seeded by the rate; profiles that kept one): the "
                        "machine's speed moving as the profile saw it, which a planner could know ahead, where "
                        "--at-run-speed is each run's own")
    p.add_argument("--speed-elasticity", type=float, default=1.0,
                   help="with --at-run-speed or --speed-from-profile: how much the decode steps move with the "
                        "interpreter, in logs (1, the default: one for one, as lone steps did on a Zen 4 VM; 0.5: a "
                        "1.44x slower loop, a 1.2x longer step, the median a Zen 5 VM's loaded rates read)")
    p.add_argument("--served-step", default=SimSettings.served_step, choices=SERVED_STEP_FORMS,
                   help="a what-if for the simulated side: what serving adds to a decode step, the profile's "
                        "fitted line (line, the simulator's own) or its measured extra by batch, interpolated (table)")
    p.add_argument("--prompt-stretch", type=prompt_stretch_arg, default=(), metavar="BATCH:STRETCH[+LOST_MS],...",
                   help="a what-if for the simulated side, in place of the profile's rows: a prefill step's stretch "
                        "by the decode batch streaming as it starts, and the ms it loses whatever its length (a step "
                        "of t ms takes LOST_MS + STRETCH x t), where longer than the host model's, e.g. "
                        "2:1.4,8:2.1,32:2.9 or 2:1.3,8:1.9+12; 0:1.4 for the idle decode worker. The first token's "
                        "delivery keeps the whole of the profile's first-token latency with these: give them over "
                        "the idle decode worker (1 + a batch's median stretch - the idle one's, from --step-trace's "
                        "report) and the idle excess stays there, or as measured (with a 0 row) and a lone prompt's "
                        "idle excess is counted twice")
    p.add_argument("--prompt-loss", default=SimSettings.prompt_loss, choices=PROMPT_LOSS_SOURCES,
                   help="a what-if for the simulated side: a prefill step takes the profile's measured loss as "
                        "measured (profile, the simulator's own: the idle row with nothing streaming, each batch's "
                        "row over idle added to it, and the idle part taken off the first token's delivery; a "
                        "profile measured before the idle row was kept charges its rows over idle), the rows over "
                        "idle alone whatever the profile holds (over-idle, the simulator before), or the host "
                        "model's stretch alone (none); --prompt-stretch replaces any")
    p.add_argument("--corun", default=SimSettings.corun, choices=CORUN_SOURCES,
                   help="a what-if for the simulated side: a decode step beside a prompt step takes the co-run "
                        "stretch the profile read through the cluster (served, the simulator's own; the engines' "
                        "where the profile has none) or the two bare engines' (engines, the simulator before)")
    p.add_argument("--join-warmup", default=SimSettings.join_warmup, choices=JOIN_WARMUPS,
                   help="a what-if for the simulated side: the steps after a request joins a decode batch pay the "
                        "profile's join warm-up (profile, where the profile measured it) or not (none, the "
                        "simulator's own)")
    p.add_argument("--router-core-max-stolen", type=float, default=SimSettings.router_core_max_stolen,
                   help="a what-if for the simulated side: the largest share of a step on the router's core the "
                        "host's load may take (default %(default)s, the simulator's own; 0.5: a fair scheduler keeps "
                        "the stepping engine half its core)")
    p.add_argument("--client-placement", default=SimSettings.client_placement, choices=CLIENT_PLACEMENTS,
                   help="a what-if for the simulated side: the client's CPU beside the bound router takes the "
                        "room the router leaves on its cores first (router-room), shares every stepping core alike "
                        "while the router's step too (balanced), or goes where Linux wakes it: the router's cores "
                        "while idle, else either core alike (wake). Default: the profile's, which its served step "
                        "was netted with (wake since it was kept; router-room before); another nets the profile's "
                        "kept batched runs again for it")
    p.add_argument("--hops", default=SimSettings.hops, choices=HOP_MODELS,
                   help="a what-if for the simulated side: a first token's hops under load, stretched as a step on "
                        "the router's cores (stretched, the simulator's own) or unstretched plus the waits behind "
                        "the decode side's outputs in the router and the decode worker (queued), or those waits "
                        "after the hop's CPU runs beside the prefill engine's steps on its core, at half of it while "
                        "the engine steps (prefill-core)")
    p.add_argument("--step-spread", default=SimSettings.step_spread, choices=STEP_SPREADS,
                   help="a what-if for the simulated side: what a decode step's drawn spread cannot take from a "
                        "short step goes to the next (carried, the simulator's own) or is dropped (cut, the "
                        "simulator before: it raises short steps' mean)")
    p.add_argument("--step-trace", action="store_true",
                   help="trace the engines' steps and print, at each rate, what the decode worker's gap was made "
                        "of (the engine's step against the profile's model, the time between steps, the clients' gap)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, default=REPO / "out" / "validate_planner")
    args = p.parse_args(argv)
    if args.model is None and args.resimulate is None:
        p.error("give --model (run the cluster) or --resimulate DIR (re-simulate an earlier run)")
    if args.refine < 0:
        p.error("--refine: 0 or more rates")
    if args.repeats < 1 or (args.resimulate and args.repeats > 1):
        p.error("--repeats: 1 or more passes of the cluster; with --resimulate give one DIR a pass instead")
    args.shape = args.shape or ["uniform"]
    args.topology = args.topology or [Topology.disaggregated(1, 1)]
    return args


def prompt_stretch_arg(text: str) -> tuple[tuple[int, float, float], ...]:
    """"0:1.43,4:2.1+6" -> ((0, 1.43, 0.0), (4, 2.1, 0.006)), checked as `SimSettings.prompt_stretch`."""
    def row(item: str) -> tuple[int, float, float]:
        batch, loss = item.split(":")
        stretch, _, lost_ms = loss.partition("+")
        return int(batch), float(stretch), float(lost_ms or 0) / 1e3
    try:
        rows = tuple(row(item) for item in text.split(","))
        SimSettings(token_budget=1, max_num_seqs=1, num_kv_blocks=1, block_size=1, kv_bytes_per_token=1,
                    prompt_stretch=rows)
    except (ValueError, SimulationError) as error:
        raise argparse.ArgumentTypeError(f"{text!r}: BATCH:STRETCH[+LOST_MS] rows by rising batch ({error})") from error
    return rows


def topology_arg(text: str) -> Topology:
    try:
        topology = Topology.from_label(text)
    except SimulationError as error:
        raise argparse.ArgumentTypeError(str(error)) from error
    if topology.devices > 2:
        raise argparse.ArgumentTypeError(f"{text}: this validation runs one worker per core on two cores")
    return topology


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console() if sys.stdout.isatty() else Console(width=240)  # a log has no width: keep tables whole
    roots = args.resimulate or [None] * args.repeats   # an earlier run's directory a pass, or None: measure now
    several = len(roots) > 1
    passes = [(root, args.out_dir / f"run{k}" if several else args.out_dir) for k, root in enumerate(roots, 1)]
    by_pass = []
    for k, (root, out_root) in enumerate(passes, 1):
        if several:
            console.rule(f"pass {k} of {len(passes)}" + (f": {root}" if root else ""))
        runs = resimulated(args, root, out_root, console) if root else measured(args, out_root, console)
        by_pass.append(validate(args, runs, out_root, root, console))
    if several:
        write_repeats(args.out_dir, by_pass, [path.stem for path in args.profile], args.resimulate, console)
    return 0


def validate(args: argparse.Namespace, runs, out_root: Path, source: Path | None,
             console: Console) -> dict[tuple[str, str], list]:
    """Compares each (setup, runs, out_dir) of one pass with the simulator, prints and writes it
    (and, for several shapes or topologies, the pass's summary under `out_root`; `source`: the
    earlier run's directory it resimulates, None for one measured now); returns the comparisons
    by (shape, topology)."""
    verdicts, rates_by_run, compared = [], {}, {}
    for setup, shape_runs, out_dir in runs:
        comparisons = compare(shape_runs, args.profile, setup.transport, setup.slo, setup.topology, setup.router,
                              what_if(args))
        shape = setup.workload.get("shape", "uniform")
        console.print(error_table(comparisons, f"measured vs simulated, {setup.topology.label}, {shape}, "
                                               f"{setup.model_name}"))
        phases = phase_table([c for c in comparisons if c.model == args.profile[0].stem],
                             f"where the time goes, {setup.topology.label}, {shape}: measured vs simulated phases")
        if phases is not None:
            console.print(phases)
        handoffs = handoff_table([c for c in comparisons if c.model == args.profile[0].stem],
                                 f"the handoff, {setup.topology.label}, {shape}: outside the decode worker and inside it")
        if handoffs is not None:
            console.print(handoffs)
        prompts = prompt_step_table([c for c in comparisons if c.model == args.profile[0].stem],
                                    f"prompt steps, {setup.topology.label}, {shape}: measured / simulated stretch "
                                    "over the model's step, by the decode batch beside them")
        if prompts is not None:
            console.print(prompts)
        decodes = decode_step_table([c for c in comparisons if c.model == args.profile[0].stem],
                                    f"decode steps, {setup.topology.label}, {shape}: measured / simulated over the "
                                    "model plus the served line, by batch (no join)")
        if decodes is not None:
            console.print(decodes)
        json_path, png = write_validation(out_dir, setup, args.profile, shape_runs, comparisons,
                                          source, what_if(args))
        console.print(f"wrote {json_path} and {png}")
        rates_by_run[(shape, setup.topology.label)] = [run.rate_rps for run in shape_runs]
        compared[(shape, setup.topology.label)] = comparisons
        verdicts += [verdict(comparisons, shape, setup.topology.label, path.stem) for path in args.profile]
    if verdicts:
        console.print(verdict_table(verdicts, rates_by_run))
    if len(rates_by_run) > 1:
        console.print(f"wrote {', '.join(str(path) for path in write_summary(out_root, verdicts, rates_by_run))}")
    return compared


def write_repeats(out_dir: Path, by_pass: list[dict], models: list[str], sources: list[Path] | None,
                  console: Console) -> None:
    """repeats.{json,md,png} under `out_dir`: every shape and topology that all passes ran, each
    model's runs taken together (`planner.validation_repeats`)."""
    keys = [key for key in by_pass[0] if all(key in compared for compared in by_pass)]
    for key in dict.fromkeys(k for compared in by_pass for k in compared):
        if key not in keys:
            console.print(f"{key[0]} on {key[1]} did not run in every pass: left out of the repeats")
    if not keys:
        return
    rows = [repeats([compared[key] for compared in by_pass], *key, model) for key in keys for model in models]
    console.print(repeats_table(rows))
    paths = write_repeats_files(out_dir, rows, len(by_pass), [recorded_path(s) for s in sources or ()])
    console.print(f"wrote {', '.join(str(path) for path in paths)}")


def measured(args: argparse.Namespace, out_root: Path, console: Console):
    """Runs the real cluster for each topology and shape; yields (setup, runs, out_dir) as each finishes."""
    first = load_profile(args.profile[0])
    slo = SLO(ttft_s=args.ttft_slo_ms / 1e3, tpot_s=args.tpot_slo_ms / 1e3)
    max_model_len = args.max_model_len or model_config(args.model)["max_position_embeddings"]
    shapes = validation_shapes(max_model_len, Uniform(args.input_len, args.output_len, args.range_ratio),
                               args.trace, args.seed)
    several = len(args.shape) * len(args.topology) > 1
    plan = ClusterPlan(args.model, args.duration_s, args.min_requests, args.seed, args.refine, args.step_trace,
                       tuple(float(r) for r in args.rates.split(",")) if args.rates else ())
    for topology in args.topology:
        for name in args.shape:
            shape = shapes[name]
            out_dir = out_root / topology.label.replace("/", "_") / name if several else out_root
            router = planned_router(first, args.transport, topology,
                                    shape.workload.build(rate_rps=1.0, num_requests=ROUTER_SAMPLE_REQUESTS))
            setup = ValidationSetup(args.model.name, slo, workload_record(shape), args.transport, topology, router)
            console.rule(f"{topology.label}: {name} ({shape.description})")
            try:
                runs = run_shape(plan, first, [path.stem for path in args.profile], shape, setup, max_model_len,
                                 out_dir, console)
            except NoRateMeetsSlos as why:  # the other shapes and topologies still run
                console.print(f"skipped {name} on {topology.label}: {why}")
                continue
            yield setup, runs, out_dir


def what_if(args: argparse.Namespace) -> dict:
    """The simulator settings the command line changes from the simulator's own."""
    changed = {"host_window_s": args.host_window_s, "router_cpu_charge": args.router_cpu_charge,
               "served_step": args.served_step, "router_core_max_stolen": args.router_core_max_stolen,
               "hops": args.hops, "client_placement": args.client_placement, "step_spread": args.step_spread,
               "prompt_stretch": args.prompt_stretch, "prompt_loss": args.prompt_loss, "corun": args.corun,
               "join_warmup": args.join_warmup}
    return ({name: value for name, value in changed.items() if value != getattr(SimSettings, name)}
            | ({"at_run_speed": args.at_run_speed} if args.at_run_speed else {})
            | ({"speed_from_profile": True} if args.speed_from_profile else {})
            | ({"speed_elasticity": args.speed_elasticity} if args.speed_elasticity != 1.0 else {}))


def resimulated(args: argparse.Namespace, root: Path, out_root: Path, console: Console):
    """The runs of an earlier validation under `root` (one directory, or one per topology and shape
    below it)."""
    files = [root / "validation.json"] if (root / "validation.json").exists() else sorted(root.glob("*/*/validation.json"))
    if not files:
        raise SystemExit(f"no validation.json in {root} or in {root}/<topology>/<shape>/")
    for path in files:
        setup, runs = load_earlier(path, args.transport)
        out_dir = out_root / path.parent.relative_to(root)
        console.print(f"re-simulating {path}")
        yield setup, runs, out_dir


def workload_record(shape: Shape) -> dict:
    """The shape as validation.json keeps it: its name, description and loadgen workload fields."""
    fields = {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(shape.workload).items()}
    return {"shape": shape.name, "description": shape.description, **fields}


if __name__ == "__main__":
    sys.exit(main())
