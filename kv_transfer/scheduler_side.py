"""The connector's scheduler half, in the engine-core process. It decides, it never moves bytes.

Producer (request carries `kv_transfer.handle.producer_params`): when the prefill request finishes
normally, its prompt blocks are kept (`request_finished -> True`) under a lease granted to the
worker half, and the returned params are a `kv_transfer.handle.KVHandle` naming them for the
consumer (`KVHandle.to_params()`).

Consumer (request carries those params; the decode worker validated them at its edge): the
producer's prompt tokens beyond the local prefix-cache hit are reported as loaded asynchronously;
after vLLM allocates blocks, the worker half is asked to pull the producer's blocks into the
unhashed ones. If nothing needs pulling, or the request ends before it is scheduled, the
producer's lease is released instead, so its blocks are never stranded.

Bookkeeping that must not grow without bound: a pull report is kept only for a request still
waiting for it (a request aborted mid-pull finishes before its report arrives; the report is then
dropped), and a held producer request is forgotten when vLLM reports it `finished_sending`.
"""

from __future__ import annotations

import math
from typing import Any

from kv_transfer.config import ConnectorConfig
from kv_transfer.grants import EarlyGranter
from kv_transfer.handle import KVHandle
from kv_transfer.metadata import PDConnectorMetadata, PDConnectorStats, PDWorkerMeta
from kv_transfer.records import LeaseGrant, PullReport, PullSpec, ReleaseSpec
from kv_transfer.stats import HELD_LEASES


class PDScheduler:
    def __init__(self, config: ConnectorConfig, engine_id: str, block_size: int):
        self.config = config
        self.engine_id = engine_id
        self.block_size = block_size
        self._next = PDConnectorMetadata()
        self._awaiting_report: set[str] = set()      # consumer requests with a pull scheduled
        self._reports: dict[str, PullReport] = {}    # request id -> its pull's report, until it finishes
        self._held: set[str] = set()                 # producer requests whose blocks a lease pins
        self._granter = EarlyGranter(config.address, config.grant_token)  # grants without waiting a step

    @property
    def num_held_leases(self) -> int:
        """Prefilled requests whose blocks are pinned for a consumer (not yet `finished_sending`)."""
        return len(self._held)

    def has_pending_work(self) -> bool:
        """True while metadata for the worker half is waiting for the next engine step. The engine
        must take that step even with no request left: a release queued for a request aborted
        before its blocks were allocated would otherwise wait for the next request to arrive,
        and the producer would hold the blocks until the lease expires."""
        return bool(self._next.grants or self._next.pulls or self._next.releases)

    @property
    def num_pending_reports(self) -> int:
        """Pull reports kept for requests that have not finished yet."""
        return len(self._reports)

    # ---- consumer ----------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int, bool]:
        params = request.kv_transfer_params or {}
        if not params.get("do_remote_prefill"):
            return 0, False
        count = KVHandle.from_params(params).remote_num_tokens - num_computed_tokens
        return (count, True) if count > 0 else (0, False)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        params = request.kv_transfer_params or {}
        if not params.get("do_remote_prefill"):
            return
        handle = KVHandle.from_params(params)
        params["do_remote_prefill"] = False  # one transfer per request, even if called twice
        if num_external_tokens <= 0:
            self._next.releases.append(ReleaseSpec(handle.transfer_id, handle.remote_address))
            return
        group = blocks.blocks[0]
        num_local_hits = sum(block.block_hash is not None and not block.is_null for block in group)
        local_ids = blocks.get_unhashed_block_ids()
        remote_ids = handle.remote_block_ids[num_local_hits : num_local_hits + len(local_ids)]
        self._next.pulls.append(PullSpec(request.request_id, handle.transfer_id, handle.remote_address,
                                         remote_ids, tuple(local_ids), num_external_tokens))
        self._awaiting_report.add(request.request_id)

    def update_connector_output(self, connector_output) -> None:
        """Keeps the reports of requests still waiting for them; forgets released producer requests."""
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, PDWorkerMeta):
            for request_id, report in meta.reports.items():
                if request_id in self._awaiting_report:
                    self._awaiting_report.discard(request_id)
                    self._reports[request_id] = report
        self._held.difference_update(connector_output.finished_sending or ())

    def get_kv_connector_stats(self) -> PDConnectorStats:
        return PDConnectorStats(data={HELD_LEASES: len(self._held)})

    # ---- both ----------------------------------------------------------------------------------
    def build_connector_meta(self, scheduler_output) -> PDConnectorMetadata:
        meta, self._next = self._next, PDConnectorMetadata()
        return meta

    def request_finished(self, request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        params = request.kv_transfer_params or {}
        if params.get("do_remote_decode"):
            return self._finish_producer(request, block_ids, params)
        if params.get("do_remote_prefill"):  # ended before its blocks were allocated
            handle = KVHandle.from_params(params)
            self._next.releases.append(ReleaseSpec(handle.transfer_id, handle.remote_address))
        self._awaiting_report.discard(request.request_id)  # a report arriving later is dropped
        report = self._reports.pop(request.request_id, None)
        return False, (report.as_params() if report else None)

    def _finish_producer(self, request, block_ids: list[int], params: dict) -> tuple[bool, dict | None]:
        from vllm.v1.request import RequestStatus

        if request.status not in (RequestStatus.FINISHED_LENGTH_CAPPED, RequestStatus.FINISHED_STOPPED):
            return False, None  # aborted or errored: free now, nobody will pull
        num_tokens = len(request.prompt_token_ids or ())
        prompt_blocks = tuple(block_ids[: math.ceil(num_tokens / self.block_size)])
        if not prompt_blocks:
            return False, None
        transfer_id = params["transfer_id"]
        grant = LeaseGrant(transfer_id, request.request_id, prompt_blocks, num_tokens, self.config.lease_s)
        self._granter.send(grant)     # now: the blocks are final and pinned from here on
        self._next.grants.append(grant)  # and with the next step (a duplicate, or the grant if that failed)
        self._held.add(request.request_id)
        return True, KVHandle(transfer_id, self.config.address, self.engine_id, prompt_blocks, num_tokens).to_params()
