"""The router's placement, admission and dispatch order, end to end in the lifecycle, against
scripted workers (tests/unit/router/scripted_workers.py): which worker gets which call, in which
order, and what is refused before any call. Real engines: tests/integration/test_placement_cluster.py."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from kv_transfer.handle import KVHandle
from pdserve.errors import Overloaded
from pdserve.sampling import Sampling
from pdserve.worker_api import DecodeChunk, PrefillRequest, PrefillResult
from router.lifecycle import RouterConfig
from router.policies.placement import PlacementConfig
from router.scheduler import DEFAULT_COST, SchedulerConfig, SloTargets
from router.types import GenerationRequest
from scripted_workers import ScriptedWorker, scripted_cluster

LONG = [100 + i % 1000 for i in range(2000)]   # DEFAULT_COST: ~1 s of prefill
SHORT = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
GREEDY = Sampling(max_tokens=2, temperature=0.0, ignore_eos=True)


class HeldPrefillWorker(ScriptedWorker):
    """A prefill worker whose first prefill waits for `unblock` (a long prompt being computed);
    every prefill it receives is recorded in order."""

    def __init__(self, first_token_id: int = 5, hold_all: bool = False):
        super().__init__(prefill=PrefillResult(first_token_id, False, kv_handle=KVHandle("t", "h:1", "p", (1,), 3)))
        self.unblock = asyncio.Event()
        self.hold_all = hold_all   # every prefill waits, not only the first

    async def prefill(self, request: PrefillRequest, timeout_s: float) -> PrefillResult:
        self.prefills.append(request)
        if len(self.prefills) == 1 or self.hold_all:
            await self.unblock.wait()
        return self.prefill_script


def _decoder(tokens=(6,)) -> ScriptedWorker:
    return ScriptedWorker(decode=[DecodeChunk(tuple(tokens), finished=True, finish_reason="length")] * 8)


def _config(**scheduler) -> RouterConfig:
    return RouterConfig(max_model_len=4096, scheduler=SchedulerConfig(**scheduler))


async def _served(lifecycle, request_id: str, prompt: list[int], slo_class: str = "") -> list[int]:
    request = GenerationRequest(request_id, prompt, GREEDY, slo_class)
    lifecycle.admit(request)
    return [t async for chunk in lifecycle.generate(request) for t in chunk.token_ids]


async def _until(condition, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out waiting for the router"
        await asyncio.sleep(0.01)


async def test_a_short_prompt_behind_a_long_prefill_queue_is_computed_on_the_decode_worker(redis_server, tokenizer):
    prefill, decode = HeldPrefillWorker(), _decoder()
    config = _config(topology="hybrid", placement=PlacementConfig(local_prefill_max_tokens=512))
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": decode}, config)
    try:
        long_request = asyncio.create_task(_served(lifecycle, "long", LONG))  # over the local cap: remote
        await _until(lambda: len(prefill.prefills) == 1)
        assert await _served(lifecycle, "short", SHORT) == [6]
        assert [p.request_id for p in prefill.prefills] == ["long"]   # the short one never queued there
        assert [(d.request_id, d.kv_handle) for d in decode.decodes] == [("short", None)]  # computed locally
        prefill.unblock.set()
        assert await long_request == [5, 6]
        assert decode.decodes[-1].request_id == "long" and decode.decodes[-1].kv_handle is not None
    finally:
        await pool.close()
        await registry.close()


async def test_a_disaggregated_cluster_never_prefills_on_a_decode_worker_while_a_prefill_worker_lives(
        redis_server, tokenizer):
    prefill, decode = HeldPrefillWorker(), _decoder()
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": decode}, _config())
    try:
        long_request = asyncio.create_task(_served(lifecycle, "long", LONG))
        await _until(lambda: len(prefill.prefills) == 1)
        assert await _served(lifecycle, "short", SHORT) == [5, 6]   # behind the long one, yet remote
        assert [p.request_id for p in prefill.prefills] == ["long", "short"]
        assert decode.decodes[0].request_id == "short" and decode.decodes[0].kv_handle is not None
        prefill.unblock.set()
        assert await long_request == [5, 6]
    finally:
        await pool.close()
        await registry.close()


async def test_a_request_that_cannot_meet_its_ttft_is_refused_with_a_retry_time_and_costs_no_worker_call(
        redis_server, tokenizer):
    prefill, decode = ScriptedWorker(prefill=PrefillResult(5, True, "length")), _decoder()
    config = _config(slo=SloTargets(ttft_s=0.1), cost_prior=DEFAULT_COST)
    config = replace(config, max_model_len=8192)
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": decode}, config)
    try:
        with pytest.raises(Overloaded, match="time to first token") as refused:
            lifecycle.admit(GenerationRequest("long", LONG, GREEDY))  # ~1.02 s predicted, limit 0.1 s
        assert refused.value.retry_after_s == 1.0   # the floor (min_retry_after_s)
        with pytest.raises(Overloaded) as refused:
            lifecycle.admit(GenerationRequest("longer", LONG + LONG[:1500], GREEDY))  # ~1.77 s predicted
        assert refused.value.retry_after_s == 2.0   # ceil(1.77 - 0.1): the predicted drain time
        assert (prefill.prefills, decode.decodes) == ([], [])
        assert await _served(lifecycle, "short", SHORT) == [5]     # ~0.025 s: admitted
    finally:
        await pool.close()
        await registry.close()


async def test_a_full_decode_batch_is_refused_on_tpot_before_any_worker_call(redis_server, tokenizer):
    prefill, decode = ScriptedWorker(prefill=PrefillResult(5, True, "length")), _decoder()
    config = _config(slo=SloTargets(tpot_s=0.010), cost_prior=DEFAULT_COST)   # a step is >= 15 ms
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": decode}, config)
    try:
        with pytest.raises(Overloaded, match="time per output token 16.0 ms exceeds the limit of 10.0 ms") as refused:
            lifecycle.admit(GenerationRequest("short", SHORT, GREEDY))
        assert refused.value.retry_after_s == 1.0
        assert (prefill.prefills, decode.decodes) == ([], [])
    finally:
        await pool.close()
        await registry.close()


async def test_served_requests_teach_admission_how_far_its_predictions_were(redis_server, tokenizer):
    prefill, decode = ScriptedWorker(prefill=PrefillResult(5, False, kv_handle=KVHandle("t", "h:1", "p", (1,), 3))), \
        _decoder(tokens=(6, 7, 8))
    config = _config(slo=SloTargets(ttft_s=0.05, tpot_s=0.05), cost_prior=DEFAULT_COST)
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": decode}, config)
    try:
        for i in range(3):
            assert await _served(lifecycle, f"r{i}", SHORT) == [5, 6, 7, 8]
        ttft, tpot = lifecycle.scheduler.calibration["ttft"], lifecycle.scheduler.calibration["tpot"]
        assert len(ttft) == 3 and len(tpot) == 3   # each predicted >= a quarter of its SLO: every one kept
        assert lifecycle.scheduler.scale().ttft == 1.0   # too few yet to scale anything
    finally:
        await pool.close()
        await registry.close()


async def test_the_router_exports_admissions_calibration_at_scrape_time(redis_server, tokenizer):
    from prometheus_client import REGISTRY

    from pdserve import metrics

    def sample(name: str, quantity: str):
        return REGISTRY.get_sample_value(name, {"quantity": quantity})

    prefill, decode = ScriptedWorker(prefill=PrefillResult(5, False, kv_handle=KVHandle("t", "h:1", "p", (1,), 3))), \
        _decoder(tokens=(6, 7, 8))
    config = _config(slo=SloTargets(ttft_s=0.05, tpot_s=0.05), cost_prior=DEFAULT_COST)
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": decode}, config)
    metrics.ROUTER_ADMISSION_CALIBRATION.source = lifecycle.scheduler.calibration_rows
    try:
        assert [sample("pdserve_router_admission_calibration_observations", q) for q in ("ttft", "tpot")] == [0, 0]
        for i in range(3):
            assert await _served(lifecycle, f"r{i}", SHORT) == [5, 6, 7, 8]
        assert [sample("pdserve_router_admission_calibration_observations", q) for q in ("ttft", "tpot")] == [3, 3]
        assert [sample("pdserve_router_admission_scale_ratio", q) for q in ("ttft", "tpot")] == [1.0, 1.0]  # too few
        # enough of them, each seen at twice its prediction: the factor admission now applies
        ttft = lifecycle.scheduler.calibration["ttft"]
        now_s = lifecycle.scheduler.clock()
        for _ in range(ttft.config.min_observations):
            ttft.observe(0.04, 0.08, 0.05, now_s)
        assert sample("pdserve_router_admission_scale_ratio", "ttft") == pytest.approx(2.0)
        assert sample("pdserve_router_admission_scale_ratio", "ttft") == lifecycle.scheduler.scale().ttft
        assert sample("pdserve_router_admission_calibration_observations", "ttft") == 3 + ttft.config.min_observations
    finally:
        metrics.ROUTER_ADMISSION_CALIBRATION.source = None
        await pool.close()
        await registry.close()
    assert sample("pdserve_router_admission_scale_ratio", "ttft") is None   # no router: no rows


async def test_a_router_judging_no_slo_exports_no_calibration(redis_server, tokenizer):
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": ScriptedWorker(), "decode-a": _decoder()},
                                                       _config())
    try:
        assert lifecycle.scheduler.calibration_rows() == []
    finally:
        await pool.close()
        await registry.close()


async def test_interactive_requests_overtake_batch_ones_in_the_router_queue(redis_server, tokenizer):
    prefill, decode = HeldPrefillWorker(), _decoder()
    gate_one = PlacementConfig(max_queued_prefill_tokens_per_worker=1)  # one prompt at a time per worker
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": decode},
                                                       _config(placement=gate_one))
    try:
        first = asyncio.create_task(_served(lifecycle, "first", SHORT))
        await _until(lambda: len(prefill.prefills) == 1)
        waiting = [asyncio.create_task(_served(lifecycle, rid, SHORT, cls))
                   for rid, cls in (("batch-1", "batch"), ("batch-2", "batch"), ("interactive-1", "interactive"))]
        await _until(lambda: len(lifecycle.scheduler.queue) == 3)
        prefill.unblock.set()
        await asyncio.gather(first, *waiting)
        assert [p.request_id for p in prefill.prefills] == ["first", "interactive-1", "batch-1", "batch-2"]
    finally:
        await pool.close()
        await registry.close()


async def test_a_repeated_prefix_goes_to_the_worker_that_holds_it(redis_server, tokenizer):
    workers = {"decode-a": _decoder(), "decode-b": _decoder()}
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer, workers,
                                                       _config(topology="aggregated"))
    conversation = [200 + i for i in range(64)]   # two full blocks of 32
    try:
        assert await _served(lifecycle, "turn-1", conversation) == [6]
        served_on = workers["decode-a"].decodes and "decode-a" or "decode-b"
        other = "decode-b" if served_on == "decode-a" else "decode-a"
        index = lifecycle.scheduler.live.prefix(32)
        assert index.longest_prefix_tokens(served_on, conversation + [1]) == 64   # learnt when served
        index.forget_worker(served_on)
        index.record(other, conversation)   # now only the other worker holds it
        assert await _served(lifecycle, "turn-2", conversation + [300, 301]) == [6]
        assert [d.request_id for d in workers[other].decodes] == ["turn-2"]
    finally:
        await pool.close()
        await registry.close()


async def test_a_request_cancelled_while_queued_or_just_dispatched_leaves_no_tokens_on_the_books(
        redis_server, tokenizer):
    prefill, decode = HeldPrefillWorker(), _decoder()
    gate_one = PlacementConfig(max_queued_prefill_tokens_per_worker=1)
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": decode},
                                                       _config(placement=gate_one))
    books, prompts = lifecycle.scheduler.live.queued_prefill_tokens, lifecycle.scheduler.live.queued_prefill_prompts
    try:
        first = asyncio.create_task(_served(lifecycle, "first", SHORT))
        await _until(lambda: len(prefill.prefills) == 1)
        queued = asyncio.create_task(_served(lifecycle, "queued", SHORT))
        await _until(lambda: len(lifecycle.scheduler.queue) == 1)
        queued.cancel()
        await asyncio.gather(queued, return_exceptions=True)
        assert len(lifecycle.scheduler.queue) == 0 and books["prefill-a"] == len(SHORT)  # only the first's
        assert prompts["prefill-a"] == 1
        prefill.unblock.set()
        assert await first == [5, 6]
        assert books["prefill-a"] == 0 and prompts["prefill-a"] == 0
        assert await _served(lifecycle, "after", SHORT) == [5, 6] and books["prefill-a"] == 0
        assert prompts["prefill-a"] == 0
    finally:
        await pool.close()
        await registry.close()


async def test_a_request_whose_paths_are_gated_does_not_hold_back_one_that_can_go(redis_server, tokenizer):
    prefill, decode = HeldPrefillWorker(), _decoder()
    config = _config(topology="hybrid", placement=PlacementConfig(local_prefill_max_tokens=512,
                                                                  max_queued_prefill_tokens_per_worker=1000))
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": decode}, config)
    try:
        first = asyncio.create_task(_served(lifecycle, "long-1", LONG))
        await _until(lambda: len(prefill.prefills) == 1)
        second = asyncio.create_task(_served(lifecycle, "long-2", LONG))   # gated: waits in the router
        await _until(lambda: len(lifecycle.scheduler.queue) == 1)
        await asyncio.sleep(0.05)   # long-2 ages ahead of any newcomer
        assert await _served(lifecycle, "short", SHORT) == [6]   # Local, past the gated long-2
        assert len(lifecycle.scheduler.queue) == 1
        prefill.unblock.set()
        assert (await first, await second) == ([5, 6], [5, 6])
    finally:
        await pool.close()
        await registry.close()


async def test_with_no_prefill_worker_alive_a_decode_worker_computes_prompts_past_the_local_cap(
        redis_server, tokenizer):
    decode = _decoder()
    config = _config(placement=PlacementConfig(local_prefill_max_tokens=64))
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer, {"decode-a": decode}, config)
    try:
        assert await _served(lifecycle, "long", LONG) == [6]
        assert [(d.request_id, d.kv_handle) for d in decode.decodes] == [("long", None)]
    finally:
        await pool.close()
        await registry.close()


async def test_two_requests_with_the_same_id_are_both_served(redis_server, tokenizer):
    prefill, decode = HeldPrefillWorker(), _decoder()
    gate_one = PlacementConfig(max_queued_prefill_tokens_per_worker=1)
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": decode},
                                                       _config(placement=gate_one))
    try:
        both = [asyncio.create_task(_served(lifecycle, "same-id", SHORT)) for _ in range(2)]
        await _until(lambda: len(prefill.prefills) == 1 and len(lifecycle.scheduler.queue) == 1)
        prefill.unblock.set()
        assert [await task for task in both] == [[5, 6], [5, 6]]
    finally:
        await pool.close()
        await registry.close()


async def test_a_request_that_waits_too_long_in_the_router_is_refused_with_a_retry_time(redis_server, tokenizer):
    prefill, decode = HeldPrefillWorker(), _decoder()
    config = _config(placement=PlacementConfig(max_queued_prefill_tokens_per_worker=1), max_queue_wait_s=0.3)
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": decode}, config)
    try:
        first = asyncio.create_task(_served(lifecycle, "first", SHORT))
        await _until(lambda: len(prefill.prefills) == 1)
        with pytest.raises(Overloaded, match="waited 0.3 s in the router's queue") as refused:
            await _served(lifecycle, "second", SHORT)
        assert refused.value.retry_after_s == 1.0 and len(lifecycle.scheduler.queue) == 0
        prefill.unblock.set()
        assert await first == [5, 6]
    finally:
        await pool.close()
        await registry.close()


def test_no_ttft_slo_means_admission_never_refuses_for_load():
    assert SchedulerConfig().slo == SloTargets(None, None)
    with pytest.raises(ValueError, match="TTFT SLO must be > 0"):
        SloTargets(ttft_s=0.0)
    assert replace(SchedulerConfig(), topology="hybrid").topology == "hybrid"


async def test_a_burst_placed_before_any_prefill_ends_spreads_over_the_decode_workers(redis_server, tokenizer):
    """Decode workers count requests placed on them at once, not when their Decode call starts: a
    burst that arrives while every prefill is still running must not all tie onto one worker."""
    prefill = HeldPrefillWorker(hold_all=True)
    decoders = {"decode-a": _decoder(), "decode-b": _decoder()}
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer, {"prefill-a": prefill, **decoders},
                                                       _config())
    try:
        burst = [asyncio.create_task(_served(lifecycle, f"r{i}", SHORT)) for i in range(4)]
        await _until(lambda: len(prefill.prefills) == 4)   # all four placed while r0's prefill runs
        assert dict(lifecycle.scheduler.live.assigned_decodes) == {"decode-a": 2, "decode-b": 2}
        prefill.unblock.set()
        await asyncio.gather(*burst)
        assert sorted(len(w.decodes) for w in decoders.values()) == [2, 2]
        assert sum(lifecycle.scheduler.live.assigned_decodes.values()) == 0   # given back when each ended
    finally:
        await pool.close()
        await registry.close()


async def test_only_prompts_computed_alone_teach_the_prefill_fit(redis_server, tokenizer):
    """vLLM fills a step's token budget from every waiting prompt, so a prompt dispatched beside
    another reports the other's compute as its own: the router's prefill fit must not learn from
    it (fitted, it inflated every later prediction and admission refused what it could serve)."""
    prefill = HeldPrefillWorker(hold_all=True)
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": _decoder()}, _config())
    try:
        burst = [asyncio.create_task(_served(lifecycle, f"b{i}", SHORT[: 4 + i])) for i in range(2)]
        await _until(lambda: len(prefill.prefills) == 2)   # b1 queued behind b0, and after b0's dispatch
        prefill.unblock.set()
        await asyncio.gather(*burst)
        assert len(lifecycle.scheduler.fit) == 0
        for i in range(3):   # one at a time: each alone on the worker
            await _served(lifecycle, f"s{i}", SHORT[: 5 + i])
        assert len(lifecycle.scheduler.fit) == 3
        assert sum(lifecycle.scheduler.live.queued_prefill_prompts.values()) == 0
    finally:
        await pool.close()
        await registry.close()


async def test_a_prompt_being_computed_is_charged_only_what_is_left_of_it(redis_server, tokenizer):
    """A request behind a long prefill is predicted the rest of that prefill, not all of it again:
    charged in full, a prompt about to finish made admission refuse long prompts that would have
    met their SLO."""
    prefill = HeldPrefillWorker()
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": _decoder()}, _config())
    now_s = [100.0]
    lifecycle.scheduler.clock = lambda: now_s[0]   # the books' clock, moved by hand
    try:
        long_request = asyncio.create_task(_served(lifecycle, "long", LONG))   # DEFAULT_COST: ~1 s of prefill
        await _until(lambda: len(prefill.prefills) == 1)
        behind = GenerationRequest("behind", SHORT, GREEDY)
        first = lifecycle.scheduler.expected(behind).ttft_s
        now_s[0] += 0.3
        later = lifecycle.scheduler.expected(behind).ttft_s
        assert first - later == pytest.approx(0.3, abs=1e-9)
        prefill.unblock.set()
        await long_request
    finally:
        await pool.close()
        await registry.close()
