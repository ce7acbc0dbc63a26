"""The decode instance of a hybrid pool: a colocated instance that also takes pulled KV.

It is `ColocatedInstance` (a Local prompt is computed in its own steps, chunked within the token
budget alongside its running decodes, which stall for it) plus a decode instance's intake: a
request prefilled on a prefill instance waits for KV blocks and a `max_num_seqs` slot, pulls its
KV over the instance's `KvLink`, and joins the batch at the first step boundary after its pull, as
on a `DecodeInstance` (handed over while a step runs, its pull starts when that step ends). Pulled
requests are admitted as soon as they fit (on arrival to an idle engine and after every step);
Local prompts when a step is planned. vLLM keeps both in one FCFS queue: the order between
a pulled request and a Local prompt that wait at the same time is the one thing modelled loosely.
"""

from __future__ import annotations

from collections import deque

from planner.perf_model import PerfModel
from planner.simulator.config import SimSettings
from planner.simulator.instances import ColocatedInstance, KvLink, StepDone, engine_sees_at_step_end
from planner.simulator.state import ItlLog, SimRequest


class HybridInstance(ColocatedInstance):
    def __init__(self, index: int, settings: SimSettings, model: PerfModel, itl: ItlLog) -> None:
        super().__init__(index, settings, model, itl)
        self.pulls_waiting: deque[SimRequest] = deque()
        self._pulling = 0
        self._link = KvLink(settings, model)

    def admitted(self) -> int:
        return super().admitted() + self._pulling

    def receive(self, request: SimRequest, now: float) -> list[SimRequest]:
        """Queue a request prefilled elsewhere; returns the requests whose transfer starts now (none
        while a step runs: the engine sees it at the step's end, `engine_sees_at_step_end`; to an
        idle engine, `ServingCosts.idle_join_s` from now)."""
        self.pulls_waiting.append(request)
        if engine_sees_at_step_end(self._step_start_s):
            return []
        return self._admit_pulls(now + (self._settings.serving.idle_join_s if self.admitted() == 0 else 0.0))

    def _admit_pulls(self, now: float) -> list[SimRequest]:
        s, started = self._settings, []
        while self.pulls_waiting and self.admitted() < s.max_num_seqs:
            request = self.pulls_waiting[0]
            blocks = s.blocks_for(request.prompt_tokens + request.output_tokens)
            if self.used_blocks + blocks > s.num_kv_blocks:
                break
            self.pulls_waiting.popleft()
            request.blocks, self.used_blocks, self._pulling = blocks, self.used_blocks + blocks, self._pulling + 1
            self._link.pull(request, now)
            started.append(request)
        return started

    def transfer_done(self, request: SimRequest) -> None:
        self._pulling -= 1
        self._ready.append(request)

    def finish_step(self, now: float) -> StepDone:
        done = super().finish_step(now)
        done.transfers = self._admit_pulls(now)
        return done
