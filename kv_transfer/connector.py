"""pdserve's vLLM KV connector, loaded with

    KVTransferConfig(kv_connector="PDConnector", kv_connector_module_path="kv_transfer.connector",
                     kv_role="kv_producer" | "kv_consumer", kv_load_failure_policy="recompute",
                     kv_connector_extra_config=ConnectorConfig fields)

vLLM builds it twice: the SCHEDULER role in the engine core (`PDScheduler`: decides, no bytes) and
the WORKER role in the model runner (`PDWorker`: moves bytes, no decisions). They share only the
per-step metadata of `kv_transfer.metadata`. This class only dispatches to the right half.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
    KVConnectorTransferResults,
)

from kv_transfer.config import ConnectorConfig
from kv_transfer.fingerprint import FingerprintError, model_fingerprint
from kv_transfer.metadata import PDConnectorMetadata, PDConnectorStats
from kv_transfer.scheduler_side import PDScheduler
from kv_transfer.worker_side import ModelIdentity, PDWorker

logger = logging.getLogger(__name__)


class PDConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        transfer = vllm_config.kv_transfer_config
        config = ConnectorConfig.from_extra(transfer.kv_connector_extra_config)
        block_size = vllm_config.cache_config.block_size
        self._scheduler: PDScheduler | None = None
        self._worker: PDWorker | None = None
        self._started: PDConnectorMetadata | None = None   # the last step's metadata handed to the worker half
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = PDScheduler(config, transfer.engine_id or "", block_size)
        else:
            self._worker = PDWorker(config, transfer.is_kv_producer, transfer.is_kv_consumer, block_size,
                                    kv_cache_config.num_blocks, _model_identity(vllm_config),
                                    cache_bytes=_cache_bytes(kv_cache_config), device_type=_device_type(vllm_config))

    # ---- scheduler role --------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> PDConnectorMetadata:
        return self._scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output) -> None:
        self._scheduler.update_connector_output(connector_output)

    def request_finished(self, request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self._scheduler.request_finished(request, block_ids)

    def has_pending_push_work(self) -> bool:
        """Keeps the engine stepping while the scheduler half has metadata to hand over."""
        return self._scheduler is not None and self._scheduler.has_pending_work()

    def get_kv_connector_stats(self) -> PDConnectorStats | None:
        """Scheduler role: the held-lease gauge, every step (see `kv_transfer.stats`)."""
        return self._scheduler.get_kv_connector_stats() if self._scheduler is not None else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> PDConnectorStats:
        return PDConnectorStats(data=dict(data or {}))

    # ---- worker role ---------------------------------------------------------------------------
    def get_mem_pool_context(self):
        """CPU producer with transport shm/auto: the cache is allocated in a shared-memory segment
        (None on CUDA: vLLM's own allocation exports as CUDA IPC handles as it is)."""
        return self._worker.allocation_context() if self._worker is not None else None

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._worker.register_kv_caches(kv_caches)

    def bind_connector_metadata(self, connector_metadata) -> None:
        """The step's metadata, bound before its forward. vLLM (0.32) starts a step's asynchronous
        loads after the forward is launched, which on a GPU overlaps the forward; on a CPU the
        forward has run to its end by then, so a pull started there finishes only during the next
        step and is reported after it: the request runs a whole decode step later than its pull
        allows (BENCHMARKS "The handoff's missing step"). Where the pulls run beside the forward
        (`PDWorker.pulls_beside_forward`) they start here instead."""
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None and self._worker.pulls_beside_forward:
            self._start(connector_metadata)

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        self._start(self._get_connector_metadata())

    def _start(self, meta) -> None:
        """Hands the step's pulls, grants and releases to the worker half, once per step's metadata."""
        if isinstance(meta, PDConnectorMetadata) and meta is not self._started:
            self._started = meta
            self._worker.start_load_kv(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None  # pulls complete between steps (load_kv_async); nothing loads mid-forward

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata, **kwargs: Any) -> None:
        return None  # pull-based: the consumer reads the producer's cache, nothing is pushed

    def wait_for_save(self) -> None:
        return None

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        sending, recving, failed = self._worker.get_transfer_results()
        return KVConnectorTransferResults(finished_sending=sending, finished_recving=recving, failed_recving=failed)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        result = self.get_transfer_results(finished_req_ids)
        return result.finished_sending or None, result.finished_recving or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.take_invalid_block_ids()

    def build_connector_worker_meta(self):
        return self._worker.take_worker_meta()

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()


def _cache_bytes(kv_cache_config) -> int:
    """The size of vLLM's one KV cache allocation (0 when it makes several or none)."""
    sizes = {tensor.size for tensor in getattr(kv_cache_config, "kv_cache_tensors", None) or ()}
    return sizes.pop() if len(sizes) == 1 else 0


def _device_type(vllm_config) -> str:
    """Where vLLM puts the KV cache: "cpu", "cuda", ... (vLLM resolves its "auto" device itself)."""
    device_config = getattr(vllm_config, "device_config", None)
    return str(getattr(device_config, "device_type", "") or "cpu")


def _model_identity(vllm_config) -> ModelIdentity:
    """The served checkpoint's fingerprint and KV geometry, for the handshake. A model this host
    cannot fingerprint (not a local directory, not in the local hub cache) falls back to its name,
    which then has to match exactly on both sides."""
    model_config = vllm_config.model_config
    try:
        fingerprint = model_fingerprint(model_config.model)
    except (FingerprintError, OSError, ValueError) as error:
        logger.warning("cannot fingerprint model %s (%s); the KV handshake compares its name instead",
                       model_config.model, error)
        fingerprint = f"name:{model_config.model}"
    return ModelIdentity(fingerprint, model_config.get_num_kv_heads(vllm_config.parallel_config),
                         model_config.get_head_size())
