"""The lifecycle's walk, in-process, against scripted workers behind the `WorkerClient` boundary.

The workers here are test doubles of the RPC boundary, so the decisions (retry, quarantine,
resume, release) are driven with exact tokens; real clusters are tested in tests/integration.
The registry is a real Redis and the tokenizer the tiny model's.
"""

from __future__ import annotations

import grpc
import pytest

from kv_transfer.handle import KVHandle
from pdserve.errors import InvalidRequest, NoHealthyWorker
from pdserve.sampling import Sampling
from pdserve.worker_api import DecodeChunk, DecodeRequest, PrefillResult
from router.lifecycle import Lifecycle
from router.types import GenerationRequest
from router.worker_client import WorkerError
from scripted_workers import ScriptedWorker, scripted_cluster

PROMPT = [101, 102, 103]
HANDLE = KVHandle("x1", "10.0.0.5:7000", "prefill-a", (4,), 3)


async def _tokens(lifecycle: Lifecycle, request: GenerationRequest) -> tuple[list[int], list]:
    chunks = [chunk async for chunk in lifecycle.generate(request)]
    return [t for chunk in chunks for t in chunk.token_ids], chunks


async def test_a_decode_that_dies_mid_stream_resumes_elsewhere_and_the_client_sees_every_token_once(
        redis_server, tokenizer):
    prefill = ScriptedWorker(prefill=PrefillResult(first_token_id=7, finished=False, kv_handle=HANDLE))
    dying = ScriptedWorker(decode=[DecodeChunk((8, 9)), WorkerError(grpc.StatusCode.UNAVAILABLE, "gone")])
    healthy = ScriptedWorker(decode=[DecodeChunk((10,)), DecodeChunk((11,), finished=True, finish_reason="length")])
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                               {"prefill-a": prefill, "decode-a": dying, "decode-b": healthy})
    sampling = Sampling(max_tokens=5, min_tokens=5, temperature=0.0, ignore_eos=True)
    try:
        tokens, chunks = await _tokens(lifecycle, GenerationRequest("req-1", PROMPT, sampling))
        await lifecycle.wait_for_releases()

        assert tokens == [7, 8, 9, 10, 11]
        assert [c.finished for c in chunks] == [False, False, False, True]
        assert chunks[-1].finish_reason == "length" and chunks[-1].timings.output_tokens == 5
        assert dying.decodes == [DecodeRequest("req-1", (101, 102, 103, 7),
                                               Sampling(max_tokens=4, min_tokens=4, temperature=0.0, ignore_eos=True),
                                               HANDLE, num_generated=1)]
        assert healthy.decodes == [DecodeRequest("req-1-retry1", (101, 102, 103, 7, 8, 9),
                                                 Sampling(max_tokens=2, min_tokens=2, temperature=0.0,
                                                          ignore_eos=True), None, num_generated=3)]
        assert [w.worker_id for w in pool.workers("decode")] == ["decode-b"]  # decode-a is quarantined
        transfer_id = prefill.prefills[0].transfer_id
        assert prefill.releases == [(transfer_id, "req-1")]  # released exactly once
        assert (healthy.releases, dying.releases) == ([], [])
    finally:
        await pool.close()
        await registry.close()


async def test_a_decode_stream_that_ends_without_finishing_is_resumed_elsewhere(redis_server, tokenizer):
    prefill = ScriptedWorker(prefill=PrefillResult(first_token_id=7, finished=False, kv_handle=HANDLE))
    closing = ScriptedWorker(decode=[DecodeChunk((8,))])    # its stream ends here, no final chunk
    healthy = ScriptedWorker(decode=[DecodeChunk((9, 10), finished=True, finish_reason="length")])
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                               {"prefill-a": prefill, "decode-a": closing, "decode-b": healthy})
    try:
        tokens, chunks = await _tokens(lifecycle, GenerationRequest("req-3", PROMPT, Sampling(
            max_tokens=4, temperature=0.0, ignore_eos=True)))
        await lifecycle.wait_for_releases()
        assert tokens == [7, 8, 9, 10] and chunks[-1].finish_reason == "length"
        assert healthy.decodes == [DecodeRequest("req-3-retry1", (101, 102, 103, 7, 8),
                                                 Sampling(max_tokens=2, temperature=0.0, ignore_eos=True), None,
                                                 num_generated=2)]
        assert prefill.releases == [(prefill.prefills[0].transfer_id, "req-3")]   # the lease is given up once
    finally:
        await pool.close()
        await registry.close()


async def test_a_stop_string_spanning_the_break_ends_the_resumed_stream_with_vllm_s_text(redis_server, tokenizer):
    """The text is made by the router over every token sent, whichever worker sampled it: a stop
    string whose first half came from a dead worker and its second from the resumed one is found."""
    ids = tokenizer.encode(" alpha beta gamma delta epsilon")
    assert len(ids) >= 5
    before = tokenizer.output_text(PROMPT, Sampling(max_tokens=8)).add(ids[:3], False, "", None).text
    after = tokenizer.output_text(PROMPT, Sampling(max_tokens=8)).add(ids[:4], False, "", None).text
    stop = before[-2:] + after[len(before):len(before) + 2]      # two characters each side of the break
    prefill = ScriptedWorker(prefill=PrefillResult(first_token_id=ids[0], finished=False, kv_handle=HANDLE))
    dying = ScriptedWorker(decode=[DecodeChunk(tuple(ids[1:3])), WorkerError(grpc.StatusCode.UNAVAILABLE, "gone")])
    resumed = ScriptedWorker(decode=[DecodeChunk(tuple(ids[3:5])),
                                     DecodeChunk((ids[5 % len(ids)],), finished=True, finish_reason="length")])
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                               {"prefill-a": prefill, "decode-a": dying, "decode-b": resumed})
    try:
        sampling = Sampling(max_tokens=8, temperature=0.0, ignore_eos=True, stop=(stop,))
        chunks = [chunk async for chunk in lifecycle.generate(GenerationRequest("req-5", PROMPT, sampling))]
        text = "".join(chunk.text for chunk in chunks)
        assert (chunks[-1].finish_reason, text) == ("stop", before[:-2])   # cut before the stop string
        assert resumed.decodes[0].num_generated == 3
    finally:
        await pool.close()
        await registry.close()


async def test_a_decode_failing_on_every_worker_ends_unavailable_and_releases_the_lease_once(redis_server, tokenizer):
    prefill = ScriptedWorker(prefill=PrefillResult(first_token_id=7, finished=False, kv_handle=HANDLE))
    crashes = [WorkerError(grpc.StatusCode.INTERNAL, "engine died")]
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer, {
        "prefill-a": prefill, "decode-a": ScriptedWorker(decode=crashes), "decode-b": ScriptedWorker(decode=crashes)})
    try:
        with pytest.raises(NoHealthyWorker, match="no decode worker could take the request"):
            await _tokens(lifecycle, GenerationRequest("req-2", PROMPT, Sampling(max_tokens=4, temperature=0.0)))
        await lifecycle.wait_for_releases()
        assert prefill.releases == [(prefill.prefills[0].transfer_id, "req-2")]
        assert pool.workers("decode") == []
    finally:
        await pool.close()
        await registry.close()


async def test_a_worker_s_bad_input_error_ends_the_request_and_quarantines_nobody(redis_server, tokenizer):
    prefill = ScriptedWorker(prefill=WorkerError(grpc.StatusCode.INVALID_ARGUMENT, "top_k must be -1 or >= 1"))
    decode = ScriptedWorker(decode=[DecodeChunk((8,), finished=True, finish_reason="length")])
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer, {"prefill-a": prefill, "decode-a": decode})
    try:
        with pytest.raises(InvalidRequest, match="top_k must be -1 or >= 1"):
            await _tokens(lifecycle, GenerationRequest("req-3", PROMPT, Sampling(max_tokens=4, temperature=0.0)))
        await lifecycle.wait_for_releases()
        assert ([w.worker_id for w in pool.workers("prefill")], [w.worker_id for w in pool.workers("decode")]) == (
            ["prefill-a"], ["decode-a"])
        assert (decode.decodes, prefill.releases) == ([], [])
    finally:
        await pool.close()
        await registry.close()


async def test_a_prefill_that_finishes_at_its_first_token_never_reaches_a_decode_worker(redis_server, tokenizer):
    prefill = ScriptedWorker(prefill=PrefillResult(first_token_id=2, finished=True, finish_reason="stop"))
    decode = ScriptedWorker(decode=[])
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer, {"prefill-a": prefill, "decode-a": decode})
    try:
        tokens, chunks = await _tokens(lifecycle, GenerationRequest("req-4", PROMPT, Sampling(max_tokens=4)))
        await lifecycle.wait_for_releases()
        assert (tokens, chunks[-1].finished, chunks[-1].finish_reason) == ([2], True, "stop")
        assert (decode.decodes, prefill.releases) == ([], [])
    finally:
        await pool.close()
        await registry.close()


async def test_a_client_leaving_mid_decode_closes_the_stream_and_releases_the_lease_once(redis_server, tokenizer):
    prefill = ScriptedWorker(prefill=PrefillResult(first_token_id=7, finished=False, kv_handle=HANDLE))
    decode = ScriptedWorker(decode=[DecodeChunk((8,)), DecodeChunk((9,)), DecodeChunk((10,), finished=True)])
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer, {"prefill-a": prefill, "decode-a": decode})
    try:
        stream = lifecycle.generate(GenerationRequest("req-5", PROMPT, Sampling(max_tokens=4, temperature=0.0)))
        assert [(await stream.__anext__()).token_ids for _ in range(2)] == [[7], [8]]
        await stream.aclose()
        await lifecycle.wait_for_releases()
        assert decode.num_streams_closed == 1
        assert prefill.releases == [(prefill.prefills[0].transfer_id, "req-5")]
        assert lifecycle.inflight == 0
    finally:
        await pool.close()
        await registry.close()


async def test_a_salted_request_carries_its_salt_to_every_worker_and_a_bad_salt_is_refused_first(
        redis_server, tokenizer):
    """The gRPC API's path: the router checks a salt with vLLM's rule before any worker sees it,
    and a resumed decode keeps the salt (its engine must hash the prompt as the first one did)."""
    prefill = ScriptedWorker(prefill=PrefillResult(first_token_id=7, finished=False, kv_handle=HANDLE))
    dying = ScriptedWorker(decode=[DecodeChunk((8,)), WorkerError(grpc.StatusCode.UNAVAILABLE, "gone")])
    healthy = ScriptedWorker(decode=[DecodeChunk((9,), finished=True, finish_reason="length")])
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": dying, "decode-b": healthy})
    sampling = Sampling(max_tokens=3, temperature=0.0, ignore_eos=True)
    try:
        with pytest.raises(InvalidRequest, match="Parameter 'cache_salt' must be at most 128 characters"):
            await _tokens(lifecycle, GenerationRequest("req-6", PROMPT, sampling, cache_salt="a@b"))
        assert prefill.prefills == []
        tokens, _ = await _tokens(lifecycle, GenerationRequest("req-7", PROMPT, sampling, cache_salt="tenant-a"))
        await lifecycle.wait_for_releases()
        assert tokens == [7, 8, 9]
        assert [r.cache_salt for r in prefill.prefills + dying.decodes + healthy.decodes] == ["tenant-a"] * 3
    finally:
        await pool.close()
        await registry.close()
