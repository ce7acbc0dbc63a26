"""The router's placement and dispatch order, end to end in the lifecycle, against scripted
workers (tests/unit/router/scripted_workers.py): which worker gets which call, and in which order.
What is refused before any call: test_admission_walk.py. Real engines:
tests/integration/test_placement_cluster.py."""

from __future__ import annotations

import asyncio

import pytest

from lifecycle_walk import GREEDY, LONG, SHORT, HeldPrefillWorker, decoder, router_config, served, until
from router.policies.placement import PlacementConfig
from router.types import GenerationRequest
from scripted_workers import scripted_cluster


async def gated_disaggregated(redis_server, tokenizer):
    """1P+1D whose prefill worker takes one prompt at a time (a gate of one token) and holds it
    until `unblock`: (that worker, lifecycle, pool, registry)."""
    prefill = HeldPrefillWorker()
    lifecycle, pool, registry = await scripted_cluster(
        redis_server, tokenizer, {"prefill-a": prefill, "decode-a": decoder()},
        router_config(placement=PlacementConfig(max_queued_prefill_tokens_per_worker=1)))
    return prefill, lifecycle, pool, registry


async def test_a_short_prompt_behind_a_long_prefill_queue_is_computed_on_the_decode_worker(redis_server, tokenizer):
    prefill, decode = HeldPrefillWorker(), decoder()
    config = router_config(topology="hybrid", placement=PlacementConfig(local_prefill_max_tokens=512))
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": decode}, config)
    try:
        long_request = asyncio.create_task(served(lifecycle, "long", LONG))  # over the local cap: remote
        await until(lambda: len(prefill.prefills) == 1)
        assert await served(lifecycle, "short", SHORT) == [6]
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
    prefill, decode = HeldPrefillWorker(), decoder()
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": decode}, router_config())
    try:
        long_request = asyncio.create_task(served(lifecycle, "long", LONG))
        await until(lambda: len(prefill.prefills) == 1)
        assert await served(lifecycle, "short", SHORT) == [5, 6]   # behind the long one, yet remote
        assert [p.request_id for p in prefill.prefills] == ["long", "short"]
        assert decode.decodes[0].request_id == "short" and decode.decodes[0].kv_handle is not None
        prefill.unblock.set()
        assert await long_request == [5, 6]
    finally:
        await pool.close()
        await registry.close()


async def test_interactive_requests_overtake_batch_ones_in_the_router_queue(redis_server, tokenizer):
    prefill, decode = HeldPrefillWorker(), decoder()
    gate_one = PlacementConfig(max_queued_prefill_tokens_per_worker=1)  # one prompt at a time per worker
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": decode},
                                                       router_config(placement=gate_one))
    try:
        first = asyncio.create_task(served(lifecycle, "first", SHORT))
        await until(lambda: len(prefill.prefills) == 1)
        waiting = [asyncio.create_task(served(lifecycle, rid, SHORT, cls))
                   for rid, cls in (("batch-1", "batch"), ("batch-2", "batch"), ("interactive-1", "interactive"))]
        await until(lambda: len(lifecycle.scheduler.queue) == 3)
        prefill.unblock.set()
        await asyncio.gather(first, *waiting)
        assert [p.request_id for p in prefill.prefills] == ["first", "interactive-1", "batch-1", "batch-2"]
    finally:
        await pool.close()
        await registry.close()


async def test_a_queue_behind_a_gated_prefill_worker_is_not_ranked_again_until_the_gate_opens(
        redis_server, tokenizer):
    # in 1P+1D the decode worker computes no prompt: its empty queue must not count as an open gate,
    # or every arrival, settle and 0.1 s tick ranks every queued request again (the router's CPU under
    # load, on the prefill worker's core, went there: BENCHMARKS "The router's dispatch queue under load")
    prefill, lifecycle, pool, registry = await gated_disaggregated(redis_server, tokenizer)
    scheduler, rankings, pumps = lifecycle.scheduler, [], []
    ranked, pump = scheduler.ranked, scheduler._pump
    scheduler.ranked = lambda request, *args: rankings.append(request.request_id) or ranked(request, *args)
    scheduler._pump = lambda: pumps.append(1) or pump()
    try:
        first = asyncio.create_task(served(lifecycle, "first", SHORT))
        await until(lambda: len(prefill.prefills) == 1)
        waiting = [asyncio.create_task(served(lifecycle, f"queued-{i}", SHORT)) for i in range(4)]
        await until(lambda: len(scheduler.queue) == 4)
        rankings.clear(), pumps.clear()
        await until(lambda: len(pumps) >= 3)   # three of the queue's re-pump ticks, the gate shut throughout
        assert rankings == []
        prefill.unblock.set()
        await asyncio.gather(first, *waiting)
        assert [p.request_id for p in prefill.prefills] == ["first"] + [f"queued-{i}" for i in range(4)]
    finally:
        await pool.close()
        await registry.close()


async def test_a_repeated_prefix_goes_to_the_worker_that_holds_it(redis_server, tokenizer):
    workers = {"decode-a": decoder(), "decode-b": decoder()}
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer, workers,
                                                       router_config(topology="aggregated"))
    conversation = [200 + i for i in range(64)]   # two full blocks of 32
    try:
        assert await served(lifecycle, "turn-1", conversation) == [6]
        served_on = workers["decode-a"].decodes and "decode-a" or "decode-b"
        other = "decode-b" if served_on == "decode-a" else "decode-a"
        index = lifecycle.scheduler.live.prefix(32)
        assert index.longest_prefix_tokens(served_on, conversation + [1]) == 64   # learnt when served
        index.forget_worker(served_on)
        index.record(other, conversation)   # now only the other worker holds it
        assert await served(lifecycle, "turn-2", conversation + [300, 301]) == [6]
        assert [d.request_id for d in workers[other].decodes] == ["turn-2"]
    finally:
        await pool.close()
        await registry.close()


async def test_a_request_cancelled_while_queued_or_just_dispatched_leaves_no_tokens_on_the_books(
        redis_server, tokenizer):
    prefill, lifecycle, pool, registry = await gated_disaggregated(redis_server, tokenizer)
    books, prompts = lifecycle.scheduler.live.queued_prefill_tokens, lifecycle.scheduler.live.queued_prefill_prompts
    try:
        first = asyncio.create_task(served(lifecycle, "first", SHORT))
        await until(lambda: len(prefill.prefills) == 1)
        queued = asyncio.create_task(served(lifecycle, "queued", SHORT))
        await until(lambda: len(lifecycle.scheduler.queue) == 1)
        queued.cancel()
        await asyncio.gather(queued, return_exceptions=True)
        assert len(lifecycle.scheduler.queue) == 0 and books["prefill-a"] == len(SHORT)  # only the first's
        assert prompts["prefill-a"] == 1
        prefill.unblock.set()
        assert await first == [5, 6]
        assert books["prefill-a"] == 0 and prompts["prefill-a"] == 0
        assert await served(lifecycle, "after", SHORT) == [5, 6] and books["prefill-a"] == 0
        assert prompts["prefill-a"] == 0
    finally:
        await pool.close()
        await registry.close()


async def test_a_request_whose_paths_are_gated_does_not_hold_back_one_that_can_go(redis_server, tokenizer):
    prefill, decode = HeldPrefillWorker(), decoder()
    config = router_config(topology="hybrid", placement=PlacementConfig(local_prefill_max_tokens=512,
                                                                  max_queued_prefill_tokens_per_worker=1000))
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": decode}, config)
    try:
        first = asyncio.create_task(served(lifecycle, "long-1", LONG))
        await until(lambda: len(prefill.prefills) == 1)
        second = asyncio.create_task(served(lifecycle, "long-2", LONG))   # gated: waits in the router
        await until(lambda: len(lifecycle.scheduler.queue) == 1)
        await asyncio.sleep(0.05)   # long-2 ages ahead of any newcomer
        assert await served(lifecycle, "short", SHORT) == [6]   # Local, past the gated long-2
        assert len(lifecycle.scheduler.queue) == 1
        prefill.unblock.set()
        assert (await first, await second) == ([5, 6], [5, 6])
    finally:
        await pool.close()
        await registry.close()


async def test_with_no_prefill_worker_alive_a_decode_worker_computes_prompts_past_the_local_cap(
        redis_server, tokenizer):
    decode = decoder()
    config = router_config(placement=PlacementConfig(local_prefill_max_tokens=64))
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer, {"decode-a": decode}, config)
    try:
        assert await served(lifecycle, "long", LONG) == [6]
        assert [(d.request_id, d.kv_handle) for d in decode.decodes] == [("long", None)]
    finally:
        await pool.close()
        await registry.close()


async def test_two_requests_with_the_same_id_are_both_served(redis_server, tokenizer):
    prefill, lifecycle, pool, registry = await gated_disaggregated(redis_server, tokenizer)
    try:
        both = [asyncio.create_task(served(lifecycle, "same-id", SHORT)) for _ in range(2)]
        await until(lambda: len(prefill.prefills) == 1 and len(lifecycle.scheduler.queue) == 1)
        prefill.unblock.set()
        assert [await task for task in both] == [[5, 6], [5, 6]]
    finally:
        await pool.close()
        await registry.close()


async def test_a_burst_placed_before_any_prefill_ends_spreads_over_the_decode_workers(redis_server, tokenizer):
    """Decode workers count requests placed on them at once, not when their Decode call starts: a
    burst that arrives while every prefill is still running must not all tie onto one worker."""
    prefill = HeldPrefillWorker(hold_all=True)
    decoders = {"decode-a": decoder(), "decode-b": decoder()}
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer, {"prefill-a": prefill, **decoders},
                                                       router_config())
    try:
        burst = [asyncio.create_task(served(lifecycle, f"r{i}", SHORT)) for i in range(4)]
        await until(lambda: len(prefill.prefills) == 4)   # all four placed while r0's prefill runs
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
                                                       {"prefill-a": prefill, "decode-a": decoder()}, router_config())
    try:
        burst = [asyncio.create_task(served(lifecycle, f"b{i}", SHORT[: 4 + i])) for i in range(2)]
        await until(lambda: len(prefill.prefills) == 2)   # b1 queued behind b0, and after b0's dispatch
        prefill.unblock.set()
        await asyncio.gather(*burst)
        assert len(lifecycle.scheduler.fit) == 0
        for i in range(3):   # one at a time: each alone on the worker
            await served(lifecycle, f"s{i}", SHORT[: 5 + i])
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
                                                       {"prefill-a": prefill, "decode-a": decoder()}, router_config())
    now_s = [100.0]
    lifecycle.scheduler.clock = lambda: now_s[0]   # the books' clock, moved by hand
    try:
        long_request = asyncio.create_task(served(lifecycle, "long", LONG))   # DEFAULT_COST: ~1 s of prefill
        await until(lambda: len(prefill.prefills) == 1)
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
