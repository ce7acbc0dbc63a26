"""`pdserve planner`: the online SLA planner. Argument parsing and wiring only; the loop is
`planner.online`, the assembly `planner.service`, the decision `planner.decision`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from cli.commands.credential_options import add_cluster_secret_option, add_redis_password_option, redis_connection_url
from cli.commands.engine_options import add_engine_options
from pdserve.roles import TOPOLOGIES
from planner.model_error import ErrorConfig

DESCRIPTION = """\
Keep the prefill and decode pools sized for the load, every --interval-s:
  1. read live load from Redis: each router publishes its arrival rate, mean prompt and output
     lengths and p90 TTFT/TPOT over a sliding window (pdserve:{cluster}:load:router:*), and the
     workers' registry (which replicas serve);
  2. predict the next interval's rate and find, by simulation with the profile's performance
     model, the fewest prefill + decode workers meeting the TTFT and TPOT SLOs for
     --attainment-target of requests; a pool whose observed p90 breaks its SLO grows regardless;
     cooldowns, step limits, hysteresis and bounds keep it from flapping;
  2b. judge the model: its p50/p90 TTFT and TPOT for the load just observed, against the observed
     ones; it learns a correction from the difference, and while its recent error is beyond
     --max-model-error (or too few intervals were judged) the plan of step 2 is not followed (only
     an observed SLO break still grows a pool) and each decision says why;
  3. ask the actuator to resize: `local` starts/stops `pdserve worker` processes on this host
     next to the cluster (removal is a SIGTERM drain: no in-flight request is dropped),
     `kubernetes` patches the role Deployments' scale, `ray` resizes a `pdserve up --ray` cluster.
Each decision is published to pdserve:{cluster}:planner:decision (and the last 100 to
...:planner:decisions) and printed; `pdserve planner status` prints the last one, and with
--metrics-port the model's predicted vs observed latency are Prometheus gauges (pdserve_planner_*).
Stop with Ctrl-C (local workers the planner started are drained).
"""

EPILOG = """\
examples:
  pdserve planner --redis-url redis://127.0.0.1:6379/0 --profile profile.json --ttft-slo-s 1 \\
      --tpot-slo-s 0.05 --actuator local --model models/bench --decode-cores 1,0
  pdserve planner --redis-url redis://redis:6379/0 --actuator kubernetes --k8s-namespace pdserve
  pdserve planner --redis-url redis://127.0.0.1:6379/0 --once --dry-run   # one decision, no scaling
  pdserve planner status --redis-url redis://127.0.0.1:6379/0   # what the running planner did last, and why
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("planner", help="resize the prefill/decode pools from live load (online SLA planner)",
                              description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", nargs="?", choices=("run", "status"), default="run",
                   help="run (the default): the planner loop; status: print the running planner's last decision "
                        "and its model's predicted vs observed latency (needs only --redis-url and --cluster)")
    p.add_argument("--redis-url", required=True, help="the cluster's Redis, e.g. redis://127.0.0.1:6379/0")
    p.add_argument("--cluster", default="default", help="cluster name: the Redis key prefix (default default)")
    add_redis_password_option(p)
    g = p.add_argument_group("model and SLOs")
    g.add_argument("--profile", type=Path, help="profile from `pdserve profile` (default: the example profile)")
    g.add_argument("--transport", help="KV transport to simulate (default: the profile's first)")
    g.add_argument("--ttft-slo-s", type=float, default=1.0, help="time to first token SLO (default 1.0)")
    g.add_argument("--tpot-slo-s", type=float, default=0.1, help="time per output token SLO (default 0.1)")
    g.add_argument("--attainment-target", type=float, default=0.9, help="share meeting both SLOs (default 0.9)")
    g.add_argument("--sim-requests", type=int, default=300, help="requests per simulated probe (default 300)")
    error = ErrorConfig()
    g.add_argument("--max-model-error", type=float, default=error.max_error,
                   help="follow the model's plan only while the model is this accurate: every interval the "
                        "planner compares the p90 TTFT and TPOT its model predicts (corrected by what it observed "
                        "so far) for the load it just saw with the p90s the routers measured; if the average "
                        f"|predicted - observed| / observed over the last {error.window_intervals} intervals "
                        f"exceeds this, or fewer than {error.min_intervals} intervals had "
                        f"{error.min_finished_requests}+ finished requests, it does not scale on the model and says "
                        "why (a p90 over its SLO still grows a pool). Default "
                        f"{error.max_error:g}, i.e. {error.max_error * 100:g} percent; inf: always follow the model")
    g = p.add_argument_group("loop")
    g.add_argument("--interval-s", type=float, default=10.0, help="seconds between decisions (default 10)")
    g.add_argument("--min-prefill", type=int, default=1)
    g.add_argument("--min-decode", type=int, default=1)
    g.add_argument("--max-prefill", type=int, default=4)
    g.add_argument("--max-decode", type=int, default=4)
    g.add_argument("--scale-up-cooldown-s", type=float, default=30.0)
    g.add_argument("--scale-down-cooldown-s", type=float, default=120.0)
    g.add_argument("--max-step-up", type=int, default=2, help="replicas added per pool per decision (default 2)")
    g.add_argument("--max-step-down", type=int, default=1, help="replicas removed per pool per decision (default 1)")
    g.add_argument("--scale-down-headroom", type=float, default=0.2,
                   help="shrink only if the smaller pools still fit rate x (1 + this) (default 0.2)")
    g.add_argument("--min-requests-for-guard", type=int, default=10,
                   help="finished requests the routers' window must hold before an observed p90 over the SLO "
                        "adds a replica whatever the model says (default 10: the p90 of 3 requests is their "
                        "slowest)")
    g.add_argument("--predictor", choices=["last", "moving_average", "trend"], default="trend")
    g.add_argument("--topology", choices=TOPOLOGIES, default="disaggregated",
                   help="what the cluster was started as (`pdserve up --topology`; default disaggregated), "
                        "until the planner publishes another")
    g.add_argument("--topologies", type=_kinds, metavar="KIND,KIND",
                   help="topologies the planner may switch among, preferred first, e.g. "
                        "disaggregated,aggregated: it switches when another needs fewer devices at the predicted "
                        "load, or the current one meets the SLOs at no size (default: --topology only, never switch)")
    g.add_argument("--topology-cooldown-s", type=float, default=300.0,
                   help="no topology switch within this long of the last one (default 300)")
    g.add_argument("--worker-devices", type=int, default=1, metavar="N",
                   help="devices (cores) each worker spans, as its core set gives it (e.g. 2 with --decode-cores "
                        "0-1): the planner sizes the pool with the profile's engine of that width (`pdserve profile "
                        "--through cluster` measures one over every core) and counts --max-decode in workers of "
                        "N devices; N > 1 only with --topology aggregated alone (default 1)")
    g.add_argument("--once", action="store_true", help="one decision, print it, exit")
    g.add_argument("--dry-run", action="store_true", help="decide and publish, never scale")
    g.add_argument("--metrics-port", type=int, default=0,
                   help="serve Prometheus /metrics here: the model's predicted vs observed latency (0: off)")
    g.add_argument("--metrics-host", default="127.0.0.1",
                   help="address /metrics binds (default 127.0.0.1; 0.0.0.0 for a Prometheus on another host)")
    _add_local_arguments(p)
    _add_remote_arguments(p)
    p.set_defaults(func=run)


def _kinds(text: str) -> tuple[str, ...]:
    from planner.topology_switch import check_kinds

    try:
        return check_kinds([kind.strip() for kind in text.split(",") if kind.strip()])
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def _add_local_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("local actuator (--actuator local): workers started on this host")
    g.add_argument("--actuator", choices=["local", "kubernetes", "ray"], default="local",
                   help="what resizes the pools (default local)")
    g.add_argument("--worker-transport", choices=["tcp", "torch", "shm", "auto"], default="auto",
                   help="the cluster's KV transport")
    g.add_argument("--prefill-cores", default="", help="core sets new prefill workers rotate over, e.g. 0 or 0,1")
    g.add_argument("--decode-cores", default="", help="core sets new decode workers rotate over, e.g. 1,0")
    g.add_argument("--worker-log-dir", default="", help="where new workers' logs go (default: a temp dir)")
    add_cluster_secret_option(g, "is given to the workers it starts (they serve only routers proving it and "
                                 "authenticate KV transfers with it)")
    add_engine_options(p, model_required=False,
                       title="local actuator: the engine new workers run (must match the cluster's; --model needed)")


def _add_remote_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `planner.actuators.kubernetes.add_cli_arguments` and `...ray.add_cli_arguments`,
    declared here so building the CLI does not import the kubernetes and ray clients into every
    `pdserve` process (tests/unit/planner_online/test_planner_command.py keeps them identical)."""
    g = p.add_argument_group("Kubernetes actuator (--actuator kubernetes)")
    g.add_argument("--k8s-namespace", default="pdserve", help="namespace of the pool Deployments (default: pdserve)")
    g.add_argument("--k8s-prefill-deployment", default="pdserve-prefill",
                   help="Deployment running the prefill pool (default: pdserve-prefill)")
    g.add_argument("--k8s-decode-deployment", default="pdserve-decode",
                   help="Deployment running the decode pool (default: pdserve-decode)")
    g.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                   help="kubeconfig to use outside a cluster (default: env KUBECONFIG, else ~/.kube/config); "
                        "in a pod the ServiceAccount is used")
    g = p.add_argument_group("Ray actuator (--actuator ray)")
    g.add_argument("--ray-address", default=os.environ.get("RAY_ADDRESS", "auto"),
                   help="the Ray cluster given to `pdserve up --ray` (default: env RAY_ADDRESS, else auto)")
    g.add_argument("--ray-cluster", default="default", help="the --cluster given to `pdserve up --ray`")
    g.add_argument("--ray-auth-token-file", metavar="FILE", default="",
                   help="a file holding the Ray cluster's token (Ray's token authentication is on by default); "
                        "default: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, then ~/.ray/auth_token")


def _actuator(args: argparse.Namespace, unmanaged):
    """(actuator, cleanup) for --actuator; cleanup drains what the planner started."""
    if args.actuator == "kubernetes":
        from planner.actuators.kubernetes import KubernetesActuator, config_from_cli_args

        return KubernetesActuator.connect(config_from_cli_args(args)), lambda: None
    if args.actuator == "ray":
        try:
            from planner.actuators.ray import RayActuator, config_from_cli_args
        except ModuleNotFoundError as missing:
            raise SystemExit(f"pdserve planner: the Ray actuator is not in this build ({missing}); "
                             "use --actuator local or kubernetes") from missing
        return RayActuator.connect(config_from_cli_args(args)), lambda: None
    if not args.model:
        raise SystemExit("pdserve planner: --actuator local needs --model (the checkpoint the cluster serves)")
    from cli.commands.engine_options import engine_settings
    from planner.actuators.local import LocalActuator
    from planner.actuators.local_processes import WorkerLaunchSpec, WorkerProcesses

    cores = {role: tuple(c for c in getattr(args, f"{role}_cores").split(",") if c) for role in ("prefill", "decode")}
    processes = WorkerProcesses(WorkerLaunchSpec(
        redis_url=args.redis_url, cluster=args.cluster, engine=engine_settings(args), transport=args.worker_transport,
        cpu_cores=cores, log_dir=args.worker_log_dir, cluster_secret_file=args.cluster_secret_file,
        redis_password_file=args.redis_password_file))
    return LocalActuator(processes, unmanaged), processes.stop_all


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    if args.action == "status":
        return _status(args)
    from planner.topology_switch import check_worker_devices

    try:
        check_worker_devices(args.worker_devices, args.topologies or (args.topology,))
    except ValueError as bad:
        raise SystemExit(f"pdserve planner: {bad}") from bad
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return asyncio.run(_main(args))
    except (ValueError, FileNotFoundError) as bad:
        raise SystemExit(f"pdserve planner: {bad}") from bad


def _status(args: argparse.Namespace) -> int:
    import json
    import sys
    import time

    import redis

    from pdserve.keys import planner_decision_key
    from planner.status import status_lines

    try:
        with redis.Redis.from_url(redis_connection_url(args, "planner status")) as client:
            raw = client.get(planner_decision_key(args.cluster))
    except (redis.RedisError, OSError, ValueError) as error:
        raise SystemExit(f"pdserve planner status: cannot read {args.redis_url}: {error}") from error
    if raw is None:
        print(f"pdserve planner status: no decision of cluster {args.cluster!r} in the last 10 intervals; "
              "is `pdserve planner` running with this --redis-url and --cluster?", file=sys.stderr)
        return 1
    print("\n".join(status_lines(json.loads(raw), time.time())))
    return 0


async def _main(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from rich.console import Console

    from pdserve.metrics import start_metrics_server
    from pdserve.registry import Registry
    from planner.decision import PlannerConfig
    from planner.live import ready_sizes
    from planner.online import LoopSettings, PlannerLoop
    from planner.pool_sizes import PoolSizes
    from planner.service import PlanModelSpec, build_oracle

    console = Console()
    model_error = ErrorConfig(max_error=args.max_model_error)
    redis_url = redis_connection_url(args, "planner")
    registry = Registry(redis_url, args.cluster)
    unmanaged = ready_sizes(await registry.workers()) if args.actuator == "local" else PoolSizes(0, 0)
    await registry.close()
    minimum = PoolSizes(max(args.min_prefill, unmanaged.prefill), max(args.min_decode, unmanaged.decode))
    topologies = args.topologies or (args.topology,)
    if "aggregated" in topologies and unmanaged.prefill:
        raise SystemExit(f"--topologies {','.join(topologies)}: an aggregated cluster has no prefill pool, and "
                         f"{unmanaged.prefill} prefill worker(s) here were started outside the planner, which the "
                         "local actuator never removes: start the cluster with `pdserve up --prefill 0` and let the "
                         "planner start its prefill workers (--min-prefill)")
    config = PlannerConfig(
        ttft_slo_s=args.ttft_slo_s, tpot_slo_s=args.tpot_slo_s, min_sizes=minimum,
        max_sizes=PoolSizes(max(args.max_prefill, minimum.prefill), max(args.max_decode, minimum.decode)),
        scale_up_cooldown_s=args.scale_up_cooldown_s, scale_down_cooldown_s=args.scale_down_cooldown_s,
        max_step_up=args.max_step_up, max_step_down=args.max_step_down,
        scale_down_headroom=args.scale_down_headroom, predictor=args.predictor,
        min_requests_for_guard=args.min_requests_for_guard, topologies=topologies,
        topology_cooldown_s=args.topology_cooldown_s)
    oracle = build_oracle(PlanModelSpec(args.profile, args.ttft_slo_s, args.tpot_slo_s, args.attainment_target,
                                        args.transport, args.sim_requests), config.max_sizes.total * args.worker_devices,
                          tuple(dict.fromkeys((*topologies, args.topology))), args.worker_devices)
    for line in oracle.fit.lines():
        console.print("  " + line, markup=False)
    actuator, cleanup = _actuator(args, unmanaged)
    settings = LoopSettings(args.cluster, args.interval_s, dry_run=args.dry_run, model_error=model_error,
                            topology=args.topology)
    if args.metrics_port:
        start_metrics_server(args.metrics_host, args.metrics_port)
    loop = PlannerLoop.connect(redis_url, settings, config, oracle, actuator)
    console.print(f"planner: cluster {args.cluster}, {args.actuator} actuator, bounds {config.min_sizes} .. "
                  f"{config.max_sizes}, every {args.interval_s:g} s (workers already running: {unmanaged})")
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    try:
        if args.once:
            _print_tick(console, await loop.tick())
        else:
            await loop.run(stop, lambda tick: _print_tick(console, tick))
    finally:
        await loop.close()
        await asyncio.to_thread(cleanup)
    return 0


def _print_tick(console, tick) -> None:
    from planner.online import MODEL_NOT_TRUSTED
    from planner.status import model_summary

    if tick.decision is None:
        console.print(f"[yellow]{tick.note}[/yellow]")
        return
    d, o = tick.decision, tick.observed
    tpot = f"{o.tpot_p90_s * 1e3:.1f}" if o.tpot_p90_s is not None else "-"
    ttft = f"{o.ttft_p90_s * 1e3:.0f}" if o.ttft_p90_s is not None else "-"
    verb = ("[bold green]scale[/bold green]" if tick.applied else "hold" if not d.changed
            else "would scale" if tick.note.startswith("dry run") else "[red]failed[/red]")
    console.print(f"{verb} {d.current} -> {d.target}  rate {o.arrival_rate_rps:.2f} req/s, p90 TTFT {ttft} ms, "
                  f"TPOT {tpot} ms, ready {o.ready}; " + "; ".join(d.reasons[1:] or d.reasons), markup=True)
    if MODEL_NOT_TRUSTED in tick.note:
        console.print("  " + tick.note, style="yellow", markup=False)
    if tick.model is not None:
        console.print("  " + model_summary(tick.model), markup=False)
    for error in tick.errors:
        console.print(f"[red]{error}[/red]")
