"""What serving adds around the engines (`ServingCosts`), the `serving` (and `vllm_server`) section
of a profile: measured by `pdserve profile --through cluster` (`planner.profiler.serving_probe`),
charged by the simulator around the engine's own step times."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Sequence

from planner.profile_checks import require


@dataclass(frozen=True)
class ServingCosts:
    """What serving adds around the engines, measured through a real 1P+1D cluster
    (`pdserve profile --through cluster`); all zero in an engine-only profile.

    Latencies, which hold no engine:
    - `first_token_s`: added to every request's first token: the router, the gRPC hops and the
      prefill worker's API process, the prompt in and the token back;
    - `handoff_s`: from the prefill engine's first token until the decode engine has the request
      (the router's Decode RPC, the decode worker's API process), on top of the KV transfer: the
      Decode call's way in, traced on lone requests (`planner.validation_joins.hop_in_s`);
    - `idle_join_s`: what a request handed to an idle decode engine takes beyond the pull and the
      join step the simulator charges (the engine core woken from its socket, its idle loop's
      steps around the pull: a lone request's first gap less the way in and the simulator's own
      pull and step); 0 in a profile measured before it was traced apart, whose `handoff_s`
      holds it.
    Decode steps as served, measured on batches decoding together: what the worker's engine core
    and API process, on the model runner's core, add to the engine's step (`decode_serving_s`):
    - `decode_step_s` + `decode_cpu_s_per_token` x batch: a line fitted on batched runs (per step,
      a wake-up for the step's outputs; per token of the batch, each stream's message): what the
      simulator charges by default, the router's linear cost model (`planner.simulator.cost`)
      takes, and a lone handoff (`handoff_s`) was netted of at batch 1;
    - `served_step_extra_s`: the same runs at each batch measured, (batch, seconds over the
      engine's step), the median of that batch's runs net of the host's stretch
      (`stream_fit.served_extra_by_batch`), which the simulator interpolates with
      `SimSettings.served_step` "table"; () in a profile measured before it was kept. The extra is
      not a line (BENCHMARKS, "The served step by batch"): a fixed part at batches 1-4, then rising
      faster than the batch as the router's core fills; on an AMX Xeon a line through it missed the
      tiny model's runs by -10..+31% (the table by 4%), the bench model's, whose engine steps are
      ten times longer, by 2.5% (the table too). Charged in a loaded cluster, the line's excess at
      mid batches stood in for a slowdown the idle runs do not see, and the table did not predict
      the validations better (same section): the line stays the default.
    CPU on a worker's own cores, which stretches that worker's engine steps:
    - `decode_cpu_s_per_request`: the decode worker's API process per request (its Decode RPC,
      admission) and its KV connector's pull threads (the exchange with the producer, the copy,
      the checksums), which run in its engine's process;
    - `prefill_cpu_s_per_request`: the prefill worker's, per request, its KV server's threads
      included (profiles measured before they were counted hold the API processes alone).
    Each `*_cpu_s_per_request` term has a `*_cpu_s_per_prompt_token` beside it: the prompt's token
    ids cross every process (the router's placement and Prefill RPC, the prefill worker's request
    into vLLM, the Decode RPC), so a 1.4k-token prompt costs each several ms more CPU than a
    128-token one. 0 in a profile measured before it was (the per-request terms then hold the
    cost at the profile's 128-token CPU-run prompts). `*_request_cpu_s(prompt_tokens)` adds both.
    CPU of the processes bound to no worker (the router; a client on the same host), which takes
    whatever core is free and otherwise stretches the engines' steps:
    - `host_cpu_s_per_token` and `host_cpu_s_per_step`: per token streamed and per decode step that
      streams any (a step's outputs wake the router and the client once, whatever the batch: at
      batch 1 the wake-up is most of a token's cost, at 64 little of it), fitted together over the
      batched runs' steady windows (`stream_fit.stream_cpu_terms`); in a profile measured before
      (per step 0) the per-token term alone, measured at the largest batch;
    - `host_cpu_s_per_request`;
    - `host_cores`: the cores every process shares (0: the host is not modelled);
    - `router_cpu_s_per_token`, `router_cpu_s_per_step`, `router_cpu_s_per_request`, `router_cpu_s_per_prompt_token`: the
      router's own part of the host terms above. Where the router is bound to the prefill workers' cores (`pdserve up`'s default
      for a cluster with a prefill pool apart from its decode workers:
      `launch.commands.router_cores_for`), that part runs there and stretches only their steps, and
      the rest (the client) goes wherever a core is free; elsewhere all of it floats. 0 (a profile
      measured before the router was measured apart): all of it floats.
    The spread around those medians (`planner.profiler.spread`: deviations in seconds at equally
    spaced quantiles, ascending; () when not measured, and the simulator then charges the medians):
    - `first_token_spread_s`: of lone requests' first token, within each prompt length;
    - `decode_step_spread_s`: of the gaps between a request's tokens while a batch decodes
      together, within each batched run.
    Engines on different cores slowing each other (`planner.profiler.corun_probe`: shared caches,
    memory bandwidth, SMT siblings sold as two vCPUs), as a ratio of an engine's time while another
    engine steps on the other worker's cores to its time alone (1: none measured, or none):
    - `corun_prefill_stretch`: of a prompt computed beside a decoding engine;
    - `corun_decode_stretch`: of a decode step beside an engine computing prompts.
    Kept as measured (the median over rounds); the simulator takes a ratio below 1 as 1 (noise).
    The same stretch of a decode step as a cluster shows it (`planner.profiler.prompt_loss_probe`:
    the decode engine's traced steps that the prompt-loss probes' prompt steps covered, over those
    of the same streams with the prefill engine idle, net of the host model's own ratio of the two,
    the median over the probes' batches; `prompt_loss_fit.served_decode_corun`):
    - `corun_decode_stretch_served`: what the simulator charges a decode step beside a prompt by
      default (`SimSettings.corun`), 0 in a profile measured before it was. The bare engines have
      neither the router nor the client beside them; but neither reading holds what a Poisson
      load of long prompts did on a Zen 4 EPYC, where a lone request's steps ran 1.11-1.22x longer
      beside them while both probes read about 1 (BENCHMARKS, "Where the optimism lives, and a
      decode step beside a prompt through the cluster").
    What the served step was fitted on, kept so that another form can be fitted later without
    measuring again (`served_refit.kept_batch_runs`; () in a profile measured before it was kept):
    - `served_batch_runs`: each batched run as (batch, served step s, context tokens, tokens the
      client received per s), in run order;
    - `served_batch_windows_s`: when each of those runs' steps was read, (start s, end s) on the
      clock of `HardwareInfo.machine_interp_start_s`, in the same order (() where not kept), so a
      run can be set against the machine's speed then (`planner.profiler.point_speed`).
    A prompt step beside decode streams (`planner.profiler.prompt_loss_probe`):
    - `prompt_loss_by_batch`: (decode batch, stretch, lost s) by rising batch: lone prompts of a
      few lengths beside that many streams took lost s + (stretch - 1) x their engine step t more
      than the same prompts with the decode worker idle (`prompt_loss_fit.loss_over_idle`), so the
      simulator charges a prefill step starting beside that batch or more at least lost s +
      stretch x t (`SimSettings.prompt_loss_at`); () in a profile measured before it was.
    - `prompt_idle_loss`: (stretch, lost s) of the same prompts with the decode worker idle over
      their engine step (`prompt_loss_fit.idle_loss`), which the rows above are over: the simulator
      charges a prompt step of t at least lost s + stretch x t with nothing streaming, and adds it
      to every row (`SimSettings.prompt_loss` "profile"); () in a profile measured before it was
      (the rows are then charged over idle, the idle excess left in `first_token_s`).
    - `first_token_idle_excess_s`: what of `first_token_s` that idle loss is at the lone requests'
      median prompt (lost s + (stretch - 1) x its engine step and CPU,
      `serving_probe.first_token_idle_excess_s`): the simulator takes it off
      the first token's delivery where it charges the idle loss to the step, so a lone request's
      TTFT is the measured one either way; 0 without `prompt_idle_loss`.
    A request's first decode steps (`planner.profiler.join_warmup`: lone requests' steps after
    their join over their own steady step, against the context):
    - `join_warmup_s`, `join_warmup_s_per_context_token`: what a request joining a decode batch
      adds to the steps after its join, in all (`join_warmup_cost_s`), which the simulator spreads
      over them as a what-if (`SimSettings.join_warmup`); 0 and 0 in a profile measured before it was.
    Where the host model put the client's CPU when the served step was netted of the host's stretch
    (`stream_fit.fit_served_steps`), and so where the simulator puts it by default (the two must
    agree, or the same CPU is counted twice or not at all; `served_refit.renetted` fits a profile's
    kept runs again for another):
    - `client_placement`: `planner.simulator.host.CLIENT_PLACEMENTS`; "router-room" in a profile
      measured before it was kept (what it was netted with), "wake" since.
    """

    first_token_s: float = 0.0
    handoff_s: float = 0.0
    idle_join_s: float = 0.0
    decode_step_s: float = 0.0
    decode_cpu_s_per_token: float = 0.0
    decode_cpu_s_per_request: float = 0.0
    prefill_cpu_s_per_request: float = 0.0
    host_cpu_s_per_token: float = 0.0
    host_cpu_s_per_request: float = 0.0
    host_cores: int = 0
    router_cpu_s_per_token: float = 0.0
    router_cpu_s_per_request: float = 0.0
    first_token_spread_s: tuple[float, ...] = ()
    decode_step_spread_s: tuple[float, ...] = ()
    corun_prefill_stretch: float = 1.0
    corun_decode_stretch: float = 1.0
    prefill_cpu_s_per_prompt_token: float = 0.0
    decode_cpu_s_per_prompt_token: float = 0.0
    host_cpu_s_per_prompt_token: float = 0.0
    router_cpu_s_per_prompt_token: float = 0.0
    host_cpu_s_per_step: float = 0.0
    router_cpu_s_per_step: float = 0.0
    served_batch_runs: tuple[tuple[float, float, float, float], ...] = ()
    served_batch_windows_s: tuple[tuple[float, float], ...] = ()
    served_step_extra_s: tuple[tuple[float, float], ...] = ()
    client_placement: str = "router-room"
    prompt_loss_by_batch: tuple[tuple[float, float, float], ...] = ()
    prompt_idle_loss: tuple[float, ...] = ()
    first_token_idle_excess_s: float = 0.0
    corun_decode_stretch_served: float = 0.0
    join_warmup_s: float = 0.0
    join_warmup_s_per_context_token: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "served_batch_runs":
                object.__setattr__(self, f.name, _batch_runs(value))
                continue
            if f.name == "served_step_extra_s":
                object.__setattr__(self, f.name, _extra_table(value))
                continue
            if f.name == "served_batch_windows_s":
                object.__setattr__(self, f.name, _windows(value))
                continue
            if f.name == "prompt_loss_by_batch":
                object.__setattr__(self, f.name, _loss_rows(value))
                continue
            if f.name == "prompt_idle_loss":
                object.__setattr__(self, f.name, _idle_loss(value))
                continue
            if f.name == "client_placement":
                require(value in CLIENT_PLACEMENTS, f"serving.client_placement must be one of {CLIENT_PLACEMENTS}, "
                        f"got {value!r}")
                continue
            if f.name in SPREAD_FIELDS:
                object.__setattr__(self, f.name, _spread(f.name, value))
                continue
            if f.name == "corun_decode_stretch_served" and value == 0:
                continue   # not measured
            if f.name in CORUN_FIELDS:
                require(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                         and CORUN_RANGE[0] <= value <= CORUN_RANGE[1],
                         f"serving.{f.name} must be a ratio in [{CORUN_RANGE[0]}, {CORUN_RANGE[1]:g}] (1: engines on "
                         f"different cores do not slow each other), got {value!r}")
                continue
            require(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                     and value >= 0, f"serving.{f.name} must be a number >= 0, got {value!r}")
        require(not self.served_batch_windows_s or len(self.served_batch_windows_s) == len(self.served_batch_runs),
                f"serving.served_batch_windows_s holds {len(self.served_batch_windows_s)} windows for "
                f"{len(self.served_batch_runs)} served_batch_runs: one each, or none")
        for part in ("token", "request", "prompt_token", "step"):
            router, host = getattr(self, f"router_cpu_s_per_{part}"), getattr(self, f"host_cpu_s_per_{part}")
            require(router <= host, f"serving.router_cpu_s_per_{part} ({router!r}) is part of "
                     f"serving.host_cpu_s_per_{part} ({host!r}) and cannot exceed it")

    def decode_serving_s(self, batch: float, by_batch: bool) -> float:
        """What serving adds to one engine decode step of `batch` sequences (0 at batch 0): with
        `by_batch` (`SimSettings.served_step` "table"), `served_step_extra_s` interpolated
        (`interpolated_extra_s`) where the profile has it; else the fitted line."""
        if batch <= 0:
            return 0.0
        if by_batch and self.served_step_extra_s:
            return interpolated_extra_s(self.served_step_extra_s, batch)
        return self.decode_step_s + batch * self.decode_cpu_s_per_token

    @property
    def join_warmup_measured(self) -> bool:
        """Whether the profile measured a join warm-up (either term above 0)."""
        return self.join_warmup_s > 0 or self.join_warmup_s_per_context_token > 0

    def join_warmup_cost_s(self, context_tokens: int) -> float:
        """What a request joining a decode batch with `context_tokens` adds to the steps after its
        join, in all (0 in a profile that did not measure it)."""
        return self.join_warmup_s + self.join_warmup_s_per_context_token * context_tokens

    def prefill_request_cpu_s(self, prompt_tokens: int) -> float:
        """The prefill worker's API process's CPU for one request of `prompt_tokens`."""
        return self.prefill_cpu_s_per_request + self.prefill_cpu_s_per_prompt_token * prompt_tokens

    def decode_request_cpu_s(self, prompt_tokens: int) -> float:
        """The decode worker's API process's CPU for one request of `prompt_tokens`."""
        return self.decode_cpu_s_per_request + self.decode_cpu_s_per_prompt_token * prompt_tokens

    def host_request_cpu_s(self, prompt_tokens: int) -> float:
        """The unbound processes' (router and client) CPU for one request, its tokens' apart."""
        return self.host_cpu_s_per_request + self.host_cpu_s_per_prompt_token * prompt_tokens

    def router_request_cpu_s(self, prompt_tokens: int) -> float:
        """The router's part of `host_request_cpu_s`."""
        return self.router_cpu_s_per_request + self.router_cpu_s_per_prompt_token * prompt_tokens


# where the host model puts the client's CPU beside a bound router (`planner.simulator.host.stretch_for_loads`)
CLIENT_PLACEMENTS = ("router-room", "balanced", "wake")
# the placement a profile measured now nets its served step with (BENCHMARKS, "Where the client runs")
MEASURED_CLIENT_PLACEMENT = "wake"
SPREAD_FIELDS = ("first_token_spread_s", "decode_step_spread_s")
JOIN_WARMUP_FIELDS = ("join_warmup_s", "join_warmup_s_per_context_token")   # measured together, or not at all
CORUN_FIELDS = ("corun_prefill_stretch", "corun_decode_stretch", "corun_decode_stretch_served")
# What a co-run stretch may be: below 0.5 or above 4 is a broken measurement, not two engines on
# different cores (SMT siblings sharing one core slow each other by 1.3-2x)
CORUN_RANGE = (0.5, 4.0)


def interpolated_extra_s(table: Sequence[tuple[float, float]], batch: float) -> float:
    """The extra at `batch` from (batch, seconds) points in ascending batch: linear between the two
    points around it, the first point's value below the first batch, the last two points' line
    past the last (a batch beyond those measured costs what its last sequences did each), never
    below 0. Pure."""
    if not table:
        raise ValueError("no points to interpolate")
    first_batch, first_s = table[0]
    if batch <= first_batch or len(table) == 1:
        return first_s
    for (b0, s0), (b1, s1) in zip(table, table[1:]):
        if batch <= b1:
            return s0 + (s1 - s0) * (batch - b0) / (b1 - b0)
    (b0, s0), (b1, s1) = table[-2], table[-1]
    return max(0.0, s1 + (s1 - s0) * (batch - b1) / (b1 - b0))


def _number_rows(value: Any, width: int, what: str, valid, why: str = "") -> tuple[tuple[float, ...], ...]:
    """`value` as rows of `width` finite numbers, each row `valid(row)`; a ProfileError naming
    `what` (and `why`, what `valid` asks) otherwise."""
    require(isinstance(value, (list, tuple)), f"{what}, got {value!r}")
    rows = []
    for row in value:
        require(isinstance(row, (list, tuple)) and len(row) == width
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in row)
                and valid(row), f"{what}{f' ({why})' if why else ''}, got the row {row!r}")
        rows.append(tuple(float(v) for v in row))
    return tuple(rows)


def _extra_table(value: Any) -> tuple[tuple[float, float], ...]:
    what = "serving.served_step_extra_s must be a list of [batch, seconds] in ascending batch"
    points = _number_rows(value, 2, what, lambda row: row[0] >= 1 and row[1] >= 0,
                          "a batch of at least 1, seconds >= 0")
    require(all(a[0] < b[0] for a, b in zip(points, points[1:])), f"{what} (each batch once), got {value!r}")
    return points


def _loss_rows(value: Any) -> tuple[tuple[float, float, float], ...]:
    what = "serving.prompt_loss_by_batch must be a list of [decode batch, stretch, lost s] in ascending batch"
    rows = _number_rows(value, 3, what, lambda row: row[0] >= 1 and row[0] == int(row[0]) and row[1] >= 1 and row[2] >= 0,
                        "a whole batch of at least 1, a stretch of at least 1, seconds >= 0")
    require(all(a[0] < b[0] for a, b in zip(rows, rows[1:])), f"{what} (each batch once), got {value!r}")
    return rows


def _idle_loss(value: Any) -> tuple[float, ...]:
    if value in ((), []):
        return ()
    (row,) = _number_rows([value], 2, "serving.prompt_idle_loss must be [stretch, lost s] or empty",
                          lambda row: row[0] >= 1 and row[1] >= 0, "a stretch of at least 1, seconds >= 0")
    return row


def _windows(value: Any) -> tuple[tuple[float, float], ...]:
    return _number_rows(value, 2, "serving.served_batch_windows_s must be a list of [start s, end s] with "
                                  "0 <= start <= end", lambda row: 0 <= row[0] <= row[1])


def _batch_runs(value: Any) -> tuple[tuple[float, float, float, float], ...]:
    return _number_rows(value, 4, "serving.served_batch_runs must be a list of [batch, served step s, context "
                                  "tokens, tokens per s]", lambda row: row[0] >= 1 and row[1] > 0 and row[2] >= 0
                        and row[3] >= 0, "a batch of at least 1, a step above 0")


def _spread(name: str, value: Any) -> tuple[float, ...]:
    require(isinstance(value, (list, tuple)), f"serving.{name} must be a list of seconds, got {value!r}")
    points = tuple(value)
    require(all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in points),
             f"serving.{name} must hold finite numbers, got {value!r}")
    require(list(points) == sorted(points), f"serving.{name} must be ascending (quantiles), got {value!r}")
    return tuple(float(v) for v in points)
