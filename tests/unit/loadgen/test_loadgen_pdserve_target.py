"""The pdserve gRPC target through the real SDK against a real in-process gRPC server that speaks
pdserve's public API (scripted replies, no engine): chunks, final timings, typed errors, cancel."""

import asyncio

import grpc
import pytest

from loadgen.metrics import summarize
from loadgen.prompts import PromptSynthesizer
from loadgen.runner import RunConfig, run
from loadgen.targets.base import Delta, PhaseTimings, TargetError
from loadgen.targets.pdserve_grpc import PdserveGrpcTarget
from loadgen.workload import RequestSpec
from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc

TOO_LONG_TOKENS = 99  # prompt length the fake router rejects as INVALID_ARGUMENT
STALL_OUTPUT = 17  # max_tokens for which it sends one chunk, then nothing
REFUSED_TOKENS = 77  # prompt length it refuses as RESOURCE_EXHAUSTED with a retry-after


class ScriptedRouter(generation_pb2_grpc.GenerationServicer):
    def __init__(self) -> None:
        self.requests: list[pb.GenerateRequest] = []
        self.cancelled = 0

    async def GetModelInfo(self, request, context):
        return pb.ModelInfo(model="scripted", max_model_len=64, vocab_size=256)

    async def Generate(self, request, context):
        self.requests.append(request)
        if len(request.token_ids.ids) == TOO_LONG_TOKENS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "prompt exceeds the model's context")
        if len(request.token_ids.ids) == REFUSED_TOKENS:
            context.set_trailing_metadata((("retry-after-s", "2.500"),))
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "predicted TTFT misses the SLO")
        max_tokens = request.sampling.max_tokens
        yield pb.GenerateResponse(request_id="r", token_ids=[7], text="a")
        if max_tokens == STALL_OUTPUT:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        yield pb.GenerateResponse(request_id="r", token_ids=[8] * (max_tokens - 1), text="b", finished=True,
                                  finish_reason="length", timings=pb.PhaseTimings(
                                      queued_s=0.001, prefill_s=0.2, kv_transfer_bytes=4096, kv_transfer_s=0.01,
                                      decode_s=0.5, prompt_tokens=len(request.token_ids.ids),
                                      output_tokens=max_tokens, disaggregated=True))


@pytest.fixture
async def router():
    servicer = ScriptedRouter()
    server = grpc.aio.server()
    generation_pb2_grpc.add_GenerationServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield servicer, f"127.0.0.1:{port}"
    await server.stop(grace=None)


async def _deltas(target, prompt_tokens, output_tokens):
    prompt = PromptSynthesizer().prompt(RequestSpec(0.0, prompt_tokens, output_tokens), 0)
    return [delta async for delta in target.generate(prompt)]


async def test_chunks_become_deltas_with_final_phase_timings_and_exact_length_requests(router):
    servicer, address = router
    target = PdserveGrpcTarget(address)
    await target.open()
    try:
        deltas = await _deltas(target, 12, 4)
    finally:
        await target.close()
    assert target.model == "scripted"
    assert deltas == [
        Delta(content=True, text="a", num_tokens=1),
        Delta(content=True, text="b", num_tokens=3, completion_tokens=4, prompt_tokens=12,
              phases=PhaseTimings(queued_s=0.001, prefill_s=0.2, kv_transfer_s=0.01, kv_transfer_bytes=4096,
                                  decode_s=0.5, disaggregated=True)),
    ]
    (sent,) = servicer.requests
    assert len(sent.token_ids.ids) == 12
    assert (sent.sampling.max_tokens, sent.sampling.min_tokens, sent.sampling.ignore_eos) == (4, 4, True)


async def test_typed_errors_become_target_errors_with_the_error_kind(router):
    _, address = router
    target = PdserveGrpcTarget(address)
    await target.open()
    try:
        with pytest.raises(TargetError) as raised:
            await _deltas(target, TOO_LONG_TOKENS, 4)
    finally:
        await target.close()
    assert (raised.value.status, raised.value.message) == ("invalid_request_error", "prompt exceeds the model's context")


async def test_runner_accounts_for_errors_and_timeouts_and_cancels_the_rpc(router):
    servicer, address = router
    specs = [RequestSpec(0.0, 10, 3), RequestSpec(0.01, TOO_LONG_TOKENS, 3), RequestSpec(0.02, 10, STALL_OUTPUT)]
    target = PdserveGrpcTarget(address)
    await target.open()
    try:
        result = await run(target, specs, PromptSynthesizer(), RunConfig(request_timeout_s=2.0))  # ok needs ms; stall is 10 s
    finally:
        await target.close()
    assert [r.status for r in result.records] == ["ok", "error", "timeout"]
    assert result.records[1].error == "TargetError: invalid_request_error: prompt exceeds the model's context"
    assert result.records[0].output_tokens == 3 and result.records[0].phases.kv_transfer_bytes == 4096
    summary = summarize(result.records, result.duration_s)
    assert (summary["completed"], summary["failed"], summary["timed_out"]) == (1, 2, 1)
    for _ in range(50):  # the server sees the cancel shortly after the client gives up
        if servicer.cancelled:
            break
        await asyncio.sleep(0.02)
    assert servicer.cancelled == 1


async def test_an_unreachable_router_fails_at_open():
    target = PdserveGrpcTarget("127.0.0.1:9")
    with pytest.raises(TargetError, match="unreachable"):
        await target.open()


async def test_a_refusal_at_admission_is_recorded_as_refused_with_its_retry_after(router):
    from loadgen.targets.base import Refused

    _, address = router
    target = PdserveGrpcTarget(address)
    await target.open()
    try:
        with pytest.raises(Refused) as raised:
            await _deltas(target, REFUSED_TOKENS, 3)
        result = await run(target, [RequestSpec(0.0, 10, 3), RequestSpec(0.01, REFUSED_TOKENS, 3)], PromptSynthesizer(),
                           RunConfig(request_timeout_s=5.0))
    finally:
        await target.close()
    assert raised.value.retry_after_s == 2.5 and raised.value.status == "overloaded"
    assert [r.status for r in result.records] == ["ok", "refused"]
    assert summarize(result.records, result.duration_s)["refused"] == 1
