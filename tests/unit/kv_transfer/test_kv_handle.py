"""The KV handle: one dataclass, byte-compatible with the dict vLLM sees and the JSON on the wire."""

import json

import pytest

from kv_transfer.handle import KVHandle, MalformedKVHandle, producer_params
from kv_transfer.records import PullReport

HANDLE = KVHandle("x1", "10.0.0.5:7000", "prefill-0", (4, 5, 6), 69)
PARAMS = {"do_remote_prefill": True, "transfer_id": "x1", "remote_address": "10.0.0.5:7000",
          "remote_engine_id": "prefill-0", "remote_block_ids": [4, 5, 6], "remote_num_tokens": 69}


def test_params_have_the_keys_and_order_vllm_and_the_wire_always_had():
    assert HANDLE.to_params() == PARAMS
    assert list(HANDLE.to_params()) == list(PARAMS)
    assert HANDLE.encode() == json.dumps(PARAMS)


def test_a_handle_survives_the_wire_and_the_params_dict():
    assert KVHandle.decode(HANDLE.encode()) == HANDLE
    assert KVHandle.from_params(PARAMS) == HANDLE
    consumed = {**PARAMS, "do_remote_prefill": False}  # the consumer's one-shot flag is not the handle's
    assert KVHandle.from_params(consumed) == HANDLE


def test_to_params_gives_a_fresh_dict_each_time_so_the_consumer_may_mark_it():
    first = HANDLE.to_params()
    first["do_remote_prefill"] = False
    first["remote_block_ids"].append(99)
    assert HANDLE.to_params() == PARAMS


@pytest.mark.parametrize("text, field", [
    (json.dumps({k: v for k, v in PARAMS.items() if k != "transfer_id"}), "transfer_id"),
    (json.dumps({**PARAMS, "transfer_id": ""}), "transfer_id"),
    (json.dumps({**PARAMS, "remote_address": 7000}), "remote_address"),
    (json.dumps({**PARAMS, "remote_block_ids": [4, "5"]}), "remote_block_ids"),
    (json.dumps({**PARAMS, "remote_block_ids": [4, -1]}), "remote_block_ids"),
    (json.dumps({**PARAMS, "remote_num_tokens": "69"}), "remote_num_tokens"),
    (json.dumps({**PARAMS, "remote_num_tokens": 0}), "remote_num_tokens"),
    (json.dumps({**PARAMS, "remote_num_tokens": True}), "remote_num_tokens"),
])
def test_a_malformed_handle_is_refused_naming_the_field(text, field):
    with pytest.raises(MalformedKVHandle, match=field):
        KVHandle.decode(text)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "null", ""])
def test_what_is_not_a_json_object_is_no_handle(text):
    with pytest.raises(MalformedKVHandle):
        KVHandle.decode(text)


def test_a_prefill_request_asks_the_producer_to_keep_its_kv_under_the_transfer_id():
    assert producer_params("x1") == {"do_remote_decode": True, "transfer_id": "x1"}


def test_a_pull_report_reads_back_from_the_finished_request_s_params():
    report = PullReport(num_bytes=3 * 1024, num_blocks=3, seconds=0.25, num_tokens=69)
    assert PullReport.from_params(report.as_params()) == report


def test_a_failed_pull_reports_no_loaded_tokens_and_its_error():
    failed = PullReport(num_bytes=1024, num_blocks=1, seconds=0.5, num_tokens=69, error="peer closed")
    assert failed.num_loaded_tokens == 0
    assert PullReport.from_params(failed.as_params()) == PullReport(1024, 1, 0.5, 0, "peer closed")


def test_no_params_is_a_report_of_nothing_pulled():
    assert PullReport.from_params(None) == PullReport(0, 0, 0.0, 0, "")


def test_a_malformed_handle_in_a_decode_request_is_the_caller_s_invalid_argument():
    """The decode worker's edge refuses it before the engine sees it; never a crash, never UNKNOWN."""
    from pdserve.errors import InvalidRequest, grpc_code
    from pdserve.sampling import Sampling
    from pdserve.v1 import worker_pb2
    from pdserve.worker_proto import decode_request_from_proto

    message = worker_pb2.DecodeRequest(request_id="r", prompt_token_ids=[1, 2, 3], sampling=Sampling().to_proto(),
                                       kv_transfer_params_json=json.dumps({**PARAMS, "remote_block_ids": "4,5,6"}))
    with pytest.raises(InvalidRequest, match="remote_block_ids") as refused:
        decode_request_from_proto(message)
    assert (refused.value.field, grpc_code(refused.value).name) == ("kv_transfer_params_json", "INVALID_ARGUMENT")


def test_worker_messages_cross_the_proto_edge_unchanged():
    from pdserve.sampling import Sampling
    from pdserve.worker_api import DecodeChunk, DecodeRequest, PrefillRequest, PrefillResult
    from pdserve.worker_proto import (decode_chunk_from_proto, decode_chunk_to_proto, decode_request_from_proto,
                                      decode_request_to_proto, prefill_request_from_proto, prefill_request_to_proto,
                                      prefill_result_from_proto, prefill_result_to_proto)

    sampling = Sampling(max_tokens=4, temperature=0.0, min_tokens=2, seed=7, stop=("\n",))
    prefill = PrefillRequest("r", (1, 2, 3), sampling, "x1", cache_salt="tenant-a")
    result = PrefillResult(first_token_id=9, finished=False, finish_reason="", kv_handle=HANDLE, engine_s=0.5,
                           num_cached_tokens=32, queued_s=0.25)
    decode = DecodeRequest("r", (1, 2, 3, 9), sampling, HANDLE, num_generated=1, cache_salt="tenant-a")
    chunk = DecodeChunk((10, 11), True, "length", 3072, 0.125, 3, 64, "", 69, 0.5)
    assert prefill_request_from_proto(prefill_request_to_proto(prefill)) == prefill
    assert prefill_result_from_proto(prefill_result_to_proto(result)) == result
    assert prefill_result_to_proto(result).kv_transfer_params_json == json.dumps(PARAMS)
    assert decode_request_from_proto(decode_request_to_proto(decode)) == decode
    assert decode_chunk_from_proto(decode_chunk_to_proto(chunk)) == chunk
