"""The one conversion table between `pdserve.worker_api` dataclasses and `pdserve.v1.worker_pb2`.

Used at the two edges of the router <-> worker RPC only: the router's gRPC worker client and the
worker's servicer. Field numbers and names are the .proto's; nothing here changes them.
`*_from_proto` validates what it reads: bad sampling or a malformed KV handle in a request raises
`InvalidRequest` (the caller's error, INVALID_ARGUMENT), never anything the engine would see.
"""

from __future__ import annotations

from kv_transfer.handle import KVHandle, MalformedKVHandle
from pdserve.errors import InvalidRequest
from pdserve.logprobs import SampledLogprobs
from pdserve.sampling import Sampling
from pdserve.v1 import worker_pb2
from pdserve.worker_api import DecodeChunk, DecodeRequest, PrefillRequest, PrefillResult, StopReason


def decode_handle(text: str) -> KVHandle | None:
    """The handle on the wire ("" means none); InvalidRequest when it is not a handle."""
    if not text:
        return None
    try:
        return KVHandle.decode(text)
    except MalformedKVHandle as error:
        raise InvalidRequest(str(error), field="kv_transfer_params_json") from None


def _encode_handle(handle: KVHandle | None) -> str:
    return handle.encode() if handle is not None else ""


def prefill_request_to_proto(request: PrefillRequest) -> worker_pb2.PrefillRequest:
    return worker_pb2.PrefillRequest(request_id=request.request_id, prompt_token_ids=request.prompt_token_ids,
                                     sampling=request.sampling.to_proto(), transfer_id=request.transfer_id,
                                     cache_salt=request.cache_salt)


def prefill_request_from_proto(message: worker_pb2.PrefillRequest) -> PrefillRequest:
    if not message.transfer_id:
        raise InvalidRequest("transfer_id is required for a prefill", field="transfer_id")
    return PrefillRequest(message.request_id, tuple(message.prompt_token_ids), Sampling.from_proto(message.sampling),
                          message.transfer_id, message.cache_salt)


def prefill_result_to_proto(result: PrefillResult) -> worker_pb2.PrefillResponse:
    return worker_pb2.PrefillResponse(
        first_token_id=result.first_token_id, finished=result.finished, finish_reason=result.finish_reason,
        kv_transfer_params_json=_encode_handle(result.kv_handle), engine_s=result.engine_s,
        num_cached_tokens=result.num_cached_tokens, queued_s=result.queued_s, **_stop_reason_fields(result.stop_reason),
        first_logprobs=_logprobs_to_proto(result.first_logprobs) if result.first_logprobs else None,
        prompt_logprobs=[_logprobs_to_proto(row) for row in result.prompt_logprobs])


def prefill_result_from_proto(message: worker_pb2.PrefillResponse) -> PrefillResult:
    return PrefillResult(
        first_token_id=message.first_token_id, finished=message.finished, finish_reason=message.finish_reason,
        kv_handle=decode_handle(message.kv_transfer_params_json), engine_s=message.engine_s,
        num_cached_tokens=message.num_cached_tokens, queued_s=message.queued_s, stop_reason=_stop_reason(message),
        first_logprobs=_logprobs(message.first_logprobs) if message.HasField("first_logprobs") else None,
        prompt_logprobs=tuple(_logprobs(row) for row in message.prompt_logprobs))


def decode_request_to_proto(request: DecodeRequest) -> worker_pb2.DecodeRequest:
    return worker_pb2.DecodeRequest(request_id=request.request_id, prompt_token_ids=request.prompt_token_ids,
                                    sampling=request.sampling.to_proto(),
                                    kv_transfer_params_json=_encode_handle(request.kv_handle),
                                    num_generated=request.num_generated, cache_salt=request.cache_salt)


def decode_request_from_proto(message: worker_pb2.DecodeRequest) -> DecodeRequest:
    return DecodeRequest(message.request_id, tuple(message.prompt_token_ids), Sampling.from_proto(message.sampling),
                         decode_handle(message.kv_transfer_params_json), num_generated=message.num_generated,
                         cache_salt=message.cache_salt)


def decode_chunk_to_proto(chunk: DecodeChunk) -> worker_pb2.DecodeResponse:
    return worker_pb2.DecodeResponse(
        token_ids=chunk.token_ids, finished=chunk.finished, finish_reason=chunk.finish_reason,
        kv_transfer_bytes=chunk.kv_transfer_bytes, kv_transfer_s=chunk.kv_transfer_s,
        kv_transfer_blocks=chunk.kv_transfer_blocks, num_cached_tokens=chunk.num_cached_tokens,
        kv_load_error=chunk.kv_load_error, kv_loaded_tokens=chunk.kv_loaded_tokens, queued_s=chunk.queued_s,
        **_stop_reason_fields(chunk.stop_reason), logprobs=[_logprobs_to_proto(row) for row in chunk.logprobs],
        prompt_logprobs=[_logprobs_to_proto(row) for row in chunk.prompt_logprobs])


def decode_chunk_from_proto(message: worker_pb2.DecodeResponse) -> DecodeChunk:
    return DecodeChunk(
        token_ids=tuple(message.token_ids), finished=message.finished, finish_reason=message.finish_reason,
        kv_transfer_bytes=message.kv_transfer_bytes, kv_transfer_s=message.kv_transfer_s,
        kv_transfer_blocks=message.kv_transfer_blocks, num_cached_tokens=message.num_cached_tokens,
        kv_load_error=message.kv_load_error, kv_loaded_tokens=message.kv_loaded_tokens, queued_s=message.queued_s,
        stop_reason=_stop_reason(message), logprobs=tuple(_logprobs(row) for row in message.logprobs),
        prompt_logprobs=tuple(_logprobs(row) for row in message.prompt_logprobs))


def _stop_reason_fields(stop_reason: StopReason) -> dict:
    if isinstance(stop_reason, str):
        return {"stop_string": stop_reason}
    return {} if stop_reason is None else {"stop_token_id": stop_reason}


def _stop_reason(message) -> StopReason:
    which = message.WhichOneof("stop_reason")
    return None if which is None else getattr(message, which)


def _logprobs_to_proto(row: SampledLogprobs) -> worker_pb2.SampledLogprobs:
    return worker_pb2.SampledLogprobs(token_ids=row.token_ids, logprobs=row.logprobs, rank=row.rank)


def _logprobs(message: worker_pb2.SampledLogprobs) -> SampledLogprobs:
    return SampledLogprobs(tuple(message.token_ids), tuple(message.logprobs), message.rank)
