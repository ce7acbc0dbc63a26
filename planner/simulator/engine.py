"""The discrete-event loop: arrivals, step ends and transfer completions on one heap.

Instances by topology (`Topology.kind`): disaggregated, N `PrefillInstance` + M `DecodeInstance`;
hybrid, N `PrefillInstance` + M `HybridInstance` (colocated instances that also take pulled KV);
aggregated, K `ColocatedInstance`. Routing is the router's own placement (`planner.simulator.routing`:
the dispatch queue, `placement.evaluate`, the dispatch gate), asked after every event, so a
request goes out the moment the router would send it; a Disaggregated request's decode instance
is the placement's (or placed again at its handoff: `decode_pick`). With an SLO set on the router,
its admission may refuse a request at arrival: that request is over at once, no instance sees it.

Events at the same instant are all applied before any idle instance plans its next step, so two
requests arriving together share a step; at one instant arrivals come first, then handoffs, then
Decode calls reaching their instances, then transfer completions, then step ends.

Serving costs (`SimSettings.serving`, measured through a real cluster): a prefilled request reaches
its decode instance `handoff_s` after its first token; the workers' per-request and per-token CPU
lengthens their steps; the host's unbound load (`planner.simulator.host`: the router's part on
the prefill instances' cores where there are any, the client's where there is room) stretches
steps that share a core with it; `first_token_s` is added to what the client sees (TTFT and
end-to-end latency, not TPOT), less what of it the prompt step is charged as measured
(`SimSettings.first_token_delivery_s`). A prefilled request's two hops (`first_token_s`, `handoff_s`) take
the stretch of a prefill step starting as its prompt finishes: their CPU is on the router's cores.
With `SimSettings.hops` "queued" the hops are the profile's latencies unstretched, each plus the
router's wait behind the decode side's running steps' outputs, and the Decode call then waits in
the decode worker's API process behind its engine's last outputs before the instance has it
(`planner.simulator.host.router_outputs_wait_s`, `decode_call_wait_s`). With "prefill-core" the
hop's CPU runs beside its prefill instance's steps instead, at half that core while one runs
(`planner.simulator.core_share`; a HOPS_DONE event when the next completes), then takes those waits.
With "loaded" the stretched hop to the decode worker is stretched again by the load on its prefill
core (the unbound processes' demand, the prefill engine's busy share:
`planner.simulator.host.loaded_hop_stretch`); the first token's delivery to the client is not.
A step that starts while another instance steps takes the measured co-run stretch too
(`SimSettings.corun_stretches`: engines on different cores slowing each other, as the cluster
showed it by default). Where the profile measured
their spread, each decode step and each first token also takes a seeded draw of it
(`planner.simulator.spread`), so tails come from the host's measured distribution rather than
from the medians alone.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

import numpy as np

from planner.perf_model import PerfModel
from planner.simulator.cost import cost_model_from
from planner.simulator.config import SimSettings, SimulationError
from planner.simulator.core_share import HOP_SHARE_WHILE_STEPPING, BusyWindow, WorkBesideSteps
from planner.simulator.host import HostCpu, decode_call_wait_s, loaded_hop_stretch, router_outputs_wait_s
from planner.simulator.hybrid import HybridInstance
from planner.simulator.instances import ColocatedInstance, DecodeInstance, PrefillInstance, StepDone
from planner.simulator.result import SimResult
from planner.simulator.routing import SimRouter
from planner.simulator.spread import ServiceSpread
from planner.simulator.state import ItlLog, SimRequest
from planner.simulator.topology import Topology
from router.policies.placement import CostModel, Local

ARRIVAL, HANDOFF, DECODE_CALL, TRANSFER_DONE, STEP_END, HOPS_DONE = 0, 1, 2, 3, 4, 5
DecodeSide = DecodeInstance | HybridInstance | ColocatedInstance
Instance = PrefillInstance | DecodeSide


def simulate(requests: Sequence[Any], topology: Topology, settings: SimSettings, model: PerfModel) -> SimResult:
    """Replay `requests` (objects with arrival_s, prompt_tokens, output_tokens, e.g.
    `loadgen.workload.RequestSpec`) through `topology`. Deterministic; every request finishes or
    is refused at arrival by the router's admission (`RouterSettings`: SLOs set, admission on).

    The engines run `settings` with the topology's token budget (`SimSettings.for_topology`), and
    `model` for one engine over the topology's devices per instance (`PerfModel.on_devices`). The
    router's cost model is `settings.router.cost`, or else derived from `model` and the workload's
    mean lengths (`planner.simulator.cost.cost_model_from`).
    Raises `SimulationError` for a request that could never fit one instance's KV cache.
    Prefix caching is not modelled, nor KV memory on prefill instances.
    """
    settings = settings.for_topology(topology)
    model = model.on_devices(topology.devices_per_instance)
    sim_requests = [SimRequest(i, float(r.arrival_s), int(r.prompt_tokens), int(r.output_tokens))
                    for i, r in enumerate(requests)]
    _check_requests(sim_requests, settings)
    cost = settings.router.cost or _derived_cost(sim_requests, settings, model)
    return _Cluster(topology, settings, model, cost).run(sim_requests)


def _derived_cost(requests: list[SimRequest], settings: SimSettings, model: PerfModel) -> CostModel:
    count = max(1, len(requests))
    return cost_model_from(model, settings, max(1.0, sum(r.prompt_tokens for r in requests) / count),
                           max(1.0, sum(r.output_tokens for r in requests) / count))


def _check_requests(requests: list[SimRequest], settings: SimSettings) -> None:
    for r in requests:
        if r.prompt_tokens < 1 or r.output_tokens < 1 or r.arrival_s < 0:
            raise SimulationError(f"request {r.index} needs prompt_tokens >= 1, output_tokens >= 1 and "
                                  f"arrival_s >= 0; got {r.prompt_tokens}, {r.output_tokens}, {r.arrival_s}")
        needed = settings.blocks_for(r.prompt_tokens + r.output_tokens)
        if needed > settings.num_kv_blocks:
            raise SimulationError(
                f"request {r.index} ({r.prompt_tokens} prompt + {r.output_tokens} output tokens) needs "
                f"{needed} KV blocks but an instance holds {settings.num_kv_blocks}; raise "
                "kv_cache_memory_bytes or cap the workload's lengths")


NO_CORUN = (1.0, 1.0)


class _Cluster:
    def __init__(self, topology: Topology, settings: SimSettings, model: PerfModel, cost: CostModel) -> None:
        self.topology, self.settings = topology, settings
        self.itl = ItlLog()
        self.prefill = [PrefillInstance(i, settings, model) for i in range(topology.num_prefill)]
        decode_kind = {"disaggregated": DecodeInstance, "hybrid": HybridInstance}.get(topology.kind, ColocatedInstance)
        self.decode: list[DecodeSide] = [decode_kind(i, settings, model, self.itl)
                                         for i in range(topology.num_decode + topology.num_colocated)]
        router = settings.router
        self.router = SimRouter(topology.kind, topology.num_prefill, self.decode, router.placement_for(topology),
                                cost, router.slo, settings.block_size, router.admission,
                                delivery_s=settings.first_token_delivery_s, calibrated=router.calibrated)
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self._dirty: dict[int, Instance] = {}
        self._cores_per_instance = settings.serving.host_cores / topology.devices * topology.devices_per_instance
        # the router is bound to the prefill instances' cores where there are any (a prefill pool
        # is apart from the decode side: `launch.commands.router_cores_for`), else it floats
        self.host = HostCpu(settings.serving, settings.host_window_s, router_cores=topology.num_prefill * self._cores_per_instance,
                            router_charge=settings.router_cpu_charge,
                            router_core_max_stolen=settings.router_core_max_stolen,
                            client_placement=settings.client_placement or settings.serving.client_placement)
        self.spread = ServiceSpread(settings.serving, settings.spread_seed)
        self._stepping: set[int] = set()  # ids of the instances with a step running
        self._stepping_prefill: set[int] = set()  # of those, the prefill instances (the router's cores)
        # each prefill step as it started: (start s, duration s, the model's step s, decode batch beside)
        self.prefill_steps: list[tuple[float, float, float, int]] = []
        # `hops` "prefill-core": each prefill instance's core serves its prefilled requests' hops beside its steps
        self._hops = {id(p): WorkBesideSteps(HOP_SHARE_WHILE_STEPPING) for p in self.prefill} \
            if settings.hops == "prefill-core" else {}
        self._hops_due: dict[int, int] = {}  # id of a prefill instance -> the version its HOPS_DONE was pushed at
        # `hops` "loaded": each prefill instance's steps over the host's window
        self._prefill_busy = {id(p): BusyWindow(settings.host_window_s) for p in self.prefill} \
            if settings.hops == "loaded" else {}

    def _push(self, at_s: float, kind: int, payload: Any) -> None:
        heapq.heappush(self._heap, (at_s, kind, self._seq, payload))
        self._seq += 1

    def run(self, requests: list[SimRequest]) -> SimResult:
        for request in requests:
            self._push(request.arrival_s, ARRIVAL, request)
        heap = self._heap
        while heap:
            now, kind, _, payload = heapq.heappop(heap)
            self.router.now_s = now
            if kind == ARRIVAL:  # one the router refuses is over here: no instance sees it (the host did)
                self.host.request_moved(payload.arrival_s, payload.prompt_tokens)
                self.router.arrive(payload)
            elif kind == HANDOFF:
                self._hand_off(payload, now)
            elif kind == DECODE_CALL:
                self._reach_decode(payload, now)
            elif kind == HOPS_DONE:
                self._hops_done(*payload, now)
            elif kind == TRANSFER_DONE:
                instance, request = payload
                instance.transfer_done(request)
                self._dirty[id(instance)] = instance
            else:
                self._on_step_end(payload, now)
            self._dispatch()
            if not heap or heap[0][0] > now:
                self._start_steps(now)
                self._push_hops_due(now)
        self._check_finished(requests)
        busy = {"prefill": [i.busy_s for i in self.prefill],
                "decode": [] if self.topology.is_colocated else [i.busy_s for i in self.decode],
                "colocated": [i.busy_s for i in self.decode] if self.topology.is_colocated else []}
        hops = np.array([request.hop_stretch for request in requests])
        waits = np.array([request.hop_wait_s for request in requests])
        delivery_s = np.maximum(0.0, self.settings.first_token_delivery_s * hops + waits
                                + self.spread.first_token_extra_s(len(requests)))
        return SimResult.from_requests(requests, self.topology, self.itl, busy, delivery_s=delivery_s,
                                       prefill_steps=self.prefill_steps,
                                       decode_steps=[step for d in self.decode for step in getattr(d, "steps", ())])

    def _check_finished(self, requests: list[SimRequest]) -> None:
        unfinished = [r.index for r in requests if r.finish_s is None and not r.refused]
        if unfinished or len(self.router):
            raise SimulationError(f"{len(unfinished)} requests never finished (first: {unfinished[:5]}); "
                                  "this is a simulator bug, please report it with the workload")

    def _host_stretch(self, now: float, prefill: bool) -> float:
        """The host's stretch of a step starting now beside the steps running (`prefill`: on a
        prefill instance's cores, the router's)."""
        busy_cores = (len(self._stepping) + 1) * self._cores_per_instance
        busy_router_cores = (len(self._stepping_prefill) + prefill) * self._cores_per_instance
        return self.host.stretch(now, busy_cores, busy_router_cores, on_router_cores=prefill,
                                 team_cores=self._cores_per_instance)

    def _start_steps(self, now: float) -> None:
        for instance in self._dirty.values():
            prefill = isinstance(instance, PrefillInstance)
            stretch = self._host_stretch(now, prefill)
            floor, streaming = {}, 0
            if prefill:
                streaming = sum(d.step_tokens for d in self.decode if id(d) in self._stepping)
                if self.settings.prompt_loss_rows:   # the prompt step measured beside the streams
                    floor = {"floor": self.settings.prompt_loss_at(streaming)}
            if not prefill and self.settings.decode_speed is not None:   # the machine's speed as it moved
                stretch *= self.settings.decode_speed.factor(instance.index, now)
            beside_another = len(self._stepping) - (id(instance) in self._stepping) > 0
            end_s = instance.start_step(now, stretch, self.spread.step_extra_s(),
                                        self.settings.corun_stretches if beside_another else NO_CORUN,
                                        **floor)
            if end_s is not None:
                if prefill:  # the router's queued CPU shares the step's core
                    end_s += self.host.router_delay_s(now, end_s - now)
                    self.prefill_steps.append((now, end_s - now, instance.engine_step_s, streaming))
                self._stepping.add(id(instance))
                if prefill:
                    self._stepping_prefill.add(id(instance))
                    if self._hops:
                        self._hops[id(instance)].step_started(now, end_s)
                    if self._prefill_busy:
                        self._prefill_busy[id(instance)].step(now, end_s)
                self._push(end_s, STEP_END, instance)
        self._dirty.clear()

    def _dispatch(self) -> None:
        """Sends what the router sends now: a prompt to its computing instance."""
        for request, path in self.router.dispatch():
            instance = self.decode[request.decode_instance] if isinstance(path, Local) \
                else self.prefill[request.prefill_instance]
            instance.enqueue(request)
            self._dirty[id(instance)] = instance

    def _on_step_end(self, instance: Instance, now: float) -> None:
        self._dirty[id(instance)] = instance
        self._stepping.discard(id(instance))
        self._stepping_prefill.discard(id(instance))
        done: StepDone = instance.finish_step(now)
        if self._hops and isinstance(instance, PrefillInstance):
            self._hops[id(instance)].step_ended(now)
        for request in done.prefilled:
            if isinstance(instance, PrefillInstance):
                # its hops' CPU (the router's, the prefill worker's) is on the router's cores,
                # shared as a prefill step starting now would be
                if self._hops:  # or beside the steps of its prefill instance, which that core runs
                    self._hops[id(instance)].add(now, request, self.settings.serving.handoff_s)
                    continue
                if self.settings.hops == "queued":
                    request.hop_wait_s = self._router_outputs_wait_s()
                else:
                    request.hop_stretch = self._host_stretch(now, prefill=True)
                hop_s = (self.settings.serving.handoff_s * request.hop_stretch * self._hop_load_stretch(instance, now)
                         + request.hop_wait_s)
                self._push(now + hop_s + self.host.router_delay_s(now, hop_s), HANDOFF, request)
            else:  # a Local prompt: the first token streams from the decode instance
                self.router.prefilled(request)
                self.host.request_moved(now, request.prompt_tokens)
        for request in done.finished:
            self.router.finished(request)
            self.host.request_moved(now, request.prompt_tokens)
        self._push_transfers(instance, done.transfers)
        self.host.tokens_emitted(now, instance.step_tokens)

    def _hop_load_stretch(self, instance: PrefillInstance, now: float) -> float:
        """`hops` "loaded": the hop's stretch by the load on its prefill core (1 otherwise)."""
        if not self._prefill_busy:
            return 1.0
        cores = self.host.router_cores or self.settings.serving.host_cores   # 0: the host is not modelled
        per_core = self.host.load_cores(now) / cores if cores else 0.0
        return loaded_hop_stretch(per_core, self._prefill_busy[id(instance)].busy_share(now))

    def _push_hops_due(self, now: float) -> None:
        """`hops` "prefill-core": after the steps that start now, when the next hop on each prefill
        core completes (a HOPS_DONE event, stale once that core's state moves again)."""
        for key, work in self._hops.items():
            if len(work) and self._hops_due.get(key) != work.version:
                done_s = work.next_done_s(now)
                if done_s is not None:
                    self._push(done_s, HOPS_DONE, (key, work.version))
                    self._hops_due[key] = work.version

    def _hops_done(self, key: int, version: int, now: float) -> None:
        """The hops complete now on a prefill core: each one's stretch is its time over the
        profile's `handoff_s` (its first token's delivery takes it too), and the router has it."""
        work = self._hops[key]
        if version != work.version:
            return
        handoff_s = self.settings.serving.handoff_s
        for request, added_s in work.done(now):
            request.hop_stretch = (now - added_s) / handoff_s if handoff_s > 0 else 1.0
            request.hop_wait_s = self._router_outputs_wait_s()
            self._push(now + request.hop_wait_s, HANDOFF, request)

    def _router_outputs_wait_s(self) -> float:
        """What a hop waits in the router behind the running decode steps' outputs (`hops` "queued",
        "prefill-core")."""
        return router_outputs_wait_s(sum(d.step_tokens for d in self.decode if id(d) in self._stepping),
                                     self.settings.serving.router_cpu_s_per_token)

    def _hand_off(self, request: SimRequest, now: float) -> None:
        """Prefill is done and the first token is out (`handoff_s` ago): the router has it and
        sends the Decode call to the request's decode instance."""
        self.router.prefilled(request)
        self.host.request_moved(now, request.prompt_tokens)
        if request.output_tokens == 1:  # nothing left to decode: its end is now
            self.host.request_moved(now, request.prompt_tokens)
            request.handed_off_s = request.transfer_start_s = request.transfer_end_s = request.first_token_s
            request.first_decode_token_s = request.finish_s = request.first_token_s
            return
        if self.settings.decode_pick == "handoff":
            self.router.place_decode_again(request)
        self.router.decode_started(request)
        wait_s = self._decode_call_wait_s(self.decode[request.decode_instance])
        if wait_s > 0:
            self._push(now + wait_s, DECODE_CALL, request)
        else:
            self._reach_decode(request, now)

    def _decode_call_wait_s(self, decode: DecodeSide) -> float:
        if self.settings.hops not in ("queued", "prefill-core"):
            return 0.0
        return decode_call_wait_s(decode.step_tokens, self.settings.serving.decode_cpu_s_per_token,
                                  id(decode) in self._stepping)

    def _reach_decode(self, request: SimRequest, now: float) -> None:
        """The Decode call is in the decode worker's engine: the request queues for its KV pull."""
        request.handed_off_s = now
        decode = self.decode[request.decode_instance]
        self._push_transfers(decode, decode.receive(request, now))
        self._dirty[id(decode)] = decode

    def _push_transfers(self, decode: Instance, started: list[SimRequest]) -> None:
        for request in started:
            self._push(request.transfer_end_s, TRANSFER_DONE, (decode, request))
