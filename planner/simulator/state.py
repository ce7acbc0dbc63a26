"""The simulator's mutable pieces: one request's timeline, a decode batch, the ITL log."""

from __future__ import annotations

import heapq


class SimRequest:
    """One request's life in the simulation. Times are absolute seconds; None = not reached.

    `handed_off_s`: when the router's Decode call reached its decode instance (the end of the
    handoff's hops; the first token for a prompt computed where it decodes, or a one-token one).

    Invariant at the end of a run: arrival_s <= prefill_start_s <= first_token_s <= handed_off_s <=
    transfer_start_s <= transfer_end_s <= first_decode_token_s <= finish_s (colocated and
    single-token requests have no transfer: those two equal first_token_s); or, for a request the
    router refused at arrival (`refused`), every time but arrival_s is None and no instance has it.
    """

    __slots__ = ("index", "arrival_s", "prompt_tokens", "output_tokens", "prefilled_tokens", "blocks",
                 "prefill_start_s", "first_token_s", "handed_off_s", "transfer_start_s", "transfer_end_s",
                 "first_decode_token_s", "finish_s", "prefill_instance", "decode_instance", "join_step",
                 "join_context", "refused", "hop_stretch", "hop_wait_s")

    def __init__(self, index: int, arrival_s: float, prompt_tokens: int, output_tokens: int) -> None:
        self.index = index
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.prefilled_tokens = 0
        self.blocks = 0
        self.prefill_start_s: float | None = None
        self.first_token_s: float | None = None
        self.handed_off_s: float | None = None
        self.transfer_start_s: float | None = None
        self.transfer_end_s: float | None = None
        self.first_decode_token_s: float | None = None
        self.finish_s: float | None = None
        self.prefill_instance: int | None = None  # where the router sent it (None: computed Local)
        self.decode_instance: int | None = None
        self.join_step = 0
        self.join_context = 0
        self.hop_stretch = 1.0  # the host's stretch of its first token's hops (`planner.simulator.host`)
        self.hop_wait_s = 0.0  # and what each waits in the router behind outputs (`SimSettings.hops` "queued")
        self.refused = False  # the router's admission refused it at arrival: it never ran, every time stays None


class DecodeBatch:
    """The running decode requests of one instance, in O(log n) per join/finish and O(1) per step.

    Each step every member emits one token and its context grows by one, so the batch keeps
    only totals: a member that joins with `tokens_left` finishes exactly `tokens_left` steps later.
    `context_tokens` is the sum over members of the tokens each one attends to in the next step.
    """

    def __init__(self) -> None:
        self.steps_done = 0
        self.size = 0
        self.context_tokens = 0
        self._finish_heap: list[tuple[int, int, SimRequest]] = []

    def join(self, request: SimRequest, tokens_left: int, context_tokens: int) -> None:
        request.join_step = self.steps_done
        request.join_context = context_tokens
        heapq.heappush(self._finish_heap, (self.steps_done + tokens_left, request.index, request))
        self.size += 1
        self.context_tokens += context_tokens

    def advance(self) -> list[SimRequest]:
        """One step done: every member emitted a token. Returns the members that are now finished."""
        self.steps_done += 1
        self.context_tokens += self.size
        finished = []
        while self._finish_heap and self._finish_heap[0][0] == self.steps_done:
            request = heapq.heappop(self._finish_heap)[2]
            self.size -= 1
            self.context_tokens -= request.join_context + (self.steps_done - request.join_step)
            finished.append(request)
        return finished


class ItlLog:
    """Inter-token latencies without storing every token: a decode step of duration d gives d to
    each member already past its first decode token (`weight` of them); a request's first decode
    token gives its own gap from the first token (handoff: queueing + KV transfer + one step)."""

    def __init__(self) -> None:
        self.step_s: list[float] = []
        self.weight: list[int] = []

    def record_step(self, duration_s: float, members_past_first: int) -> None:
        if members_past_first > 0:
            self.step_s.append(duration_s)
            self.weight.append(members_past_first)
