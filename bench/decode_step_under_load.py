"""Why a loaded cluster's decode steps outlast the profile's: the same steps traced alone, beside a
busy neighbour core, and under the validation's loads, in one run. Run `--help`."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DESCRIPTION = """\
On the Zen 4 EPYC the decode worker's traced steps under the validation's loads took 1.5-2.4x the
engine table's step at every batch, one sequence included (BENCHMARKS, "What a long prompt costs
the workers' cores"), where the profile's batched runs through the cluster matched the table. This
runs one 1P+1D cluster (prefill and the router on core 0, decode on core 1, --transport, default
shm) with its engines' steps traced (pdserve.engine_step_trace) through phases, in --rounds rounds:

  lone          one request at a time: a --lone-prompt-token prompt, --lone-output tokens out,
                --lone-requests of them (the decode engine steps at one sequence, core 0 idle)
  lone-long     the same with --lone-long-prompt-token prompts (long contexts, core 0 idle)
  lone+matmul   the lone requests while a process bound to core 0 multiplies bfloat16 matrices
                (what the prefill engine's prompts do to the core, with no pdserve traffic)
  lone+spin     the same while a process bound to core 0 spins in Python (a busy core, no vector unit)
  <shape>@<r>   each --load: a validation shape (planner.validation_shapes) at r req/s, Poisson
                or gamma as the shape says, for --load-requests requests
  batch<n>      each --batch: n lone requests sent together, twice (the profile's batched runs:
                n streams that start and end together, no request joining on the way)
  closed:<shape>:<n>
                each --closed SHAPE:N: the shape's lengths kept n in flight (a closed loop: the
                batch held at about n while requests end and join, --load-requests of them; n 1:
                one request after another, no prompt beside a decode)

and, with --engine-phases, one engine of the same settings alone on core 1, started from this
process (no cluster traffic; the cluster stays up, idle), one request at a time as in lone:

  engine-apart   as the profile measures its engine tables: this process unbound while the engine
                 starts (the engine core's own threads float), then its front end on core 0
  engine-beside  as a worker runs it: this process on core 1 from the start, front end included
  engine-worker  engine-beside with what a decode worker adds: pdserve's KV connector (a consumer
                 that pulls nothing) and the worker's stat loggers (vLLM then keeps stats every step)
  engine-apart-long, engine-beside-long
                 engine-apart and engine-beside with the lone-long requests' prompts: whether what a
                 front end on the engine's core adds to a step grows with the context

and reads, for each phase, the decode worker's steps that ran only decodes by batch, with a join
and without, against the --profile's engine step for the same batch and context
(planner.validation_steps), and the steps a prefill step covered throughout against those it
left alone (corun_by_batch). A step that runs as long with the prefill engine idle as beside its
prompts is slowed by its own process; one long only beside them by the neighbour core. Keeps the traces (steps/, phases.json) and writes summary.json and a PNG.
About 4 minutes a round on the tiny model.
"""

@dataclass(frozen=True)
class Phase:
    name: str
    start_s: float
    end_s: float
    decode_cores: dict = dataclasses.field(default_factory=dict)   # process/thread name -> cores (`thread_cores`)
    core_busy: dict = dataclasses.field(default_factory=dict)      # core -> busy share, every process's


def thread_cpu_s(root_pid: int) -> dict[str, float]:
    """CPU seconds so far of `root_pid`'s tree by process and thread name ("<process>/<thread>"; a
    name many threads share sums them)."""
    from loadgen.proc_cpu import threads_cpu_s

    by: dict[str, float] = {}
    processes: dict[int, str | None] = {}   # each process's name, read once
    for pid, _, comm, cpu_s in threads_cpu_s(root_pid):
        if pid not in processes:
            try:
                processes[pid] = Path(f"/proc/{pid}/comm").read_text().strip()
            except (FileNotFoundError, ProcessLookupError):
                processes[pid] = None   # it has exited
        if processes[pid] is not None:
            by[f"{processes[pid]}/{comm}"] = by.get(f"{processes[pid]}/{comm}", 0.0) + cpu_s
    return by


def thread_cores(before: dict[str, float], after: dict[str, float], wall_s: float, floor: float = 0.005) -> dict:
    """Each name's CPU from `before` to `after` over `wall_s`, in cores, those under `floor` left
    out. Pure."""
    cores = {name: (cpu_s - before.get(name, 0.0)) / wall_s for name, cpu_s in after.items()}
    return {name: round(c, 4) for name, c in sorted(cores.items(), key=lambda kv: -kv[1]) if c >= floor}


BURNERS = {
    "matmul": ("import torch, time\ntorch.set_num_threads(1)\n"
               "a = torch.randn(768, 768, dtype=torch.bfloat16)\n"
               "end = time.monotonic() + {seconds}\n"
               "while time.monotonic() < end:\n    a @ a\n"),
    "spin": ("import time\nend = time.monotonic() + {seconds}\nx = 0\n"
             "while time.monotonic() < end:\n    x += 1\n"),
}


def start_burner(kind: str, core: int, seconds: float) -> subprocess.Popen:
    """A process bound to `core` that keeps it busy for `seconds` (`BURNERS[kind]`)."""
    code = BURNERS[kind].format(seconds=seconds)
    return subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{core}}})\n{code}"])


async def send(target: str, specs, seed: int, config=None) -> int:
    from loadgen.harness import make_target, run_all_ok
    from loadgen.prompts import PromptSynthesizer

    result = await run_all_ok(make_target("pdserve", target), specs, PromptSynthesizer(seed=seed, token_id_high=250),
                              config)
    return len(result.records)


def lone_specs(args, prompt_tokens: int):
    from loadgen.harness import WorkloadConfig

    return WorkloadConfig(kind="random", arrival="poisson", rate_rps=1000.0, num_requests=1,
                          prompt_mean=prompt_tokens, output_mean=args.lone_output, range_ratio=0.0,
                          seed=7).build()


LONE_PHASES = ("lone", "lone-long", "lone+matmul", "lone+spin")
ENGINE_PHASES = ("engine-apart", "engine-beside", "engine-worker", "engine-apart-long", "engine-beside-long")
WORKER_ENGINE_ID = "bisect-worker"   # engine-worker's trace; the other engine phases' are vLLM's "engine"


def phase_order(round_index: int, loads: list[tuple[str, float]], engine_phases: bool = False,
                only: tuple[str, ...] = (), batches: tuple[int, ...] = (), closed: tuple[str, ...] = ()) -> list[str]:
    """The phases of round `round_index` (from 0): the lone ones, the engine ones (`engine_phases`),
    each of `batches` as batch<n> and of `closed` (SHAPE:N) as closed:SHAPE:N, then each load as SHAPE@RATE, those
    named in `only` alone where it names any; every other round in reverse (ABBA: a drift of the
    host lands on every phase alike)."""
    names = [*LONE_PHASES, *(ENGINE_PHASES if engine_phases else ()), *(f"batch{n}" for n in batches),
             *(f"closed:{c}" for c in closed), *(f"{shape}@{rate:g}" for shape, rate in loads)]
    names = [name for name in names if not only or name in only]
    return names[::-1] if round_index % 2 else names


def trace_id(phase: str, worker_ids: dict[str, str]) -> str:
    """Whose trace holds `phase`'s decode steps: the cluster's decode worker, or the engine phase's."""
    if phase == "engine-worker":
        return WORKER_ENGINE_ID
    return "engine" if phase in ENGINE_PHASES else worker_ids["decode"]


async def engine_phase(args, name: str, trace_dir: Path) -> Phase:
    """`name` (one of ENGINE_PHASES): an engine on core 1 started from this process, --lone-requests
    lone requests through it after a warm-up, then shut down; this process's cores restored."""
    import secrets

    from kv_transfer.config import ConnectorConfig
    from pdserve.engine import EngineSettings, start_engine
    from pdserve.engine_step_trace import STEP_TRACE_ENV
    from pdserve.worker.load import EngineLoad, engine_stat_loggers
    from planner.profiler.engine_probe import EngineProbe

    settings = EngineSettings(model=args.model, block_size=32, max_model_len=args.max_model_len,
                              kv_cache_bytes=args.kv_cache_mb << 20, enable_prefix_caching=False, cpu_cores="1")
    cores = os.sched_getaffinity(0)
    os.environ[STEP_TRACE_ENV] = str(trace_dir)
    try:
        apart = name.startswith("engine-apart")
        if not apart:
            os.sched_setaffinity(0, {1})
        if name == "engine-worker":
            connector = ConnectorConfig(transport=args.transport, model=Path(args.model).name,
                                        grant_token=secrets.token_hex(16), worker_id=WORKER_ENGINE_ID)
            engine = start_engine(settings, "decode", connector, engine_id=WORKER_ENGINE_ID,
                                  stat_loggers=engine_stat_loggers(EngineLoad()))
        else:
            engine = start_engine(settings, "colocated")
        os.sched_setaffinity(0, {0} if apart else {1})
        try:
            probe = EngineProbe(engine, int(engine.vllm_config.model_config.get_vocab_size()), seed=3)
            await probe.warm_up()
            start_s = time.monotonic()
            prompt = args.lone_long_prompt if name.endswith("-long") else args.lone_prompt
            for _ in range(args.lone_requests):
                await probe.run(prompt, args.lone_output)
            return Phase(name, start_s, time.monotonic())
        finally:
            engine.shutdown()
    finally:
        os.environ.pop(STEP_TRACE_ENV, None)
        os.sched_setaffinity(0, cores)


def load_arg(text: str) -> tuple[str, float]:
    shape, _, rate = text.partition("@")
    if not rate:
        raise argparse.ArgumentTypeError(f"--load {text!r}: expected SHAPE@RATE, e.g. long-short@1.6")
    return shape, float(rate)


def closed_arg(text: str) -> tuple[str, int]:
    shape, _, in_flight = text.partition(":")
    if not in_flight.isdigit() or int(in_flight) < 1:
        raise argparse.ArgumentTypeError(f"--closed {text!r}: expected SHAPE:N with N >= 1, e.g. long-short:2")
    return shape, int(in_flight)


def measure(args, trace_dir: Path) -> tuple[list[Phase], dict[str, str]]:
    """The phases run (monotonic windows) and the workers' ids by role."""
    from launch.local import ClusterSpec, LocalCluster
    from loadgen.proc_cpu import core_busy_shares, per_core_ticks
    from loadgen.runner import RunConfig
    from pdserve.engine import EngineSettings
    from pdserve.engine_step_trace import STEP_TRACE_ENV
    from planner.validation_shapes import validation_shapes

    engine = EngineSettings(model=args.model, block_size=32, max_model_len=args.max_model_len,
                            kv_cache_bytes=args.kv_cache_mb << 20, enable_prefix_caching=False)
    spec = ClusterSpec(engine=engine, transport=args.transport, cpu_cores={"prefill": "0", "decode": "1"},
                       log_dir=tempfile.mkdtemp(prefix="pdserve-decode-under-load-"))
    shapes = validation_shapes(args.max_model_len)
    phases: list[Phase] = []
    os.environ[STEP_TRACE_ENV] = str(trace_dir)
    try:
        cluster = LocalCluster(spec)
        cluster.start()
    finally:
        os.environ.pop(STEP_TRACE_ENV, None)
    try:
        worker_ids = {role: cluster.worker_ids(role)[0] for role in ("prefill", "decode")}
        target = cluster.grpc_target
        asyncio.run(send(target, lone_specs(args, args.lone_prompt) * 4, seed=1))   # warm
        decode_pid = cluster.workers[worker_ids["decode"]].pid
        for round_index in range(args.rounds):
            for name in phase_order(round_index, args.load, args.engine_phases, tuple(args.only),
                                    tuple(args.batch), tuple(args.closed)):
                start_s = time.monotonic()
                if name in ENGINE_PHASES:
                    time.sleep(1.0)   # the cluster's engines past their spin
                    phase = asyncio.run(engine_phase(args, name, trace_dir))
                    phases.append(phase)
                    print(f"round {round_index + 1}: {name}, {args.lone_requests} requests in "
                          f"{phase.end_s - phase.start_s:.0f} s", flush=True)
                    time.sleep(1.0)
                    continue
                threads_before, busy_before = thread_cpu_s(decode_pid), per_core_ticks(Path("/proc/stat").read_text())
                if name.startswith("lone"):
                    burner = (start_burner(name.partition("+")[2], 0, 3600) if "+" in name else None)
                    try:
                        time.sleep(0.5 if burner else 0.0)
                        start_s = time.monotonic()
                        for i in range(args.lone_requests):
                            prompt = args.lone_long_prompt if name == "lone-long" else args.lone_prompt
                            asyncio.run(send(target, lone_specs(args, prompt), seed=10 + i))
                    finally:
                        if burner:
                            burner.kill()
                            burner.wait()
                    sent = args.lone_requests
                elif name.startswith("batch"):
                    together = lone_specs(args, args.lone_prompt) * int(name.removeprefix("batch"))
                    sent = sum(asyncio.run(send(target, together, seed=20 + i)) for i in range(2))
                elif name.startswith("closed:"):
                    shape_name, in_flight = closed_arg(name.removeprefix("closed:"))
                    specs = shapes[shape_name].workload.build(rate_rps=1.0, num_requests=args.load_requests)
                    config = RunConfig(mode="concurrency", max_concurrency=in_flight)
                    sent = asyncio.run(send(target, specs, seed=200 + round_index, config=config))
                else:
                    shape_name, rate = name.split("@")
                    specs = shapes[shape_name].workload.build(rate_rps=float(rate), num_requests=args.load_requests)
                    sent = asyncio.run(send(target, specs, seed=100 + round_index))
                end_s = time.monotonic()
                busy = core_busy_shares(busy_before, per_core_ticks(Path("/proc/stat").read_text()))
                phases.append(Phase(name, start_s, end_s, thread_cores(threads_before, thread_cpu_s(decode_pid),
                                                                       end_s - start_s),
                                    {core: round(share, 4) for core, share in busy.items()}))
                print(f"round {round_index + 1}: {name}, {sent} requests in {end_s - start_s:.0f} s", flush=True)
                time.sleep(1.0)
    finally:
        cluster.stop()
    return phases, worker_ids


def analyse(trace_dir: Path, worker_ids: dict[str, str], phases: list[Phase], profile_path: str | None) -> list[dict]:
    """Per phase, the decode worker's steps by batch against the profile's engine step
    (`planner.validation_steps.decode_worker_summary`; with no profile the model's step is 0) and
    the co-run rows (`corun_by_batch`: steps a prefill step covered against steps it left alone)."""
    from pdserve.engine_step_trace import engine_steps
    from planner.validation_steps import corun_by_batch, decode_worker_summary

    traces = {who: engine_steps(trace_dir, who)
              for who in {trace_id(phase.name, worker_ids) for phase in phases} | {worker_ids["prefill"]}}
    prefill = traces[worker_ids["prefill"]]
    if profile_path:
        from planner.profile import load_profile
        from planner.validation_step_report import model_and_served

        model, served = model_and_served(load_profile(profile_path))
        model_step_s = model.decode_step_s
    else:
        model_step_s, served = (lambda batch, context: 0.0), (lambda batch: 0.0)
    report = []
    for phase in phases:
        inside = lambda steps: [s for s in steps if phase.start_s <= s.start_s < phase.end_s]  # noqa: E731
        decode = traces[trace_id(phase.name, worker_ids)]
        summary = decode_worker_summary(decode, phase.start_s, phase.end_s, model_step_s, served)
        corun = [dataclasses.asdict(row) for row in corun_by_batch(inside(decode), inside(prefill), min_steps=10)]
        report.append({"phase": phase.name, "start_s": phase.start_s, "end_s": phase.end_s, **summary,
                       "corun": corun, "decode_cores": phase.decode_cores, "core_busy": phase.core_busy})
    return report


def pooled(report: list[dict]) -> list[dict]:
    """The phases' rows pooled over rounds: per phase name, batch bucket and join, the steps'
    mean step and model ms weighted by steps."""
    totals: dict[tuple, list[float]] = {}
    for phase in report:
        for row in phase["rows"]:
            key = (phase["phase"], row["batch"], row["joins"])
            t = totals.setdefault(key, [0, 0.0, 0.0])
            t[0] += row["steps"]
            t[1] += row["steps"] * row["step_ms"]
            t[2] += row["steps"] * (row["model_ms"] or 0.0)
    return [{"phase": k[0], "batch": k[1], "joins": k[2], "steps": n, "step_ms": round(step / n, 3),
             "model_ms": round(model / n, 3)} for k, (n, step, model) in totals.items() if n]


def table(rows: list[dict]) -> str:
    lines = ["| phase | batch | steps | step ms | model ms | step / model |", "|---|---|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["phase"], r["joins"], r["batch"])):
        ratio = f"{r['step_ms'] / r['model_ms']:.2f}" if r["model_ms"] else ""
        lines.append(f"| {r['phase']} | {r['batch']}{' (join)' if r['joins'] else ''} | {r['steps']} | "
                     f"{r['step_ms']:.2f} | {r['model_ms']:.2f} | {ratio} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steady = [r for r in rows if not r["joins"]]
    phases = list(dict.fromkeys(r["phase"] for r in steady))
    buckets = list(dict.fromkeys(r["batch"] for r in sorted(steady, key=lambda r: int(r["batch"].rstrip("+").split("-")[0]))))
    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.8 / max(1, len(phases))
    for i, phase in enumerate(phases):
        by = {r["batch"]: r for r in steady if r["phase"] == phase}
        xs = [j + (i - len(phases) / 2) * width for j, b in enumerate(buckets) if b in by]
        ys = [by[b]["step_ms"] / by[b]["model_ms"] if by[b]["model_ms"] else by[b]["step_ms"]
              for b in buckets if b in by]
        ax.bar(xs, ys, width, label=phase)
    ax.set_xticks(range(len(buckets)), buckets)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xlabel("decode batch (sequences)")
    ax.set_ylabel("traced step / profile's engine step" if any(r["model_ms"] for r in steady) else "traced step (ms)")
    ax.set_title("decode worker's steps without a join, by phase")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(REPO / "models" / "tiny"), help="model folder (pdserve make-model)")
    parser.add_argument("--lone-prompt", type=int, default=128, help="the lone requests' prompt tokens (128)")
    parser.add_argument("--lone-long-prompt", type=int, default=1433,
                        help="the lone-long requests' prompt tokens (1433, long-short's mean)")
    parser.add_argument("--lone-output", type=int, default=200, help="the lone requests' output tokens (200)")
    parser.add_argument("--lone-requests", type=int, default=3, help="lone requests a phase, one at a time (3)")
    parser.add_argument("--load", type=load_arg, action="append", default=None,
                        help="a validation shape at a rate, SHAPE@REQ_PER_S (repeatable; default "
                             "long-short@1.6 and short-long@2)")
    parser.add_argument("--load-requests", type=int, default=60, help="requests a load phase (60)")
    parser.add_argument("--batch", type=int, action="append", default=[], metavar="N",
                        help="a batch<N> phase: N lone requests sent together (repeatable)")
    parser.add_argument("--closed", action="append", default=[], metavar="SHAPE:N",
                        help="a closed:SHAPE:N phase: the validation shape's requests kept N in flight "
                             "(repeatable), e.g. long-short:1")
    parser.add_argument("--engine-phases", action="store_true",
                        help="also the engine phases (engine-apart, engine-beside, engine-worker and the "
                             "-long ones: see above)")
    parser.add_argument("--only", action="append", default=[], metavar="PHASE",
                        help="run only this phase (repeatable; a load as SHAPE@RATE), e.g. --only lone "
                             "--only lone-long --only engine-apart")
    parser.add_argument("--no-loads", action="store_true", help="no load phases (the lone and engine ones only)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds; the phases' order flips each round (2)")
    parser.add_argument("--transport", default="shm", help="the cluster's KV transport (shm)")
    parser.add_argument("--kv-cache-mb", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--out", required=True, help="folder for summary.json and decode_steps.png")
    parser.add_argument("--analyse", action="store_true",
                        help="run nothing: read --out's kept traces (steps/, phases.json) again, e.g. with another --profile")
    parser.add_argument("--profile", help="a profile of this host (pdserve profile): each step set against its engine step")
    args = parser.parse_args(argv)
    args.load = [] if args.no_loads else (args.load or [("long-short", 1.6), ("short-long", 2.0)])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    trace_dir, ran = out / "steps", out / "phases.json"
    if not args.analyse:
        trace_dir.mkdir(exist_ok=True)
        phases, worker_ids = measure(args, trace_dir)
        ran.write_text(json.dumps({"phases": [vars(p) for p in phases], "worker_ids": worker_ids}, indent=1))
    kept = json.loads(ran.read_text())
    phases, worker_ids = [Phase(**p) for p in kept["phases"]], kept["worker_ids"]
    report = analyse(trace_dir, worker_ids, phases, args.profile)
    rows = pooled(report)
    (out / "summary.json").write_text(json.dumps(
        {"command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
         "pooled": rows, "phases": report}, indent=1))
    print(table(rows))
    for phase in report:
        for row in phase["corun"]:
            print(f"{phase['phase']} {phase['start_s']:.0f}: batch {row['batch']}: beside a prompt "
                  f"{1e3 * row['beside_s']:.2f} ms ({row['beside_steps']}), prefill idle {1e3 * row['alone_s']:.2f} ms "
                  f"({row['alone_steps']})")
    for phase in report:
        if phase["decode_cores"]:
            top = ", ".join(f"{name} {cores:.2f}" for name, cores in list(phase["decode_cores"].items())[:6])
            print(f"{phase['phase']} {phase['start_s']:.0f}: cores busy {phase['core_busy']}; the decode worker's: {top}")
    plot(rows, out / "decode_steps.png")
    print(f"wrote {out / 'summary.json'} and {out / 'decode_steps.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
