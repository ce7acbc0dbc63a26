"""What the simulator runs beside the topology (`planner.simulator.topology`): the per-instance
engine settings (token budget, batch cap, KV capacity, transport), the serving costs and what-ifs
it charges, and the router's settings."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Literal

from planner.profile import Profile
from planner.serving_costs import ServingCosts
from planner.simulator.host import CLIENT_PLACEMENTS, MAX_STOLEN, ROUTER_CHARGES
from router.policies.placement import CostModel, PlacementConfig
from router.scheduler import SloTargets

if TYPE_CHECKING:   # speed.py and topology.py raise this module's SimulationError
    from planner.simulator.speed import DecodeSpeed
    from planner.simulator.topology import Topology

DecodePick = Literal["handoff", "arrival"]
SERVED_STEP_FORMS = ("line", "table")  # `SimSettings.served_step`
HOP_MODELS = ("stretched", "queued", "prefill-core", "loaded")  # `SimSettings.hops`
STEP_SPREADS = ("carried", "cut")  # `SimSettings.step_spread`
PROMPT_LOSS_SOURCES = ("profile", "over-idle", "none")  # `SimSettings.prompt_loss`
CORUN_SOURCES = ("served", "engines")  # `SimSettings.corun`
JOIN_WARMUPS = ("profile", "none")     # `SimSettings.join_warmup`
# the share of a decode instance's unpaid join warm-up each of its steps pays (`SimSettings.join_warmup`):
# 0.3 pays 94% of it over the 8 steps after the join, as the traced steps did (`planner.profiler.join_warmup`)
JOIN_WARMUP_PAY_SHARE = 0.3
class SimulationError(ValueError):
    """A workload or configuration the simulator cannot run; the message says how to fix it."""


@dataclass(frozen=True)
class RouterSettings:
    """What the simulated router places with (`router.policies.placement`): the policy, whose
    `local_prefill_max_tokens` the topology's replaces; the cost model (None: `simulate` derives it
    from the performance model and the workload's mean lengths, `planner.simulator.cost.cost_model_from`);
    and the SLOs set on the router (`pdserve router --slo-ttft-ms/--slo-tpot-ms`; None: not set,
    and placement aims at the router's nominal one, as the router does).

    `admission`: whether the router's admission is modelled. On (the default), a request is refused
    at arrival as the router would refuse it with these SLOs (`router.scheduler.Scheduler.check`):
    judged on TTFT only with a TTFT SLO set, on TPOT only with a TPOT SLO set, never without SLOs.
    Off: nothing is refused (placement still aims at the SLOs set), every request waits to be served.

    `calibrated`: whether admission scales its predictions by the router's `Calibration` learned from
    the simulated requests, as the live router does (`planner.simulator.routing`). On (the default)
    since its picks were measured: on an AMX Xeon's trace comparison the plan made with it picked the
    loose pair's measured-best topology (1P+1H/256, 5.04 req/s, predicted 6.25: +24%) where the plan
    judging at scale 1 picked 2C@256 (4.78 measured, 9.63 predicted: +102%), and the same tight pick
    (1P+1D, predicted 3.63 against 4.63, 2.75 measured); replayed on the slow Zen 4 EPYC's comparison it
    refused as the live router did (0/1/2/5/14 of 60 at 0.6-1.8 req/s against 0/1/3/5/13 measured;
    0/0/2/4/7 off). On the AMX Xeon's long-prompt shape the scale-1 plan picked the better tight topology
    (1.77 against 1.35 req/s), but over the four plans there the calibrated ones erred +23% to +37%
    against -5% to +102% (BENCHMARKS, "B* on an AMX Xeon with the planner's admission calibrated"). Off: it
    judges them as they are (a what-if: what a router that had never learned its cost model's error
    would refuse)."""

    placement: PlacementConfig = field(default_factory=PlacementConfig)
    cost: CostModel | None = None
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None
    admission: bool = True
    calibrated: bool = True

    def __post_init__(self) -> None:
        for name in ("ttft_slo_s", "tpot_slo_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise SimulationError(f"RouterSettings.{name} must be > 0 s (or None: no such SLO on the router), "
                                      f"got {value!r}")

    @property
    def slo(self) -> SloTargets:
        """The SLOs set on the router, as `pdserve router` holds them."""
        return SloTargets(self.ttft_slo_s, self.tpot_slo_s)

    def placement_for(self, topology: Topology) -> PlacementConfig:
        """The policy the router of `topology` runs: this one with the topology's local prefill cap."""
        return replace(self.placement, local_prefill_max_tokens=topology.local_prefill_max_tokens)


def prompt_rows_as_measured(over_idle: tuple[tuple[float, float, float], ...],
                            idle: tuple[float, ...]) -> tuple[tuple[float, float, float], ...]:
    """A profile's prompt-loss rows as measured: the idle row (stretch, lost s) at batch 0, then each
    row over idle (batch, stretch, lost s) with the idle one added (stretch + idle stretch - 1, lost
    s + idle lost s); the rows over idle as they are where there is no idle row. Pure."""
    if not idle:
        return over_idle
    stretch, lost_s = idle
    return ((0, stretch, lost_s), *((batch, row_stretch + stretch - 1.0, row_lost_s + lost_s)
                                    for batch, row_stretch, row_lost_s in over_idle))


@dataclass(frozen=True)
class SimSettings:
    """Per-instance engine limits (the same for every instance) and how KV moves.

    - `token_budget`: tokens one engine step may compute (vLLM's max_num_batched_tokens; the
      chunk size of chunked prefill);
    - `max_num_seqs`: requests admitted at once per instance (decode: transferring + running);
    - `num_kv_blocks` of `block_size` tokens per instance; a request reserves blocks for its whole
      sequence (prompt + output) when admitted to decode, and waits while they are not free;
    - `kv_bytes_per_token` and `transport` give a transfer's bytes (whole blocks) and time;
    - `decode_pick`: when the decode instance of a disaggregated request is chosen: "arrival"
      (the placement's pair, chosen when the router dispatches the request: what the router does)
      or "handoff" (a what-if: placed again among the decode instances when its prefill finishes);
    - `serving`: what the router, the hops and the workers' API processes add (latencies, CPU on
      the workers' cores and on the host's); zeros simulate the engines alone;
    - `router`: the placement policy, cost model, SLOs and admission the simulated router uses;
    - `spread_seed`: seeds the draws of `serving`'s measured spread (`planner.simulator.spread`);
    - `host_window_s`: how long the host's CPU from an arrival, a handoff or emitted tokens loads
      the cores (`planner.simulator.host.HostCpu`; BENCHMARKS "How long a burst's CPU loads the
      router's core" says what shorter windows do to the validations);
    - `router_cpu_charge`: where the router bound to the prefill instances' cores puts its CPU:
      "window" (a load over `host_window_s` that stretches the steps there) or "backlog" (work
      queued on those cores that the steps starting there share, `planner.simulator.host.RouterBacklog`);
    - `served_step`: what serving adds to a decode step: "line" (the profile's fitted line) or
      "table" (its measured extra by batch, interpolated, where the profile has it;
      `ServingCosts.decode_serving_s`);
    - `client_placement`: where the client's CPU goes beside a router bound to the prefill
      instances' cores: "router-room", the room the router leaves there first; "balanced", every
      stepping core alike while the router's cores step too; or "wake", where Linux wakes it (the
      router's cores while they idle, else either core alike: `planner.simulator.host.wake_share_on_router`);
      None (the default): the profile's, `ServingCosts.client_placement`, which its served step was
      netted with (another counts the client's CPU twice or not at all unless the served step is
      netted again for it: `planner.profiler.served_refit.renetted`);
    - `hops`: what a prefilled request's two hops (`ServingCosts.first_token_s`, `handoff_s`) take
      under load: "stretched", the stretch of a prefill step starting as its prompt finishes (the
      router's cores' share taken, `planner.simulator.host`); or "queued", the profile's latencies
      unstretched plus the waits behind the decode side's latest outputs in the processes on their
      way: the router's (both hops) and the decode worker's API process (the Decode call;
      `planner.simulator.host.router_outputs_wait_s`, `decode_call_wait_s`); or "prefill-core",
      those waits after the hop's CPU (`handoff_s`) runs on its prefill instance's core beside
      that instance's steps, at half the core while one runs (`planner.simulator.core_share`),
      its first token's delivery taking the same stretch; or "loaded", the stretched hop to the decode
      worker (not its first token's delivery) stretched again by the load on its prefill core: the
      unbound processes' demand per router core and its prefill engine's busy share over
      `host_window_s` (`planner.simulator.host.loaded_hop_stretch`);
    - `step_spread`: what a decode step's drawn spread (`serving.decode_step_spread_s`) could not
      take from a short step (the floor: `planner.simulator.spread.MIN_STEP_SHARE`): "carried" to
      the instance's next step, as a bunched client's next gap takes it, so the draws keep their
      measured mean; or "cut", dropped (the simulator before: it raises a short step's mean);
    - `router_core_max_stolen`: the largest share of a step on the router's cores the host's load
      may take (`planner.simulator.host.stretch_for_loads`): the default `MAX_STOLEN` (0.9), or 0.5,
      a fair scheduler keeping a stepping engine at least half its core against the router
      (a what-if; BENCHMARKS "What a loaded cluster's steps are made of" says what it does);
    - `decode_speed`: each decode-side instance's speed window by window (`planner.simulator.speed.
      DecodeSpeed`: factors over the profile's, from time 0); None (the default): every step at the
      model's speed. What a validation replays of the machine's own speed as it moved (a what-if:
      a planner does not know it ahead);
    - `prompt_stretch`: a prefill instance's step by the decode batch streaming as it starts,
      ((batch, stretch[, lost_s]), ...) by rising batch (`prompt_loss_at`): a step the model puts
      at t takes lost_s + stretch x t (lost_s 0 where a row gives none) where that is longer than
      the host model's. The idle excess is in the profile's lone latencies (`first_token_s`), so
      rows read off a loaded cluster's traced steps (the step report's `stretch_by_decode_batch`)
      go in over idle, as the profile keeps its own (`prompt_loss_fit.loss_over_idle`). () (the
      default): the profile's rows, per `prompt_loss`. A what-if, in place of the profile's rows;
    - `prompt_loss`: with no `prompt_stretch`, what a prefill step takes beyond the host model's
      stretch. "profile" (the default): the profile's measured loss as measured, the idle row
      (`ServingCosts.prompt_idle_loss`) with nothing streaming and each row over idle
      (`prompt_loss_by_batch`) added to it, the idle part then taken off the first token's
      delivery (`first_token_delivery_s`); in a profile measured before the idle row was kept, the
      rows over idle alone. "over-idle": the rows over idle alone whatever the profile holds (the
      simulator before: the idle excess left in `first_token_s`, a constant beside every TTFT and
      never in the prefill engine's busy time). "none": the host model's stretch alone;
    - `corun`: which co-run stretch a decode step beside another instance's step takes: "served"
      (the default), the profile's read through the cluster beside its prompt-loss probes
      (`ServingCosts.corun_decode_stretch_served`), the two engines' where it has none; or
      "engines", the two bare engines' (`ServingCosts.corun_decode_stretch`, the simulator before).
    - `join_warmup`: whether the steps after a request joins a disaggregated decode instance's batch
      pay the profile's join warm-up (`ServingCosts.join_warmup_cost_s` of its context), "profile",
      or not, "none" (the default: the simulator before; a profile measured before the probe has
      none either way). The instance owes the largest warm-up of the joins not yet paid off (joins
      close together overlap, they do not add: added, a bursty load's many joins a step charged
      its steps 38-45% over the measured TPOT), and each step from the one after the join pays
      `JOIN_WARMUP_PAY_SHARE` of what it owes (extra time, stretched with the step); an instance
      whose batch empties owes nothing. A what-if, not the default: on an AMX Xeon it took
      long-short's TPOT error from -22% to -13% with one profile and from -2% to +7% with
      another, and moved short-long's and the trace's, already over the measured there, further
      over (BENCHMARKS, "A request's first decode steps").
    """

    token_budget: int
    max_num_seqs: int
    num_kv_blocks: int
    block_size: int
    kv_bytes_per_token: int
    transport: str = "tcp"
    decode_pick: DecodePick = "arrival"
    serving: ServingCosts = ServingCosts()
    router: RouterSettings = RouterSettings()
    spread_seed: int = 0
    host_window_s: float = 0.5
    router_cpu_charge: str = "window"
    served_step: str = "line"
    router_core_max_stolen: float = MAX_STOLEN
    hops: str = "stretched"
    client_placement: str | None = None
    step_spread: str = "carried"
    decode_speed: DecodeSpeed | None = None
    prompt_stretch: tuple[tuple[int, float] | tuple[int, float, float], ...] = ()
    prompt_loss: str = "profile"
    corun: str = "served"
    join_warmup: str = "none"

    def __post_init__(self) -> None:
        for name in ("token_budget", "max_num_seqs", "num_kv_blocks", "block_size", "kv_bytes_per_token"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise SimulationError(f"SimSettings.{name} must be an int >= 1, got {value!r}")
        if self.router_cpu_charge not in ROUTER_CHARGES:
            raise SimulationError(f"SimSettings.router_cpu_charge must be one of {ROUTER_CHARGES}, "
                                  f"got {self.router_cpu_charge!r}")
        if self.served_step not in SERVED_STEP_FORMS:
            raise SimulationError(f"SimSettings.served_step must be one of {SERVED_STEP_FORMS}, got {self.served_step!r}")
        if self.client_placement is not None and self.client_placement not in CLIENT_PLACEMENTS:
            raise SimulationError(f"SimSettings.client_placement must be one of {CLIENT_PLACEMENTS}, "
                                  f"got {self.client_placement!r}")
        if self.step_spread not in STEP_SPREADS:
            raise SimulationError(f"SimSettings.step_spread must be one of {STEP_SPREADS}, got {self.step_spread!r}")
        if self.hops not in HOP_MODELS:
            raise SimulationError(f"SimSettings.hops must be one of {HOP_MODELS}, got {self.hops!r}")
        if not self.host_window_s > 0:
            raise SimulationError(f"SimSettings.host_window_s must be > 0, got {self.host_window_s!r}")
        if not 0 < self.router_core_max_stolen <= MAX_STOLEN:
            raise SimulationError(f"SimSettings.router_core_max_stolen must be in (0, {MAX_STOLEN}], "
                                  f"got {self.router_core_max_stolen!r}")
        rows = self.prompt_stretch
        batches = [row[0] for row in rows]
        if (any(len(row) not in (2, 3) for row in rows)
                or any(not isinstance(b, int) or b < 0 for b in batches) or batches != sorted(set(batches))
                or any(not row[1] > 0 or (len(row) == 3 and not row[2] >= 0) for row in rows)):
            raise SimulationError(f"SimSettings.prompt_stretch must be (batch >= 0, stretch > 0[, lost_s >= 0]) rows "
                                  f"by rising batch, got {self.prompt_stretch!r}")
        if self.prompt_loss not in PROMPT_LOSS_SOURCES:
            raise SimulationError(f"SimSettings.prompt_loss must be one of {PROMPT_LOSS_SOURCES}, got {self.prompt_loss!r}")
        if self.join_warmup not in JOIN_WARMUPS:
            raise SimulationError(f"SimSettings.join_warmup must be one of {JOIN_WARMUPS}, got {self.join_warmup!r}")
        if self.corun not in CORUN_SOURCES:
            raise SimulationError(f"SimSettings.corun must be one of {CORUN_SOURCES}, got {self.corun!r}")
        if self.decode_pick not in ("handoff", "arrival"):
            raise SimulationError(f"SimSettings.decode_pick must be 'handoff' or 'arrival', got {self.decode_pick!r}")

    @classmethod
    def from_profile(cls, profile: Profile, transport: str | None = None, **overrides) -> "SimSettings":
        """The engine settings the profile was measured with; `transport` defaults to the
        profile's only (or first, alphabetically) transport."""
        chosen = transport or profile.transports[0]
        if chosen not in profile.transports:
            raise SimulationError(f"transport {chosen!r} was not measured; the profile has {profile.transports}")
        settings = cls(
            token_budget=profile.engine.max_num_batched_tokens,
            max_num_seqs=profile.engine.max_num_seqs,
            num_kv_blocks=profile.num_kv_blocks,
            block_size=profile.model.block_size,
            kv_bytes_per_token=profile.model.kv_bytes_per_token,
            transport=chosen,
            serving=profile.serving,
        )
        return replace(settings, **overrides)

    def for_topology(self, topology: Topology) -> "SimSettings":
        """These settings (one device's instance) for an instance of `topology`: its token budget,
        if it sets one; the KV blocks of all the devices an instance spans. The router's cost model
        is kept when neither changes, else dropped so that `simulate` derives it for the new
        instance (its Local-prefill interference depends on the chunk count, its times on the width)."""
        budget = topology.token_budget or self.token_budget
        width = topology.devices_per_instance
        if budget == self.token_budget and width == 1:
            return self
        return replace(self, token_budget=budget, num_kv_blocks=self.num_kv_blocks * width,
                       router=replace(self.router, cost=None))

    @cached_property
    def prompt_loss_rows(self) -> tuple[tuple, ...]:
        """The rows a prefill step beside streams is charged by: `prompt_stretch`, else the
        profile's as `prompt_loss` says (`prompt_rows_as_measured` for "profile"), else none."""
        if self.prompt_stretch:
            return self.prompt_stretch
        if self.prompt_loss == "profile":
            return prompt_rows_as_measured(self.serving.prompt_loss_by_batch, self.serving.prompt_idle_loss)
        return self.serving.prompt_loss_by_batch if self.prompt_loss == "over-idle" else ()

    @property
    def first_token_delivery_s(self) -> float:
        """What the router and the hops add to a first token (`ServingCosts.first_token_s`), less
        the idle loss of the lone prompts it was measured on where the prompt step is charged it
        (`prompt_loss` "profile" on a profile with `prompt_idle_loss`, no `prompt_stretch`)."""
        charged = not self.prompt_stretch and self.prompt_loss == "profile" and self.serving.prompt_idle_loss
        return self.serving.first_token_s - (self.serving.first_token_idle_excess_s if charged else 0.0)

    def prompt_loss_at(self, decode_batch: int) -> tuple[float, float]:
        """`prompt_loss_rows`' (stretch, lost_s) at `decode_batch` streaming: the row of the largest
        batch not above it ((1.0, 0.0) below the first row, or with none)."""
        row = next((row for row in reversed(self.prompt_loss_rows) if row[0] <= decode_batch), None)
        return (1.0, 0.0) if row is None else (row[1], row[2] if len(row) == 3 else 0.0)

    @property
    def corun_stretches(self) -> tuple[float, float]:
        """(a prompt's, a decode step's) stretch while another instance steps on other cores: a
        prefill step takes the first, a decode step the second, a mixed step (colocated, hybrid)
        the first when it carries a prompt chunk, else the second. The decode step's is the one
        `corun` names (the served one falls back to the engines' where the profile has none). A
        ratio measured below 1 is taken as 1: a neighbour does not speed a step up (two busy cores
        run no faster), so below 1 is the rounds' noise."""
        serving = self.serving
        decode = serving.corun_decode_stretch_served if self.corun == "served" else 0.0
        return max(1.0, serving.corun_prefill_stretch), max(1.0, decode or serving.corun_decode_stretch)

    def join_warmup_cost_s(self, context_tokens: int) -> float:
        """What a request joining a decode batch with `context_tokens` owes the steps after its join,
        in all: the profile's (`ServingCosts.join_warmup_cost_s`) with `join_warmup` "profile", else 0."""
        return self.serving.join_warmup_cost_s(context_tokens) if self.join_warmup == "profile" else 0.0

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def kv_bytes_for(self, prompt_tokens: int) -> int:
        """Bytes moved for a prompt: whole blocks, as the transport copies them."""
        return self.blocks_for(prompt_tokens) * self.block_size * self.kv_bytes_per_token
