"""`pdserve profile`: measure the engine and the KV transports on this host, write a profile file.
Argument parsing only; the work is in `planner.profiler.job`."""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.commands.engine_options import add_engine_options, engine_settings

DESCRIPTION = """\
Measure what the planner needs to know about this host, for one model and engine setup:
  - prefill time against prompt tokens (one request alone, chunked by the engine's token budget);
  - decode step time against batch size and total context (concurrent requests, ignore_eos);
  - KV transfer time against bytes, for each transport (the real transports over loopback; shm,
    the one-sided copy out of the producer's shared memory, is what `pdserve up` serves over on
    one host, and what `pdserve plan` plans with by default when measured).
--through engine (default) times one colocated vLLM engine bound to --cpu-cores, the cores one
worker gets. --through cluster times that engine on the first of --cluster-cores, then starts a
real 1P+1D local cluster over the first of --transports (prefill on the first core, decode on the
second) and measures what serving
adds around the engines: the latency of the router's and the gRPC hops on the first token and on
the handoff to decode, the CPU the workers' API processes take from their own cores per request
and per token, and the CPU of the router and a client on the same host. On small models and few
cores those are as large as the engine's own costs, and the planner's predictions hold only with
them. It then starts two engines at once, one on each cluster core, and measures how much each
slows the other (a prompt beside a decoding batch, a decode step beside prompts: shared caches,
memory bandwidth, or two vCPUs of one physical core), which the planner charges a step taken while
another worker steps. Then it times the engine again bound to both cluster cores (--no-wide skips it): one
worker spanning two devices, as vLLM's own server runs, which `pdserve plan` weighs against two
one-core workers. Otherwise the profile describes one device per worker. With --vllm-server it
then starts vLLM's own OpenAI server on that wide engine and measures what its API process adds
(the first token, each decode step): the baseline's serving costs, so that a goodput comparison's
predictions of vLLM (bench/goodput_predictions.py) charge vLLM's costs, not pdserve's. Give the
same engine options your workers run with.

Writes OUT (a versioned JSON profile recording hardware, model and engine settings) and OUT with
a .png suffix (measured points and the fitted model), and prints the fit and its error.
`pdserve plan --profile OUT` and `pdserve planner --profile OUT` read it. A full run takes a few
minutes; --quick measures the fewest points the fits accept (about a minute on the tiny model).

A shared VM runs the same engine 1.3-1.8x slower for minutes at a time, and one profile holds
whatever its minutes ran at. --merge measures nothing: it writes OUT as the median of several
profiles of one host kind, model and engine setup (each row and serving term the median of the
profiles that measured it; planner/profile_merge.py). It hedges against an unlucky profile rather
than beating a good one: on the kept validations its goodput error was below the worst single
profile's every time and below their mean two times in three (BENCHMARKS.md, "Several profiles of
one VM, merged"). Measure them apart in time, then merge.
"""

EPILOG = """\
examples:
  pdserve profile --model models/bench --out profiles/bench.json
  pdserve profile --model models/tiny --quick --transports tcp --out /tmp/tiny.json
  pdserve profile --model models/bench --through cluster --cluster-cores 0,1 --out profiles/bench_served.json
  pdserve profile --merge p1.json --merge p2.json --merge p3.json --out profiles/median.json
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("profile", help="measure prefill, decode and KV transfer times on this host",
                              description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("profile.json"), help="profile file to write (default profile.json)")
    p.add_argument("--transports", default="shm,tcp,torch",
                   help="comma-separated KV transports to measure: shm (one-sided, what `pdserve up` serves over "
                        "on one host), tcp, torch (default shm,tcp,torch); with --through cluster the first is "
                        "the transport of the cluster pass")
    p.add_argument("--cpu-cores", default="0",
                   help="cores to bind the engine to, as one worker is bound (default 0; '' = vLLM's choice)")
    p.add_argument("--through", choices=["engine", "cluster"], default="engine",
                   help="the engine alone, or also what a real 1P+1D cluster adds around it (default engine)")
    p.add_argument("--cluster-cores", default="0,1",
                   help="--through cluster: PREFILL,DECODE core sets of the two workers (default 0,1)")
    p.add_argument("--no-wide", action="store_true",
                   help="--through cluster: skip the engine on both cluster cores (the planner then offers only "
                        "one-core workers)")
    p.add_argument("--vllm-server", action="store_true",
                   help="--through cluster, with the wide engine: also measure vLLM's own OpenAI server around "
                        "it (a minute or two more; the baseline of goodput comparisons)")
    p.add_argument("--quick", action="store_true", help="fewest points (tests, smoke runs): about a minute")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")
    p.add_argument("--merge", type=Path, action="append", metavar="PROFILE",
                   help="measure nothing: write OUT as the median of these profiles (repeat the flag, two or more, "
                        "of one host kind, model and engine setup); --model is not needed then")
    add_engine_options(p, model_required=False)
    p.set_defaults(func=run, skips_teardown=True)


def run(args: argparse.Namespace) -> int:
    import os

    from rich.console import Console

    from planner.profile import ProfileError
    from planner.profiler.job import ProfileJob, run_profile
    from planner.profiler.plan import PlanError

    if args.merge:
        return _merge(args.merge, args.out)
    if args.model is None:
        raise SystemExit("pdserve profile: give --model (the checkpoint to measure), or --merge PROFILE twice or more")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        job = ProfileJob(engine=engine_settings(args, args.cpu_cores),
                         transports=tuple(t.strip() for t in args.transports.split(",") if t.strip()),
                         quick=args.quick, out=args.out, show_progress=not args.no_progress, path=args.through,
                         cluster_cores=_two_core_sets(args.cluster_cores), wide=not args.no_wide,
                         vllm_server=args.vllm_server)
        console = Console()
        outcome = run_profile(job, console)
    except (PlanError, ProfileError, ValueError, FileNotFoundError) as bad:
        raise SystemExit(f"pdserve profile: {bad}") from bad
    console.print(f"wrote {outcome.profile_path} and {outcome.plot_path} in {outcome.elapsed_s:.0f} s")
    return 0


def _merge(paths: list[Path], out: Path) -> int:
    from rich.console import Console

    from planner.perf_model import fit_perf_model
    from planner.profile import ProfileError, load_profile, save_profile
    from planner.profile_merge import merged_profile
    from planner.profiler.plot import plot_profile
    from planner.profiler.summary import print_summary

    try:
        merged = merged_profile([load_profile(path) for path in paths])
    except (ProfileError, FileNotFoundError) as bad:
        raise SystemExit(f"pdserve profile --merge: {bad}") from bad
    out.parent.mkdir(parents=True, exist_ok=True)
    save_profile(merged, out)
    fit = fit_perf_model(merged)
    plot = plot_profile(merged, fit.model, out.with_suffix(".png"))
    console = Console()
    print_summary(console, merged, fit)
    console.print(f"wrote {out} and {plot}: the median of {len(paths)} profiles")
    return 0


def _two_core_sets(text: str) -> tuple[str, str]:
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"--cluster-cores takes PREFILL,DECODE core sets such as 0,1; got {text!r}")
    return parts[0], parts[1]
