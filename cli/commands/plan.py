"""`pdserve plan`: choose the topology and pool sizes for a workload and SLOs, offline.
Argument parsing only; the work is in `planner.plan_job`."""

from __future__ import annotations

import argparse
from pathlib import Path

DESCRIPTION = """\
Choose how to run the workers. From a profile (what `pdserve profile` measured on this hardware)
pdserve fits a performance model and simulates the workload, placed by the router's own policy,
through every topology of --devices workers: disaggregated N prefill + M decode, hybrid N + M
(decode workers may compute a prompt themselves when the placement prefers it; once per
--local-prefill-caps value) and aggregated K workers (each serving both phases), the last two once
per --token-budgets value (the engines' step token budget: a smaller chunk of a prompt beside the
running decodes keeps their TPOT down and takes more steps to a first token). Where the profile
measured one engine over several devices (`pdserve profile --through cluster` does, over both
cluster cores), aggregated workers that wide are tried too: 1Cx2 is one worker over two devices,
what vLLM's own server is on a two-core host. For each it
finds the highest request rate at which at least --attainment-target of requests meet both the
TTFT and the TPOT SLO (the goodput). It prints each topology kind's best, the pick (the highest
goodput per device of all, or with --objective total the highest within --devices), its predicted
latency, and writes <output-dir>/<label>_search.png and .json; --write-router-config DIR writes the
router's cost.json and placement.json for the pick, and cluster.json (the pick and its predicted
goodput, which `bench/goodput_vs_vllm.py --plan` runs).

--min-devices-for-rate R asks the reverse question: the fewest devices that meet the SLOs at
R req/s (up to --max-devices), for each topology kind over the same variants as the search
(hybrid caps, token budgets, workers as wide as the profile measured), and the fewest of all.

The workload options are `pdserve load`'s, so a plan can be checked against a real run with
the same flags. Until a profile of your own exists, --profile defaults to the example profile
of the `bench` model on 2 CPU cores (planner/profiles/example.json).
"""

EPILOG = """\
examples:
  pdserve plan --devices 6 --ttft-slo-ms 1000 --tpot-slo-ms 50
  pdserve plan --devices 4 --write-router-config out/router   # then: pdserve up ... (printed)
  pdserve plan --profile out/profile.json --workload trace --max-input-len 2048 --devices 8
  pdserve plan --topologies disaggregated,hybrid --local-prefill-caps 0,512
  pdserve plan --topologies aggregated --token-budgets 0,512   # 2C or 2C@512: the engine's chunk, or 512
  pdserve plan --min-devices-for-rate 5 --ttft-slo-ms 800 --tpot-slo-ms 60
"""


def _kinds(text: str) -> tuple[str, ...]:
    from pdserve.roles import TOPOLOGIES

    kinds = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    if not kinds or set(kinds) - set(TOPOLOGIES):
        raise argparse.ArgumentTypeError(f"a comma-separated list of {', '.join(TOPOLOGIES)}, got {text!r}")
    return kinds


def _speed_margin(text: str) -> str | float:
    from planner.speed_margin import parse_speed_margin

    try:
        return parse_speed_margin(text)
    except ValueError as bad:
        raise argparse.ArgumentTypeError(str(bad)) from None


def _token_counts(zero_means: str):
    def parse(text: str) -> tuple[int, ...]:
        try:
            counts = tuple(dict.fromkeys(int(c) for c in text.split(",") if c.strip()))
        except ValueError:
            counts = ()
        if not counts or any(c < 0 for c in counts):
            raise argparse.ArgumentTypeError(f"a comma-separated list of token counts >= 0 (0: {zero_means}), "
                                             f"got {text!r}")
        return counts
    return parse


_caps = _token_counts("no cap")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plan", help="choose the topology and pool sizes for a workload and SLOs (simulated)",
                              description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("hardware and model")
    g.add_argument("--profile", type=Path, help="profile JSON from `pdserve profile` (default: the example profile)")
    g.add_argument("--transport", help="KV transport to plan with (default: the profile's first)")
    g.add_argument("--decode-pick", choices=["handoff", "arrival"], default="arrival",
                   help="a disaggregated request's decode worker: the placement's, chosen when the router sends "
                        "the request, as the router does (arrival), or placed again when its prefill ends "
                        "(handoff, a what-if) (default arrival)")
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
    g.add_argument("--objective", choices=["per-device", "total"], default="per-device",
                   help="the pick: the highest goodput per device (what to grow a pool by; it may leave devices "
                        "unused) or the highest goodput within --devices (how best to use the devices you have) "
                        "(default per-device)")
    g.add_argument("--speed-margin", type=_speed_margin, default="auto",
                   help="the robust pick: rank topologies by their goodput on a machine this much slower than "
                        "profiled (0.1: 10%%), so a pick whose SLO margin is its own service time, which loses its "
                        "goodput when a shared VM slows, gives way to one with room; 0: by the profile's speed; "
                        "auto: as much as the profile's own machine-speed checks moved between its start and end, "
                        "none when they held within 1.1x (default auto)")
    g.add_argument("--topologies", type=_kinds, default=("disaggregated", "hybrid", "aggregated"),
                   help="topology kinds to search, comma-separated (default disaggregated,hybrid,aggregated)")
    g.add_argument("--local-prefill-caps", type=_caps, default=(0, 256, 1024),
                   help="hybrid: the placement's local_prefill_max_tokens values to try, comma-separated "
                        "(0: no cap; default 0,256,1024)")
    g.add_argument("--token-budgets", type=_token_counts("the engine's own, the profile's"), default=(0, 256, 512, 1024),
                   help="aggregated and hybrid: the engines' step token budgets (vLLM's max_num_batched_tokens, "
                        "the chunk of chunked prefill) to try, comma-separated; a pick with one runs its workers "
                        "with --max-num-batched-tokens (0: the engine's own; default 0,256,512,1024)")
    g.add_argument("--placement-config", type=Path,
                   help="the placement policy the simulated router uses (JSON/YAML, `pdserve router "
                        "--placement-config`; default: the router's defaults)")
    g.add_argument("--no-colocated", action="store_true", help="skip the aggregated (colocated workers) topologies")
    g.add_argument("--calibrated-admission", action=argparse.BooleanOptionalAction, default=True,
                   help="the simulated router's admission scales its predictions by what it observed of the "
                        "simulated requests, as a live router's calibration does (default); --no-calibrated-"
                        "admission judges them at the cost model's own predictions (a what-if)")
    g.add_argument("--rel-tol", type=float, default=0.02,
                   help="rate bisection stops at this relative width (default 0.02)")
    g.add_argument("--min-devices-for-rate", type=float, metavar="R",
                   help="reverse question: fewest devices meeting the SLOs at R req/s, per topology kind")
    g.add_argument("--max-devices", type=int, default=16, help="cap for --min-devices-for-rate (default 16)")
    g = p.add_argument_group("output")
    g.add_argument("--output-dir", type=Path, default=Path("out/plan"), help="where PNG and JSON go (default out/plan)")
    g.add_argument("--label", default="plan", help="file name stem (default plan)")
    g.add_argument("--no-progress", action="store_true", help="no live progress bar")
    g.add_argument("--write-router-config", type=Path, metavar="DIR",
                   help="write the picked cluster's router files here: cost.json (--cost-model) and "
                        "placement.json (--placement-config), and print the `pdserve up` flags that use them")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from loadgen.harness import WorkloadConfig
    from loadgen.metrics import SLO
    from planner.perf_model import fit_perf_model
    from planner.plan_job import PlanInputs, run_fewest_devices, run_goodput_search, with_router_cost, workload_label
    from planner.profile import ProfileError, load_profile
    from planner.profiles.example import EXAMPLE_PROFILE_PATH
    from planner.rate_search import SearchSettings
    from planner.simulator import RouterSettings, SimSettings, SimulationError
    from planner.speed_margin import resolve_speed_margin
    from router.policies.placement import PlacementConfig

    try:
        if args.devices < 2:
            raise ValueError(f"--devices must be >= 2 (one prefill + one decode worker), got {args.devices}")
        profile = load_profile(args.profile or EXAMPLE_PROFILE_PATH)
        fit = fit_perf_model(profile)
        placement = PlacementConfig.from_file(args.placement_config) if args.placement_config else PlacementConfig()
        settings = SimSettings.from_profile(profile, args.transport, decode_pick=args.decode_pick,
                                            router=RouterSettings(placement, calibrated=args.calibrated_admission))
        arrival = args.arrival or ("trace" if args.workload == "trace" else "poisson")
        workload = WorkloadConfig(kind=args.workload, arrival=arrival, rate_rps=1.0, cv=args.cv,
                                  num_requests=args.num_prompts, prompt_mean=args.input_len,
                                  output_mean=args.output_len, range_ratio=args.range_ratio,
                                  trace_path=args.trace, max_prompt_tokens=args.max_input_len,
                                  max_output_tokens=args.max_output_len, seed=args.seed)
        workload_at = lambda rate: workload.build(rate_rps=rate)  # noqa: E731
        kinds = tuple(k for k in args.topologies if not (args.no_colocated and k == "aggregated"))
        if not kinds:
            raise ValueError("--no-colocated leaves no topology to search: add disaggregated or hybrid to --topologies")
        inputs = PlanInputs(
            fit=fit, settings=with_router_cost(settings, fit, workload_at), workload_at=workload_at,
            workload_label=workload_label(workload_at, f"{args.workload}/{arrival}"),
            slo=SLO(ttft_s=args.ttft_slo_ms / 1e3, tpot_s=args.tpot_slo_ms / 1e3),
            search=SearchSettings(target_attainment=args.attainment_target, rel_tol=args.rel_tol),
            budget_devices=args.devices, output_dir=args.output_dir, label=args.label,
            show_progress=not args.no_progress, kinds=kinds, local_prefill_caps=args.local_prefill_caps,
            token_budgets=args.token_budgets, router_config_dir=args.write_router_config, objective=args.objective,
            speed_margin=resolve_speed_margin(args.speed_margin, profile.hardware.machine_ms_start,
                                              profile.hardware.machine_ms_end))
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
