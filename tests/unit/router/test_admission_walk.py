"""The router's admission, end to end in the lifecycle, against scripted workers
(tests/unit/router/scripted_workers.py): what is refused before any worker call and with which
retry time, how served requests calibrate admission's predictions, and what the router exports of
that calibration. Placement and dispatch order: test_placement_walk.py."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import replace

import pytest

from kv_transfer.handle import KVHandle
from lifecycle_walk import GREEDY, LONG, SHORT, HeldPrefillWorker, decoder, router_config, served, until
from pdserve.errors import ADMISSION_REFUSED_BY, Overloaded
from pdserve.worker_api import PrefillResult
from router.policies.calibration import pooled_quantile
from router.policies.placement import PlacementConfig
from router.scheduler import DEFAULT_COST, SchedulerConfig, SloTargets
from router.types import GenerationRequest
from scripted_workers import ScriptedWorker, scripted_cluster


def refusals_by() -> Counter:
    """`pdserve_router_admission_refusals_total` now, by its `by` label (process-wide counters:
    tests compare before and after)."""
    from prometheus_client import REGISTRY

    return Counter({kind: REGISTRY.get_sample_value("pdserve_router_admission_refusals_total", {"by": kind}) or 0
                    for kind in ADMISSION_REFUSED_BY})


async def test_a_request_that_cannot_meet_its_ttft_is_refused_with_a_retry_time_and_costs_no_worker_call(
        redis_server, tokenizer):
    prefill, decode = ScriptedWorker(prefill=PrefillResult(5, True, "length")), decoder()
    config = router_config(slo=SloTargets(ttft_s=0.1), cost_prior=DEFAULT_COST)
    config = replace(config, max_model_len=8192)
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": decode}, config)
    before = refusals_by()
    try:
        with pytest.raises(Overloaded, match="time to first token") as refused:
            lifecycle.admit(GenerationRequest("long", LONG, GREEDY))  # ~1.02 s predicted, limit 0.1 s
        assert refused.value.retry_after_s == 1.0   # the floor (min_retry_after_s)
        with pytest.raises(Overloaded) as refused:
            lifecycle.admit(GenerationRequest("longer", LONG + LONG[:1500], GREEDY))  # ~1.77 s predicted
        assert refused.value.retry_after_s == 2.0   # ceil(1.77 - 0.1): the predicted drain time
        assert (prefill.prefills, decode.decodes) == ([], [])
        assert await served(lifecycle, "short", SHORT) == [5]     # ~0.025 s: admitted
        assert refusals_by() - before == {"ttft": 2}   # counted by what refused them, for /metrics
    finally:
        await pool.close()
        await registry.close()


async def test_a_full_decode_batch_is_refused_on_tpot_before_any_worker_call(redis_server, tokenizer):
    prefill, decode = ScriptedWorker(prefill=PrefillResult(5, True, "length")), decoder()
    config = router_config(slo=SloTargets(tpot_s=0.010), cost_prior=DEFAULT_COST)   # a step is >= 15 ms
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": decode}, config)
    before = refusals_by()
    try:
        with pytest.raises(Overloaded, match="time per output token 16.0 ms exceeds the limit of 10.0 ms") as refused:
            lifecycle.admit(GenerationRequest("short", SHORT, GREEDY))
        assert refused.value.retry_after_s == 1.0
        assert (prefill.prefills, decode.decodes) == ([], [])
        assert refusals_by() - before == {"tpot": 1}
    finally:
        await pool.close()
        await registry.close()


@pytest.mark.parametrize("ttft_scales, ttft_kept", [
    ("whole", 3),   # each predicted >= a quarter of its SLO: every one kept
    ("wait", 0),    # the default: sent one at a time, none was predicted to wait behind another
])
async def test_served_requests_teach_admission_how_far_its_predictions_were(redis_server, tokenizer, ttft_scales,
                                                                            ttft_kept):
    prefill, decode = ScriptedWorker(prefill=PrefillResult(5, False, kv_handle=KVHandle("t", "h:1", "p", (1,), 3))), \
        decoder(tokens=(6, 7, 8))
    config = router_config(slo=SloTargets(ttft_s=0.05, tpot_s=0.05), cost_prior=DEFAULT_COST,
                           placement=PlacementConfig(calibrate_ttft=ttft_scales))
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": decode}, config)
    try:
        for i in range(3):
            assert await served(lifecycle, f"r{i}", SHORT) == [5, 6, 7, 8]
        ttft, tpot = lifecycle.scheduler.calibration["ttft"], lifecycle.scheduler.calibration["tpot"]
        assert len(ttft) == ttft_kept and len(tpot) == 3
        # what admission applies: the kept ratios pooled with the prior (4 at 1), its 0.75 quantile
        assert lifecycle.scheduler.scale().ttft == pooled_quantile(ttft.ratios(), 1.0, 4, 0.75, 4.0)
        assert lifecycle.scheduler.scale().tpot == pooled_quantile(tpot.ratios(), 1.0, 4, 0.75, 4.0)
    finally:
        await pool.close()
        await registry.close()


async def test_the_router_exports_admissions_calibration_at_scrape_time(redis_server, tokenizer):
    from prometheus_client import REGISTRY

    from pdserve import metrics

    def sample(name: str, quantity: str):
        return REGISTRY.get_sample_value(name, {"quantity": quantity})

    prefill, decode = ScriptedWorker(prefill=PrefillResult(5, False, kv_handle=KVHandle("t", "h:1", "p", (1,), 3))), \
        decoder(tokens=(6, 7, 8))
    config = router_config(slo=SloTargets(ttft_s=0.05, tpot_s=0.05), cost_prior=DEFAULT_COST,
                           placement=PlacementConfig(calibrate_ttft="whole"))   # the whole TTFT: these never wait
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": decode}, config)
    metrics.ROUTER_ADMISSION_CALIBRATION.source = lifecycle.scheduler.calibration_rows
    try:
        assert [sample("pdserve_router_admission_calibration_observations", q) for q in ("ttft", "tpot")] == [0, 0]
        for i in range(3):
            assert await served(lifecycle, f"r{i}", SHORT) == [5, 6, 7, 8]
        assert [sample("pdserve_router_admission_calibration_observations", q) for q in ("ttft", "tpot")] == [3, 3]
        scale = lifecycle.scheduler.scale()
        assert [sample("pdserve_router_admission_scale_ratio", q) for q in ("ttft", "tpot")] == [scale.ttft, scale.tpot]
        # many more, each seen at twice its prediction: they outweigh the prior and the first three
        ttft = lifecycle.scheduler.calibration["ttft"]
        now_s = lifecycle.scheduler.clock()
        for _ in range(32):
            ttft.observe(0.04, 0.08, 0.05, now_s)
        assert sample("pdserve_router_admission_scale_ratio", "ttft") == pytest.approx(2.0)
        assert sample("pdserve_router_admission_scale_ratio", "ttft") == lifecycle.scheduler.scale().ttft
        assert sample("pdserve_router_admission_calibration_observations", "ttft") == 3 + 32
    finally:
        metrics.ROUTER_ADMISSION_CALIBRATION.source = None
        await pool.close()
        await registry.close()
    assert sample("pdserve_router_admission_scale_ratio", "ttft") is None   # no router: no rows


async def test_a_router_judging_no_slo_exports_no_calibration(redis_server, tokenizer):
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": ScriptedWorker(), "decode-a": decoder()},
                                                       router_config())
    try:
        assert lifecycle.scheduler.calibration_rows() == []
    finally:
        await pool.close()
        await registry.close()


async def test_a_request_that_waits_too_long_in_the_router_is_refused_with_a_retry_time(redis_server, tokenizer):
    prefill, decode = HeldPrefillWorker(), decoder()
    config = router_config(placement=PlacementConfig(max_queued_prefill_tokens_per_worker=1), max_queue_wait_s=0.3)
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": decode}, config)
    try:
        first = asyncio.create_task(served(lifecycle, "first", SHORT))
        await until(lambda: len(prefill.prefills) == 1)
        with pytest.raises(Overloaded, match="waited 0.3 s in the router's queue") as refused:
            await served(lifecycle, "second", SHORT)
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
