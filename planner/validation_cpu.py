"""The CPU a validation's processes used, by process, against what the profile charges the same traffic.

The simulator's host model (`planner.simulator.host`) charges the router and the client (the
processes bound to no worker) CPU per request, per prompt token, per token streamed and per
decode step that streams, from the profile's serving probe (`ServingCosts.router_cpu_s_per_*`, and
`host_cpu_s_per_*` for both together). Where that is wrong the simulated prefill core, which a
bound router shares, fills up early: on a Zen 4 EPYC the tiny model's short-long shape at 5.6 req/s
had its simulated prompt steps 5.2x their engine time where the traced ones took 1.5x. Each rate
of `bench/validate_planner.py` reads every process's CPU (`validation_runs.cpu_by_process_s`) and
sets the router's and the client's against the profile's charge for the traffic the rate carried
(`charged_unbound_cores`), and each worker's cores' busy load against its own processes' (`core_loads`):
the rest there is the others' (the router, the client), where the host model says whether they
ran. Pure: plain values in and out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from planner.serving_costs import ServingCosts

PROCESS_GROUPS = ("router", "client", "prefill", "decode")   # a cluster's processes, as `cpu_by_process_s` groups them


@dataclass(frozen=True)
class Traffic:
    """What a rate carried over `seconds`: requests, their prompt tokens, the tokens streamed, and
    the decode steps that streamed them (0 where not traced: the per-step term is then left out)."""

    seconds: float
    requests: int
    prompt_tokens: int
    tokens: int
    decode_steps: int = 0


def traffic_of(records: Sequence, seconds: float, engine_steps: Mapping | None = None) -> Traffic:
    """The `Traffic` of a run's records (loadgen's: `ok`, `prompt_tokens`, `output_tokens`) over
    `seconds`, its decode steps from the run's traced engine steps where kept (`engine_steps`'s
    "workers", each with its "steps")."""
    ok = [r for r in records if r.ok]
    steps = sum(w.get("steps", 0) for w in (engine_steps or {}).get("workers", {}).values())
    return Traffic(seconds, len(ok), sum(r.prompt_tokens for r in ok), sum(r.output_tokens for r in ok), steps)


def charged_unbound_cores(serving: ServingCosts, traffic: Traffic) -> dict[str, float]:
    """The router's and the client's load in cores that the profile's terms put on `traffic`, as the
    simulator charges it (`HostCpu.request_moved` and `tokens_emitted`): the router's own terms, and
    the host's less the router's for the client."""
    def load(per_request: float, per_prompt_token: float, per_token: float, per_step: float) -> float:
        cpu_s = (per_request * traffic.requests + per_prompt_token * traffic.prompt_tokens
                 + per_token * traffic.tokens + per_step * traffic.decode_steps)
        return cpu_s / traffic.seconds

    router = load(serving.router_cpu_s_per_request, serving.router_cpu_s_per_prompt_token,
                  serving.router_cpu_s_per_token, serving.router_cpu_s_per_step)
    host = load(serving.host_cpu_s_per_request, serving.host_cpu_s_per_prompt_token,
                serving.host_cpu_s_per_token, serving.host_cpu_s_per_step)
    return {"router": router, "client": max(0.0, host - router)}


def unbound_cpu_check(measured_cores: Mapping[str, float], serving: ServingCosts, traffic: Traffic) -> dict:
    """Each unbound group's measured load (cores) beside the profile's charge, and the measured CPU
    per streamed token (us: the whole load over the tokens, the per-request part included)."""
    charged = charged_unbound_cores(serving, traffic)
    rows = {}
    for group in ("router", "client"):
        if group not in measured_cores:
            continue
        rows[group] = {"measured_cores": round(measured_cores[group], 4), "charged_cores": round(charged[group], 4),
                       "measured_us_per_token": round(measured_cores[group] * traffic.seconds / traffic.tokens * 1e6, 1)
                       if traffic.tokens else None}
    return rows


def check_line(rate_rps: float, check: Mapping[str, Mapping[str, float]]) -> str:
    """One printed line: each group's measured and charged cores and their ratio."""
    parts = []
    for group, row in check.items():
        ratio = row["charged_cores"] / row["measured_cores"] if row["measured_cores"] > 0 else float("inf")
        per_token = f", {row['measured_us_per_token']:.0f} us a token" if row.get("measured_us_per_token") else ""
        parts.append(f"{group} {row['measured_cores']:.2f} cores (the profile charges {row['charged_cores']:.2f}, "
                     f"{ratio:.2f}x{per_token})")
    return f"{rate_rps:g} req/s, unbound CPU: " + "; ".join(parts)


@dataclass(frozen=True)
class CoreLoad:
    """One worker's cores over a rate, in cores: how busy they were (`busy`: everything the guest
    ran there) and how much of it was the worker's own processes (`own`: its API process, its
    engine core, their threads, bound to those cores); the rest is the others' (the router, a
    client, a worker that floats), which the simulator's host model places (`planner.simulator.host`)."""

    worker: str
    cores: tuple[int, ...]
    busy: float
    own: float

    @property
    def others(self) -> float:
        """The others' load on these cores; never below 0 (the two readings are a tick apart)."""
        return max(0.0, self.busy - self.own)


def core_loads(busy_by_core: Mapping[int, float], worker_cores: Mapping[str, Sequence[int]],
               own_by_worker: Mapping[str, float]) -> list[CoreLoad]:
    """Each worker's `CoreLoad` from each core's busy load (cores, `loadgen.proc_cpu.core_busy_s`
    over the rate), the cores it is bound to, and its own processes' load (cores); a worker bound to
    a core another worker shares, or to none measured, is left out: its cores' load is not its own."""
    counts: dict[int, int] = {}
    for cores in worker_cores.values():
        for core in cores:
            counts[core] = counts.get(core, 0) + 1
    rows = []
    for worker, cores in sorted(worker_cores.items()):
        chosen = tuple(sorted(cores))
        if not chosen or worker not in own_by_worker or any(counts[c] > 1 or c not in busy_by_core for c in chosen):
            continue
        rows.append(CoreLoad(worker, chosen, sum(busy_by_core[c] for c in chosen), own_by_worker[worker]))
    return rows


def core_line(rate_rps: float, loads: Sequence[CoreLoad]) -> str:
    """One printed line: each worker's cores, busy, its own and the others' load."""
    parts = [f"{row.worker}'s core{'s' if len(row.cores) > 1 else ''} {','.join(map(str, row.cores))} "
             f"{row.busy:.2f} busy: its own {row.own:.2f}, others {row.others:.2f}" for row in loads]
    return f"{rate_rps:g} req/s, the workers' cores: " + "; ".join(parts)
