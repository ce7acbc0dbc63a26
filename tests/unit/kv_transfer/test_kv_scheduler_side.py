"""The connector's scheduler half with vLLM's own request and block objects: what it keeps, it lets go."""

from vllm import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request, RequestStatus

from kv_transfer.config import ConnectorConfig
from kv_transfer.metadata import PDWorkerMeta
from kv_transfer.records import LeaseGrant, PullReport, PullSpec, ReleaseSpec
from kv_transfer.scheduler_side import PDScheduler
from kv_transfer.stats import HELD_LEASES, held_leases

CONFIG = ConnectorConfig(host="10.0.0.5", port=7000, lease_s=30.0)


def _request(request_id: str, num_tokens: int, kv_transfer_params: dict) -> Request:
    sampling = SamplingParams(max_tokens=4, extra_args={"kv_transfer_params": kv_transfer_params})
    return Request(request_id, list(range(num_tokens)), sampling, None)


def _consumer_request(request_id="dec-1", num_tokens=70):
    return _request(request_id, num_tokens, {
        "do_remote_prefill": True, "transfer_id": "x1", "remote_address": "10.0.0.5:7000",
        "remote_engine_id": "prefill-0", "remote_block_ids": [11, 12, 13], "remote_num_tokens": 69})


def test_a_finished_prefill_holds_a_lease_until_the_engine_reports_it_sent():
    scheduler = PDScheduler(CONFIG, "prefill-0", block_size=32)
    request = _request("pre-1", 69, {"do_remote_decode": True, "transfer_id": "x1"})
    request.status = RequestStatus.FINISHED_LENGTH_CAPPED
    keep, params = scheduler.request_finished(request, [4, 5, 6, 7])
    assert keep is True
    assert params == {"do_remote_prefill": True, "transfer_id": "x1", "remote_address": "10.0.0.5:7000",
                      "remote_engine_id": "prefill-0", "remote_block_ids": [4, 5, 6], "remote_num_tokens": 69}
    assert scheduler.build_connector_meta(None).grants == [LeaseGrant("x1", "pre-1", (4, 5, 6), 69, 30.0)]
    assert scheduler.get_kv_connector_stats().data == {HELD_LEASES: 1}
    scheduler.update_connector_output(KVConnectorOutput(finished_sending={"pre-1"}))
    stats = scheduler.get_kv_connector_stats()
    assert (stats.data, stats.is_empty(), held_leases(stats.to_dict())) == ({HELD_LEASES: 0}, False, 0)


def test_an_aborted_prefill_holds_nothing():
    scheduler = PDScheduler(CONFIG, "prefill-0", block_size=32)
    request = _request("pre-2", 40, {"do_remote_decode": True, "transfer_id": "x2"})
    request.status = RequestStatus.FINISHED_ABORTED
    assert scheduler.request_finished(request, [1, 2]) == (False, None)
    assert scheduler.num_held_leases == 0 and scheduler.build_connector_meta(None).grants == []


def test_the_pull_report_of_a_request_aborted_mid_pull_is_dropped():
    """vLLM finishes a request aborted while its KV is loading before the pull ends; the report
    that arrives afterwards has nobody to go to and must not stay behind."""
    scheduler = PDScheduler(CONFIG, "decode-0", block_size=32)
    request = _consumer_request()
    blocks = KVCacheBlocks(([KVCacheBlock(20), KVCacheBlock(21), KVCacheBlock(22)],))
    scheduler.update_state_after_alloc(request, blocks, num_external_tokens=69)
    assert scheduler.build_connector_meta(None).pulls == [
        PullSpec("dec-1", "x1", "10.0.0.5:7000", (11, 12, 13), (20, 21, 22), 69)]
    request.status = RequestStatus.FINISHED_ABORTED
    assert scheduler.request_finished(request, [20, 21, 22]) == (False, None)
    late = PullReport(3 * 1024, 3, 0.01, 69)
    scheduler.update_connector_output(KVConnectorOutput(kv_connector_worker_meta=PDWorkerMeta({"dec-1": late})))
    assert scheduler.num_pending_reports == 0


def test_a_pull_report_reaches_its_request_when_it_finishes():
    scheduler = PDScheduler(CONFIG, "decode-0", block_size=32)
    request = _consumer_request("dec-2")
    blocks = KVCacheBlocks(([KVCacheBlock(30), KVCacheBlock(31), KVCacheBlock(32)],))
    scheduler.update_state_after_alloc(request, blocks, num_external_tokens=69)
    report = PullReport(3 * 1024, 3, 0.25, 69)
    scheduler.update_connector_output(KVConnectorOutput(kv_connector_worker_meta=PDWorkerMeta({"dec-2": report})))
    assert scheduler.num_pending_reports == 1
    request.status = RequestStatus.FINISHED_STOPPED
    assert scheduler.request_finished(request, [30, 31, 32]) == (False, report.as_params())
    assert scheduler.num_pending_reports == 0


def test_a_request_that_ends_before_allocation_releases_the_producer_lease_even_if_the_engine_idles():
    scheduler = PDScheduler(CONFIG, "decode-0", block_size=32)
    request = _consumer_request("dec-3")
    assert scheduler.has_pending_work() is False
    request.status = RequestStatus.FINISHED_ABORTED
    assert scheduler.request_finished(request, []) == (False, None)
    assert scheduler.has_pending_work() is True  # vLLM takes one more step for it (has_pending_push_work)
    assert scheduler.build_connector_meta(None).releases == [ReleaseSpec("x1", "10.0.0.5:7000")]
    assert scheduler.has_pending_work() is False
