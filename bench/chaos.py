"""A chaos run: the conversation trace's lengths at a steady rate while workers, the router and
Redis are killed and KV transfers break. Run `--help`."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

from kv_transfer.faults import FAULTS_ENV
from launch.commands import ClusterSpec
from launch.local import LocalCluster
from loadgen.chaos import ACTIONS, ChaosEvent, ChaosReport, chaos_schedule, pick_victim
from loadgen.harness import SweepOutcome, WorkloadConfig, make_target, run_sweep
from loadgen.metrics import SLO
from loadgen.prompts import PromptSynthesizer
from loadgen.runner import RunConfig
from loadgen.sweep import SearchConfig
from loadgen.workload import azure_trace
from pdserve.client import Client, ServeError
from pdserve.engine import EngineSettings
from pdserve.retry import DEFAULT_RETRY_BUDGET_S
from pdserve.v1 import worker_pb2, worker_pb2_grpc

DESCRIPTION = """\
A disaggregated cluster (1 prefill + 2 decode workers, tcp transport) serves Poisson arrivals
with prompt and output lengths from the Azure conversation trace (clipped to the model), greedy,
for --duration-s, at --rate-rps, or with --knee-share at that share of the knee: first, on a
cluster of the same shape with no chaos and no faults, a goodput sweep (`pdserve load sweep`'s
search, --knee-probe-s per probed rate) finds the highest rate at which 90% of requests meet
--ttft-slo-ms and --tpot-slo-ms; that cluster is stopped and the chaos run starts on a new one.
Every --every-s one of: SIGKILL a decode worker, SIGTERM one, SIGKILL the prefill worker (each
replaced by a new worker, as a supervisor would; a kill that would leave its pool fewer than
--min-serving serving workers waits for the replacement to serve first), SIGKILL the router
(restarted on its ports after --down-s), SIGKILL Redis (restarted empty after --down-s); and KV
transfers break with --faults (kv_transfer.faults' text form). The SDK retries what the router
never answered for --client-retry-budget-s.

Reported: requests sent / completed / failed with a clean error / hung (no answer within
--request-timeout-s + 30 s), those in flight on a killed router, a sample (--check-every) compared
token for token with one colocated vLLM engine, KV blocks and leases left on the workers once the
run is idle, workers not back in the registry. Aims (issue 18): 0 hung, >= 99% completed of those
not in flight on a killed router, 0 wrong tokens, 0 leaked blocks and leases, every worker back.
Writes <out>/chaos.json and chaos.png (and knee.png with --knee-share). About --duration-s plus
two minutes, and with --knee-share up to --knee-max-probes x --knee-probe-s more.
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("models/tiny"), help="model folder (default %(default)s)")
    parser.add_argument("--rate-rps", type=float, default=2.0, help="offered requests per second (default %(default)s)")
    parser.add_argument("--knee-share", type=float, default=None,
                        help="offer this share of the measured knee rate instead of --rate-rps (issue 18: 0.7)")
    parser.add_argument("--ttft-slo-ms", type=float, default=2000.0, help="the knee's TTFT SLO (default %(default)s)")
    parser.add_argument("--tpot-slo-ms", type=float, default=100.0, help="the knee's TPOT SLO (default %(default)s)")
    parser.add_argument("--knee-probe-s", type=float, default=60.0, help="seconds of load per probed rate")
    parser.add_argument("--knee-start-rps", type=float, default=1.0, help="the knee search's first rate")
    parser.add_argument("--knee-max-probes", type=int, default=7, help="the knee search's most probes")
    parser.add_argument("--duration-s", type=float, default=600.0, help="length of the run (default %(default)s)")
    parser.add_argument("--every-s", type=float, default=30.0, help="seconds between chaos events (default %(default)s)")
    parser.add_argument("--down-s", type=float, default=2.0, help="how long the router or Redis stays dead")
    parser.add_argument("--faults", default="drop_connection_mid_block~0.02,flip_bytes~0.02,stall_reader~0.01,seed=7",
                        help="KV transfer faults (default %(default)s; '' for none)")
    parser.add_argument("--check-every", type=int, default=10, help="compare every Nth request with the reference")
    parser.add_argument("--max-prompt-tokens", type=int, default=1500)
    parser.add_argument("--max-output-tokens", type=int, default=128)
    parser.add_argument("--request-timeout-s", type=float, default=120.0)
    parser.add_argument("--client-retry-budget-s", type=float, default=DEFAULT_RETRY_BUDGET_S,
                        help="how long the SDK retries a call the router never answered (default: the SDK's, "
                             "%(default)s s; jittered waits of 0.25 s doubling to 2 s)")
    parser.add_argument("--client-retries", type=int, default=None,
                        help="a count limit on those retries as well (default: none, the budget alone)")
    parser.add_argument("--min-serving", type=int, default=1,
                        help="the disruption budget: a kill that would leave a pool fewer serving workers "
                             "waits for its replacement to serve first (default %(default)s; 0: kill at once)")
    parser.add_argument("--kv-cache-mb", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench/results/chaos"))
    return parser.parse_args(argv)


class Supervisor:
    """Carries out the chaos events on a LocalCluster and puts back what they broke.

    Worker kills keep a disruption budget (`loadgen.chaos.pick_victim`): a pool keeps at least
    `min_serving` serving workers. A victim whose loss would break that goes only once its
    replacement serves (a surge, in a thread of its own so the schedule goes on); any other victim
    goes at once and its replacement starts without being waited for (a supervisor restarts a
    crashed process and moves on: on a loaded 2-core host an engine takes minutes to start). An
    event with no candidate (every serving worker already doomed) is skipped and said so."""

    def __init__(self, cluster: LocalCluster, down_s: float, min_serving: int, rng: random.Random):
        self.cluster, self.down_s, self.min_serving, self.rng = cluster, down_s, min_serving, rng
        self.router_killed_at: list[float] = []
        self.skipped: list[str] = []
        self.surged: list[str] = []
        self._doomed: set[str] = set()
        self._lock = threading.Lock()

    def act(self, event: ChaosEvent) -> None:
        cluster = self.cluster
        if event.action in ("sigkill_decode", "sigterm_decode", "sigkill_prefill"):
            role = "prefill" if event.action == "sigkill_prefill" else "decode"
            with self._lock:
                serving = [w for w, child in list(cluster.workers.items()) if w.startswith(role) and child.is_ready()]
                victim = pick_victim(serving, self._doomed, self.min_serving, self.rng)
                if victim is not None:
                    self._doomed.add(victim.worker_id)
            if victim is None:
                self.skipped.append(event.action)
                print(f"  skipped {event.action}: every serving {role} worker is already going", flush=True)
                return
            if victim.surge:
                self.surged.append(event.action)
                print(f"  {event.action}: {victim.worker_id} goes once its replacement serves", flush=True)
                threading.Thread(target=self._surge_then_take, args=(event.action, role, victim.worker_id),
                                 daemon=True).start()
            else:
                self._take(event.action, victim.worker_id)
                cluster.add_worker(role, wait=False)        # the supervisor's replacement
        elif event.action == "kill_router":
            self.router_killed_at.append(time.monotonic())
            cluster.kill_router()
            time.sleep(self.down_s)
            cluster.start_router(wait_routed=False)         # replacements may still be starting
        elif event.action == "kill_redis":
            cluster.kill_redis()
            time.sleep(self.down_s)
            cluster.restart_redis()

    def _surge_then_take(self, action: str, role: str, worker_id: str) -> None:
        try:
            self.cluster.add_worker(role, wait=True, timeout_s=600.0)
        except (TimeoutError, RuntimeError) as error:
            print(f"  the surge replacement for {worker_id} did not serve: {str(error).splitlines()[0]}", flush=True)
        self._take(action, worker_id)

    def _take(self, action: str, worker_id: str) -> None:
        try:
            if action == "sigterm_decode":   # drains, exits
                threading.Thread(target=self.cluster.remove_worker, args=(worker_id,), daemon=True).start()
            else:
                self.cluster.kill_worker(worker_id)
        finally:
            with self._lock:
                self._doomed.discard(worker_id)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")   # the reference engine runs in this process
    engine = EngineSettings(model=str(args.model), block_size=32, max_model_len=2048,
                            kv_cache_bytes=args.kv_cache_mb << 20, max_num_seqs=32)
    vocab = json.loads((args.model / "config.json").read_text())["vocab_size"]
    log_dir = Path(tempfile.mkdtemp(prefix="pdserve-chaos-"))
    spec = ClusterSpec(engine=engine, num_prefill=1, num_decode=2, transport="tcp", ttl_s=3.0, lease_s=10.0,
                       cpu_cores={"prefill": "0", "decode": "1"}, log_dir=str(log_dir))
    knee = None
    if args.knee_share is not None:
        knee = _find_knee(args, replace(spec, log_dir=str(log_dir / "knee")), vocab)
        if not knee.search.goodput_rps > 0:
            print(f"no rate met the SLOs, so there is no knee to take a share of: {knee.error or knee.search.curve}")
            return 2
        for probe in sorted(knee.probes, key=lambda p: p.rate_rps):
            print(f"  {probe.rate_rps:6.3f} req/s: attainment {probe.summary['slo_attainment']:.0%}, TTFT p90 "
                  f"{probe.summary.get('p90_ttft_ms', float('nan')):.0f} ms, TPOT p90 "
                  f"{probe.summary.get('p90_tpot_ms', float('nan')):.1f} ms", flush=True)
        args.rate_rps = round(args.knee_share * knee.search.goodput_rps, 3)
        print(f"knee {knee.search.goodput_rps:.3f} req/s (bracketed: {knee.search.bracketed}); "
              f"the chaos run offers {args.knee_share:.0%} of it: {args.rate_rps} req/s", flush=True)
    if args.faults:
        os.environ[FAULTS_ENV] = args.faults            # inherited by every worker: test and chaos only
    rng = random.Random(args.seed)
    trace = azure_trace(max_prompt_tokens=args.max_prompt_tokens, max_output_tokens=args.max_output_tokens)
    num_requests = int(args.rate_rps * args.duration_s)
    arrivals, at_s = [], 0.0
    for _ in range(num_requests):
        at_s += rng.expovariate(args.rate_rps)
        arrivals.append(at_s)
    shapes = [rng.choice(trace) for _ in range(num_requests)]
    prompts = [[rng.randrange(10, vocab) for _ in range(s.prompt_tokens)] for s in shapes]
    events = chaos_schedule(args.duration_s, args.every_s, args.seed, ACTIONS, quiet_tail_s=min(30.0, args.every_s))
    report = ChaosReport(events=events)
    print(f"chaos: {num_requests} requests over {args.duration_s:.0f} s, {len(events)} events; logs in {log_dir}",
          flush=True)
    cluster = LocalCluster(spec).start()
    supervisor = Supervisor(cluster, args.down_s, args.min_serving, random.Random(args.seed + 1))
    results: list[dict] = [{} for _ in range(num_requests)]
    start = time.monotonic()

    def send(index: int) -> None:
        time.sleep(max(0.0, start + arrivals[index] - time.monotonic()))
        sent_at = time.monotonic()
        entry = results[index]
        entry.update(sent_at_s=sent_at - start, tokens=[])
        try:
            with Client(cluster.grpc_target, retry_budget_s=args.client_retry_budget_s,
                        retries=args.client_retries) as client:
                for chunk in client.generate(token_ids=prompts[index], max_tokens=shapes[index].output_tokens,
                                             temperature=0, ignore_eos=True, timeout_s=args.request_timeout_s):
                    entry["tokens"].extend(chunk.token_ids)
            entry["outcome"] = "completed" if len(entry["tokens"]) == shapes[index].output_tokens else "failed_clean"
        except ServeError as error:
            entry.update(outcome="failed_clean", error=f"{type(error).__name__}: {error}"[:200])
        entry["ended_at_s"] = time.monotonic() - start

    def chaos() -> None:
        for event in events:
            time.sleep(max(0.0, start + event.at_s - time.monotonic()))
            print(f"  {time.monotonic() - start:6.1f} s  {event.action}", flush=True)
            try:
                supervisor.act(event)
            except Exception as error:  # noqa: BLE001 - a failed recovery is a finding, reported
                print(f"  recovery after {event.action} failed: {error}", flush=True)

    try:
        chaos_thread = threading.Thread(target=chaos, daemon=True)
        chaos_thread.start()
        with ThreadPoolExecutor(max_workers=256) as pool:
            futures = [pool.submit(send, i) for i in range(num_requests)]
            deadline = start + args.duration_s + args.request_timeout_s + 30.0
            for index, future in enumerate(futures):
                try:
                    future.result(timeout=max(0.1, deadline - time.monotonic()))
                except TimeoutError:
                    results[index].setdefault("outcome", "hung")
                if (index + 1) % max(1, num_requests // 10) == 0:
                    print(f"  {index + 1}/{num_requests} answered", flush=True)
        chaos_thread.join(timeout=60)
        try:
            _settle(cluster, report)
        except Exception as error:  # noqa: BLE001 - the requests' outcomes are still reported
            report.settle_error = f"{type(error).__name__}: {str(error).splitlines()[0]}"
            print(f"  counting what was left failed: {report.settle_error}", flush=True)
    finally:
        cluster.stop()
    kills_s = [at - start for at in supervisor.router_killed_at]
    report.skipped, report.surged = supervisor.skipped, supervisor.surged
    for entry in results:
        report.record(entry.get("outcome", "hung"))
        report.in_flight_on_router_kill += entry.get("outcome") == "failed_clean" and any(
            entry["sent_at_s"] <= at_s <= entry.get("ended_at_s", at_s) for at_s in kills_s)
    _check_sample(args, engine, prompts, shapes, results, report)
    _write(args, report, results, knee)
    return 0 if not report.shortfalls() else 1


def _find_knee(args, spec: ClusterSpec, vocab: int) -> SweepOutcome:
    """The goodput under the SLO pair of a cluster like the chaos run's, with nothing broken."""
    print(f"the knee: a goodput sweep with no chaos, {args.knee_probe_s:.0f} s per probed rate", flush=True)
    workload = WorkloadConfig(kind="trace", arrival="poisson", num_requests=1,
                              max_prompt_tokens=args.max_prompt_tokens, max_output_tokens=args.max_output_tokens,
                              seed=args.seed)
    cluster = LocalCluster(spec).start()
    try:
        return run_sweep(lambda: make_target("pdserve", cluster.grpc_target), workload,
                         PromptSynthesizer(seed=args.seed, token_id_high=vocab),
                         RunConfig(duration_s=args.knee_probe_s, request_timeout_s=args.request_timeout_s),
                         SLO(ttft_s=args.ttft_slo_ms / 1000, tpot_s=args.tpot_slo_ms / 1000),
                         SearchConfig(start_rps=args.knee_start_rps, rel_tol=0.1, max_probes=args.knee_max_probes),
                         show=True)
    finally:
        cluster.stop()


def _settle(cluster: LocalCluster, report: ChaosReport, ready_within_s: float = 600.0) -> None:
    """Waits for every replacement to serve (up to `ready_within_s`; one that does not is missing)
    and for the cluster to go idle (leases expire), then counts what was left behind."""
    deadline = time.monotonic() + ready_within_s
    for worker_id, child in list(cluster.workers.items()):
        try:
            child.wait_ready(max(0.0, deadline - time.monotonic()))
        except (TimeoutError, RuntimeError) as error:
            print(f"  {worker_id} does not serve: {str(error).splitlines()[0]}", flush=True)
    deadline = time.monotonic() + 30.0
    while True:
        loads = {}
        for worker_id in [w for w, child in cluster.workers.items() if child.is_ready()]:
            with cluster.worker_channel(worker_id) as channel:
                loads[worker_id] = worker_pb2_grpc.WorkerStub(channel).GetLoad(worker_pb2.GetLoadRequest(), timeout=5)
        busy = sum(load.kv_blocks_used for load in loads.values()) + sum(load.pending_transfers for load in loads.values())
        if not busy or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    report.leaked_kv_blocks = sum(load.kv_blocks_used for load in loads.values())
    report.held_leases = sum(load.pending_transfers for load in loads.values() if load.role == "prefill")
    with Client(cluster.grpc_target) as client:
        info = client.model_info()
    report.workers_missing = len(cluster.workers) - info.num_prefill_workers - info.num_decode_workers


def _check_sample(args, engine: EngineSettings, prompts, shapes, results, report: ChaosReport) -> None:
    """One colocated vLLM engine answers every --check-every'th completed request, one at a time."""
    import asyncio

    from pdserve.engine import start_engine

    sample = [i for i, entry in enumerate(results) if entry.get("outcome") == "completed"][::args.check_every]

    async def answers() -> list[list[int]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        reference = start_engine(engine, "colocated")
        out = []
        for i in sample:
            final = None
            async for final in reference.generate(TokensPrompt(prompt_token_ids=prompts[i]), SamplingParams(
                    max_tokens=shapes[i].output_tokens, temperature=0.0, ignore_eos=True), f"ref-{i}"):
                pass
            out.append(list(final.outputs[0].token_ids))
        reference.shutdown()
        return out

    expected = asyncio.run(answers())
    report.checked = len(sample)
    report.wrong = sum(results[i]["tokens"] != tokens for i, tokens in zip(sample, expected))


def _write(args, report: ChaosReport, results: list[dict], knee: SweepOutcome | None) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"command": " ".join(sys.argv), "rate_rps": args.rate_rps, "knee": None if knee is None else {
                   "rate_rps": knee.search.goodput_rps, "bracketed": knee.search.bracketed, "share": args.knee_share,
                   "ttft_slo_ms": args.ttft_slo_ms, "tpot_slo_ms": args.tpot_slo_ms, "probe_s": args.knee_probe_s,
                   "probes": [{"rate_rps": p.rate_rps, "attainment": p.summary["slo_attainment"],
                               "ttft_p90_ms": p.summary.get("p90_ttft_ms"), "tpot_p90_ms": p.summary.get("p90_tpot_ms"),
                               "completed": p.summary.get("completed")} for p in knee.probes],
                   "error": knee.error},
               "sent": report.sent, **{k: report.outcomes[k] for k in
               ("completed", "failed_clean", "hung")}, "in_flight_on_router_kill": report.in_flight_on_router_kill,
               "completed_share": report.completed_share, "checked": report.checked, "wrong": report.wrong,
               "leaked_kv_blocks": report.leaked_kv_blocks, "held_leases": report.held_leases,
               "workers_missing": report.workers_missing, "events": [asdict(e) for e in report.events],
               "events_skipped": report.skipped, "events_surged": report.surged, "min_serving": args.min_serving, "settle_error": report.settle_error,
               "shortfalls": report.shortfalls(),
               "errors": Counter(e["error"].split(":")[0] + ":" + e["error"].split(":", 1)[1][:80]
                                 for e in results if "error" in e).most_common()}
    (args.out / "chaos.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "events"}, indent=1))
    _plot(args.out / "chaos.png", report, results)
    if knee is not None:
        from loadgen.plots import plot_attainment

        plot_attainment({"1P+2D tcp, no chaos": knee.search.curve}, args.out / "knee.png",
                        goodputs_rps={"1P+2D tcp, no chaos": knee.search.goodput_rps},
                        title=f"the knee: attainment of TTFT {args.ttft_slo_ms:.0f} ms and TPOT "
                              f"{args.tpot_slo_ms:.0f} ms against offered rate")


def _plot(path: Path, report: ChaosReport, results: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(10, 3.5))
    for outcome, color in (("completed", "tab:green"), ("failed_clean", "tab:orange"), ("hung", "tab:red")):
        points = [(e["sent_at_s"], e.get("ended_at_s", e["sent_at_s"]) - e["sent_at_s"]) for e in results
                  if e.get("outcome", "hung") == outcome and "sent_at_s" in e]
        if points:
            axis.scatter(*zip(*points), s=6, color=color, label=f"{outcome} ({len(points)})")
    for event in report.events:
        axis.axvline(event.at_s, color="grey", lw=0.6, ls="--")
        axis.text(event.at_s, axis.get_ylim()[1] * 0.95, event.action, rotation=90, fontsize=6, va="top")
    axis.set_xlabel("sent at (s)")
    axis.set_ylabel("latency (s)")
    axis.set_title("chaos run: each request by when it was sent; dashed lines: chaos events")
    axis.legend(loc="upper right", fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
