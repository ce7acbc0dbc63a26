"""`pdserve plan`: size the prefill and decode pools for a workload and SLOs, offline.
Argument parsing only; the work is in `planner.plan_job`."""

from __future__ import annotations

import argparse
from pathlib import Path

DESCRIPTION = """\
Choose how many prefill and decode workers to run. From a profile (what `pdserve profile`
measured on this hardware) pdserve fits a performance model, simulates the workload through
every split of --devices into N prefill + M decode workers (and through K colocated vLLM
instances, the baseline), and finds for each the highest request rate at which at least
--attainment-target of requests meet both the TTFT and the TPOT SLO (the goodput). It prints the
split with the highest goodput per device, its predicted latency, the colocated alternative,
and writes <output-dir>/<label>_search.png and .json.

--min-devices-for-rate R asks the reverse question: the fewest workers that meet the SLOs at
R req/s (up to --max-devices).

The workload options are `pdserve load`'s, so a plan can be checked against a real run with
the same flags. Until a profile of your own exists, --profile defaults to the example profile
of the `bench` model on 2 CPU cores (planner/profiles/example.json).
"""

EPILOG = """\
examples:
  pdserve plan --devices 6 --ttft-slo-ms 1000 --tpot-slo-ms 50
  pdserve plan --profile out/profile.json --workload trace --max-input-len 2048 --devices 8
  pdserve plan --min-devices-for-rate 5 --ttft-slo-ms 800 --tpot-slo-ms 60
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plan", help="choose prefill/decode pool sizes for a workload and SLOs (simulated)",
                              description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("hardware and model")
    g.add_argument("--profile", type=Path, help="profile JSON from `pdserve profile` (default: the example profile)")
    g.add_argument("--transport", help="KV transport to plan with (default: the profile's first)")
    g.add_argument("--decode-pick", choices=["handoff", "arrival"], default="handoff",
                   help="router picks the decode worker when prefill ends (handoff) or up front (arrival)")
    g = p.add_argument_group("workload (as `pdserve load`)")
    g.add_argument("--workload", choices=["random", "trace"], default="random",
                   help="random lengths or the Azure conversation trace (default random)")
    g.add_argument("--num-prompts", type=int, default=1000, help="requests per simulation (default 1000)")
    g.add_argument("--input-len", type=int, default=512, help="mean prompt tokens (default 512)")
    g.add_argument("--output-len", type=int, default=128, help="mean output tokens (default 128)")
    g.add_argument("--range-ratio", type=float, default=0.0,
                   help="lengths uniform in mean*(1 +- r) (default 0: fixed, as `pdserve load`)")
    g.add_argument("--trace", type=Path,
                   help="trace CSV (default <repo>/../shared/data/traces/AzureLLMInferenceTrace_conv.csv)")
    g.add_argument("--max-input-len", type=int, help="clip trace prompt lengths to this")
    g.add_argument("--max-output-len", type=int, help="clip trace output lengths to this")
    g.add_argument("--arrival", choices=["poisson", "gamma", "trace"],
                   help="arrival process (default poisson; the trace's own burstiness for --workload trace)")
    g.add_argument("--cv", type=float, default=1.0, help="gamma: coefficient of variation of the gaps (default 1)")
    g.add_argument("--seed", type=int, default=0, help="seed for arrivals and lengths (default 0)")
    g = p.add_argument_group("SLOs and search")
    g.add_argument("--ttft-slo-ms", type=float, default=1000.0, help="time to first token (default 1000)")
    g.add_argument("--tpot-slo-ms", type=float, default=100.0, help="time per output token (default 100)")
    g.add_argument("--attainment-target", type=float, default=0.9,
                   help="share of requests that must meet both SLOs (default 0.9)")
    g.add_argument("--devices", type=int, default=4, help="device budget: workers to split (default 4)")
    g.add_argument("--no-colocated", action="store_true", help="skip the colocated (vLLM alone) baseline")
    g.add_argument("--rel-tol", type=float, default=0.02,
                   help="rate bisection stops at this relative width (default 0.02)")
    g.add_argument("--min-devices-for-rate", type=float, metavar="R",
                   help="reverse question: fewest workers meeting the SLOs at R req/s")
    g.add_argument("--max-devices", type=int, default=16, help="cap for --min-devices-for-rate (default 16)")
    g = p.add_argument_group("output")
    g.add_argument("--output-dir", type=Path, default=Path("out/plan"), help="where PNG and JSON go (default out/plan)")
    g.add_argument("--label", default="plan", help="file name stem (default plan)")
    g.add_argument("--no-progress", action="store_true", help="no live progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from loadgen.harness import WorkloadConfig
    from loadgen.metrics import SLO
    from planner.perf_model import fit_perf_model
    from planner.plan_job import PlanInputs, run_fewest_devices, run_goodput_search, workload_label
    from planner.profile import ProfileError, load_profile
    from planner.profiles.example import EXAMPLE_PROFILE_PATH
    from planner.search import SearchSettings
    from planner.simulator import SimSettings, SimulationError

    try:
        if args.devices < 2:
            raise ValueError(f"--devices must be >= 2 (one prefill + one decode worker), got {args.devices}")
        profile = load_profile(args.profile or EXAMPLE_PROFILE_PATH)
        fit = fit_perf_model(profile)
        settings = SimSettings.from_profile(profile, args.transport, decode_pick=args.decode_pick)
        arrival = args.arrival or ("trace" if args.workload == "trace" else "poisson")
        workload = WorkloadConfig(kind=args.workload, arrival=arrival, rate_rps=1.0, cv=args.cv,
                                  num_requests=args.num_prompts, prompt_mean=args.input_len,
                                  output_mean=args.output_len, range_ratio=args.range_ratio,
                                  trace_path=args.trace, max_prompt_tokens=args.max_input_len,
                                  max_output_tokens=args.max_output_len, seed=args.seed)
        inputs = PlanInputs(
            fit=fit, settings=settings, workload_at=lambda rate: workload.build(rate_rps=rate),
            workload_label=workload_label(lambda rate: workload.build(rate_rps=rate), f"{args.workload}/{arrival}"),
            slo=SLO(ttft_s=args.ttft_slo_ms / 1e3, tpot_s=args.tpot_slo_ms / 1e3),
            search=SearchSettings(target_attainment=args.attainment_target, rel_tol=args.rel_tol),
            budget_devices=args.devices, include_colocated=not args.no_colocated,
            output_dir=args.output_dir, label=args.label, show_progress=not args.no_progress)
    except (ProfileError, ValueError, KeyError, FileNotFoundError) as bad:
        raise SystemExit(f"pdserve plan: {bad}") from bad
    args.output_dir.mkdir(parents=True, exist_ok=True)
    console = Console()
    try:
        if args.min_devices_for_rate is not None:
            return run_fewest_devices(inputs, args.min_devices_for_rate, args.max_devices, console)
        return run_goodput_search(inputs, console)
    except SimulationError as bad:
        raise SystemExit(f"pdserve plan: {bad}") from bad
