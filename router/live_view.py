"""The live state the placement policy reads, built from the pool and the router's own bookkeeping.

The registry says which workers are alive and how full their KV caches are (a heartbeat old);
this router knows exactly what it has sent and not yet seen come back. `LiveView` keeps the latter:
- `queued_prefill_tokens[worker]`: prompt tokens dispatched to a worker that has not yet produced
  their first token (a prefill worker's prompts, or a decode worker's Local prompts);
- `heads`: which of those prompts each worker is computing now, and since when
  (`router.policies.placement.head_of_queue`);
- `dispatched_prompts[worker]`: prompts ever dispatched there (a prompt whose count did not move
  until its first token shared no engine step with a later one);
- `assigned_decodes[worker]`: requests placed on a decode worker and not over yet;
- the prefix index: which prompts (and, on decode workers, prompt + output) each worker has
  computed, so a repeated prefix is routed where its KV already is.
`views(request)` turns that into the policy's `WorkerView`s, one per live worker.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from pdserve.roles import Topology
from router.policies.placement import PlacementConfig, WorkerView
from router.policies.placement.head_of_queue import HeadOfQueue
from router.policies.prefix_index import PrefixIndex
from router.pool import WorkerPool

DEFAULT_BLOCK_SIZE = 32   # until a worker reports its own


@dataclass(frozen=True)
class LocalPrefillRule:
    """Whether decode workers may compute prompts themselves (the Local path), by topology:
    hybrid and aggregated always; disaggregated only under `local_prefill_max_tokens` (the
    placement's cap), or when no prefill worker is alive (the decode worker is then the only way)."""

    topology: Topology
    local_prefill_max_tokens: int

    def accepts(self, any_prefill_alive: bool) -> bool:
        if self.topology in ("hybrid", "aggregated") or not any_prefill_alive:
            return True
        return self.local_prefill_max_tokens > 0


class LiveView:
    def __init__(self, pool: WorkerPool, topology: Topology, placement: PlacementConfig,
                 prefix_capacity_blocks: int = 65536):
        self.pool = pool
        self.configured_topology = topology  # the router's --topology; a published one overrides it
        self._local_prefill_max_tokens = placement.local_prefill_max_tokens
        self.queued_prefill_tokens: Counter[str] = Counter()
        self.queued_prefill_prompts: Counter[str] = Counter()  # the prompts those tokens are in
        self.dispatched_prompts: Counter[str] = Counter()  # every prompt ever dispatched to the worker
        self.heads = HeadOfQueue()
        self.assigned_decodes: Counter[str] = Counter()   # decode worker -> requests placed there, not yet over
        self._prefix_capacity_blocks = prefix_capacity_blocks
        self._prefix: PrefixIndex | None = None

    @property
    def rule(self) -> LocalPrefillRule:
        """The Local-path rule of the topology in force: the one the planner published for the
        cluster (read with the registry), else the router's own."""
        return LocalPrefillRule(self.pool.published_topology or self.configured_topology,
                                self._local_prefill_max_tokens)

    def prefix(self, block_size: int) -> PrefixIndex:
        """The prefix index, keyed by the workers' block size (made at the first request)."""
        if self._prefix is None or self._prefix.block_size != block_size:
            self._prefix = PrefixIndex(block_size, self._prefix_capacity_blocks)
        return self._prefix

    def booked(self, worker_id: str, tokens: int, now_s: float) -> int:
        """A prompt of `tokens` uncached tokens is sent to `worker_id` at `now_s`; returns its
        dispatch number there (its key in these books)."""
        self.dispatched_prompts[worker_id] += 1
        number = self.dispatched_prompts[worker_id]
        self.heads.book(worker_id, number, tokens, now_s)
        self.queued_prefill_tokens[worker_id] += tokens
        self.queued_prefill_prompts[worker_id] += 1
        return number

    def settled(self, worker_id: str, key: int, tokens: int, now_s: float) -> None:
        """The prompt `key` of `tokens` tokens booked on `worker_id` has its first token (or will
        never run) at `now_s`."""
        self.heads.settle(worker_id, key, now_s)
        left = self.queued_prefill_tokens[worker_id] - tokens
        self.queued_prefill_tokens[worker_id] = max(0, left)
        prompts_left = self.queued_prefill_prompts[worker_id] - 1
        self.queued_prefill_prompts[worker_id] = min(max(0, prompts_left), max(0, left))

    def views(self, prompt_token_ids: Sequence[int], extra_queued_tokens: int = 0,
              extra_queued_prompts: int = 0, cache_salt: str = "", now_s: float | None = None) -> list[WorkerView]:
        """Every live worker as the policy sees it for this prompt. `extra_queued_tokens` in
        `extra_queued_prompts` prompts are added to every worker's queue (the router's own queue
        ahead of this request, spread over them). `now_s` (the books' clock): what each worker
        has spent on its first queued prompt is credited (None: nothing is)."""
        prefill, decode = self.pool.workers("prefill"), self.pool.workers("decode")
        accepts_local = self.rule.accepts(bool(prefill))
        block_size = next((w.block_size for w in prefill + decode if w.block_size), DEFAULT_BLOCK_SIZE)
        index = self._fresh_prefix(block_size, prefill + decode)
        cached = index.match_all(prompt_token_ids, cache_salt)  # one hash of the prompt, no LRU touch
        views = []
        for record in prefill + decode:
            kv_free = record.kv_blocks_total - record.kv_blocks_used if record.kv_blocks_total else 1 << 30
            views.append(WorkerView(
                worker_id=record.worker_id, role=record.role, accepts_local_prefill=accepts_local,
                queued_prefill_tokens=self.queued_prefill_tokens[record.worker_id] + extra_queued_tokens,
                queued_prefill_prompts=self.queued_prefill_prompts[record.worker_id] + extra_queued_prompts,
                **({} if now_s is None else self.heads.view_fields(record.worker_id, now_s)),
                running_decodes=self._decodes_at(record) if record.role == "decode" else 0,
                kv_blocks_free=max(0, kv_free), block_size=record.block_size or block_size,
                cached_prefix_tokens=cached.get(record.worker_id, 0)))
        return views

    def _fresh_prefix(self, block_size: int, live: list) -> PrefixIndex:
        """The prefix index kept true to the pool: a worker that left the registry is forgotten (a
        replacement under the same id starts with an empty cache), and each live worker's capacity
        is its engine's KV blocks once it reports them."""
        index = self.prefix(block_size)
        registered = self.pool.registered_ids()
        for worker_id in index.workers():
            if worker_id not in registered:
                index.forget_worker(worker_id)
        for record in live:
            if record.kv_blocks_total and index.capacity_of(record.worker_id) != record.kv_blocks_total:
                index.set_capacity(record.worker_id, record.kv_blocks_total)
        return index

    def _decodes_at(self, record) -> int:
        """Requests that run or will run their decode there: placed by this router and not over
        (a burst placed before any of its prefills ends counts at once, so it spreads), or its
        decode calls in flight (a retry placed by least-loaded), whichever is more."""
        return max(self.assigned_decodes[record.worker_id], self.pool.inflight(record.worker_id))

    def computing_records(self) -> list:
        """The live workers that compute prompts: every prefill worker, and the decode workers where
        the rule lets them take prompts (local prefill, or no prefill worker alive)."""
        prefill = self.pool.workers("prefill")
        return prefill + (self.pool.workers("decode") if self.rule.accepts(bool(prefill)) else [])

    def computing_workers(self) -> int:
        """How many workers compute prompts (the router's queue is spread over them)."""
        return len(self.computing_records())