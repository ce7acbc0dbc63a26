"""The connector's worker half, in the model-runner process. It moves bytes, it never decides.

Producer: serves pulls of leased blocks from a `TransferServer`, reports released and expired
leases as `finished_sending`. With transport `shm` or `auto` and a CPU cache, the cache itself is
allocated in a shared-memory segment (`allocation_context`), which same-host consumers read
one-sidedly; the segment is unlinked at shutdown. With a CUDA cache vLLM allocates as usual and the
registered cache is exported as CUDA IPC handles (`CudaCache`), which consumers on the same node
that see the GPU read one-sidedly. Consumer: runs each requested pull on a small thread pool (the pull
itself releases the producer's lease once the bytes are in, on the same connection), and reports
the request as `finished_recving` (and, on failure, as `failed_recving` with its blocks invalid, so
vLLM's `kv_load_failure_policy` applies, after a one-shot release of the producer's lease). A pull
whose bytes all arrived but some blocks' checksums differ (`ChecksumMismatch`) reports the request
`finished_recving` with exactly those blocks invalid: vLLM keeps the good prefix and recomputes
from the first bad block on (`recompute`), or fails the request (`fail`).

Both sides describe themselves at handshake with `KVCompat`: the model's fingerprint (its
checkpoint's contents, not its path), dtype, block size, KV heads and head size, cache layout.
Both authenticate each other first with the cluster secret in `config.cluster_secret_file`, under
the identity `config.worker_id` (`kv_transfer.auth`); the file is read when the cache is registered,
so a missing or bad one stops the engine at startup.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from kv_transfer.auth import Credentials, process_credentials
from kv_transfer.config import ConnectorConfig
from kv_transfer.consumer import PullClient
from kv_transfer.errors import ChecksumMismatch
from kv_transfer.layout import KVLayout
from kv_transfer.lease_board import LeaseBoard
from kv_transfer.leases import Lease, LeaseTable
from kv_transfer.metadata import PDConnectorMetadata, PDWorkerMeta
from kv_transfer.records import PullReport, PullSpec, ReleaseSpec
from kv_transfer.producer import TransferServer
from kv_transfer.shm_segment import SegmentAllocation, SegmentError
from kv_transfer.threads import PULL_THREAD_NAME, name_this_thread
from kv_transfer.transports.base import served
from kv_transfer.transports.cuda_ipc_cache import CudaCache
from kv_transfer.transports.shm import SharedCache

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelIdentity:
    """What the handshake compares about the model besides the cache tensors themselves."""

    fingerprint: str = ""
    num_kv_heads: int = 0
    head_dim: int = 0


class PDWorker:
    def __init__(self, config: ConnectorConfig, is_producer: bool, is_consumer: bool, block_size: int,
                 num_blocks: int, identity: ModelIdentity = ModelIdentity(), cache_bytes: int = 0,
                 device_type: str = "cpu"):
        self.config = config
        self.is_producer, self.is_consumer = is_producer, is_consumer
        self.block_size, self.num_blocks = block_size, num_blocks
        self.identity = identity
        self.leases = LeaseTable()
        self.server: TransferServer | None = None
        self.client: PullClient | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._inflight: dict[str, tuple[PullSpec, Future]] = {}   # future: (report, invalid local ids)
        self._invalid_block_ids: set[int] = set()
        self._reports: dict[str, PullReport] = {}
        self.cache_bytes = cache_bytes
        self.device_type = device_type  # where vLLM puts the KV cache ("cpu", "cuda")
        self._allocation: SegmentAllocation | None = None
        self.shared_cache: SharedCache | CudaCache | None = None
        self._stale_checked_at = 0.0

    def allocation_context(self) -> SegmentAllocation | None:
        """Where vLLM allocates the KV cache: a shared-memory segment for a CPU producer whose
        transport reads one-sidedly (shm, auto); None (vLLM's own memory, its own pools) otherwise.
        CUDA needs no special allocation: any cudaMalloc'd cache exports as IPC handles."""
        if self.device_type != "cpu":
            return None
        if not (self.is_producer and self.config.transport in ("shm", "auto") and self.cache_bytes > 0):
            return None
        self._allocation = SegmentAllocation(self.cache_bytes)
        return self._allocation

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        layout = KVLayout(kv_caches, self.num_blocks)
        credentials = Credentials.from_file(self.config.cluster_secret_file,
                                            self.config.worker_id or process_credentials().identity,
                                            self.config.kv_encryption)
        compat = layout.compat(self.config.model, self.block_size, fingerprint=self.identity.fingerprint,
                               num_kv_heads=self.identity.num_kv_heads, head_dim=self.identity.head_dim)
        if self.is_producer:
            self.shared_cache = (self._cuda_cache(kv_caches) if layout.device.type == "cuda"
                                 else self._shared_cache(kv_caches))
            self.server = TransferServer(layout, compat, self.leases, self.config.bind_host or self.config.host,
                                         self.config.port, io_timeout_s=self.config.pull_timeout_s,
                                         transports=served(self.config.transport, layout.device.type),
                                         congestion=self.config.tcp_congestion, shared_cache=self.shared_cache,
                                         grant_token=self.config.grant_token, credentials=credentials,
                                         faults=self.config.faults)
            logger.info("pdserve KV transfer server on %s (%s)", self.server.start(), self.config.transport)
        if self.is_consumer:
            self.client = PullClient(layout, compat, self.config.transport, self.config.pull_timeout_s,
                                     self.config.tcp_congestion, credentials, faults=self.config.faults)
            # named for the kernel too, so the pulls' CPU can be read apart in /proc (`kv_transfer.threads`)
            self._pool = ThreadPoolExecutor(self.config.max_parallel_pulls, thread_name_prefix="pdserve-kv-pull",
                                            initializer=name_this_thread, initargs=(PULL_THREAD_NAME,))

    def _cuda_cache(self, kv_caches: dict[str, torch.Tensor]) -> CudaCache | None:
        """The CUDA cache exported for one-sided reads (shm, auto), before any consumer connects."""
        if self.config.transport not in ("shm", "auto"):
            return None
        return CudaCache.of(kv_caches, self.num_blocks)

    def _shared_cache(self, kv_caches: dict[str, torch.Tensor]) -> SharedCache | None:
        segment = self._allocation.segment if self._allocation is not None else None
        if segment is None:
            if self.config.transport in ("shm", "auto"):
                logger.warning("the KV cache is not in shared memory (vLLM allocated it otherwise): "
                               "consumers read it over tcp")
            return None
        try:
            shared = SharedCache.of(segment, kv_caches, self.num_blocks)
            self.leases.attach_board(LeaseBoard(segment.board_area()))
            return shared
        except SegmentError as error:
            logger.warning("%s: consumers read the KV cache over tcp", error)
            return None

    @property
    def pulls_beside_forward(self) -> bool:
        """Whether a step's pulls start when its metadata is bound, before its forward, and so run
        beside it: on a CPU cache, where the forward holds the step until it ends. On a GPU vLLM's
        own order (after the forward's launch, which returns at once) overlaps them already."""
        return self.device_type == "cpu"

    def start_load_kv(self, meta: PDConnectorMetadata) -> None:
        for grant in meta.grants:
            self.leases.grant(Lease(grant.transfer_id, grant.request_id, grant.block_ids, grant.num_tokens,
                                    time.monotonic() + grant.lease_s))
        for pull in meta.pulls:
            self._inflight[pull.request_id] = (pull, self._require_pool().submit(self._pull, pull))
        for release in meta.releases:
            self._require_pool().submit(self._release, release)

    def get_transfer_results(self) -> tuple[set[str], set[str], set[str]]:
        """(finished_sending, finished_recving, failed_recving) since the last call."""
        expired = self.leases.expire()
        if expired:
            logger.warning("released %d KV leases nobody pulled in time: %s", len(expired),
                           [lease.transfer_id for lease in expired])
        finished_sending = self.leases.take_released()
        self._drop_stale_connections()
        finished_recving, failed_recving = set(), set()
        for request_id, (pull, future) in list(self._inflight.items()):
            if not future.done():
                continue
            del self._inflight[request_id]
            finished_recving.add(request_id)
            report, invalid = future.result()
            self._reports[request_id] = report
            if report.error:
                # Blocks with a wrong checksum: exactly those are invalid, and vLLM keeps the prefix
                # before the first. Any other failure: the whole request recomputes.
                if invalid == tuple(pull.local_block_ids):
                    failed_recving.add(request_id)
                self._invalid_block_ids.update(invalid)
        return finished_sending, finished_recving, failed_recving

    def _drop_stale_connections(self, every_s: float = 2.0) -> None:
        """Consumer: at most every `every_s`, lets go of maps of producers that are gone."""
        now = time.monotonic()
        if self.client is None or now - self._stale_checked_at < every_s:
            return
        self._stale_checked_at = now
        for address in self.client.drop_stale():
            logger.info("the KV producer at %s is gone: our map of its cache (shm or CUDA IPC) is released", address)

    def take_invalid_block_ids(self) -> set[int]:
        invalid, self._invalid_block_ids = self._invalid_block_ids, set()
        return invalid

    def take_worker_meta(self) -> PDWorkerMeta | None:
        if not self._reports:
            return None
        meta, self._reports = PDWorkerMeta(self._reports), {}
        return meta

    def shutdown(self) -> None:
        if self.server is not None:
            self.server.stop()
        if self._allocation is not None and self._allocation.segment is not None:
            self._allocation.segment.close()  # unlinked; the engine's own map ends with the process
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self.client is not None:
            self.client.close()

    def _pull(self, pull: PullSpec) -> tuple[PullReport, tuple[int, ...]]:
        """(the report, the local block ids that failed to load). Never raises: a failure becomes a
        report with `error` set."""
        assert self.client is not None
        started = time.perf_counter()
        try:
            result = self.client.pull(pull.address, pull.transfer_id, pull.remote_block_ids, pull.local_block_ids,
                                      release=True)
        except ChecksumMismatch as error:  # the exchange completed and released the lease
            logger.warning("KV pull for %s: %s; those blocks will be recomputed", pull.request_id, error)
            return (PullReport(0, 0, time.perf_counter() - started, pull.num_tokens, str(error)),
                    tuple(error.block_ids))
        except (OSError, ValueError, RuntimeError) as error:  # TransferError is a RuntimeError
            logger.warning("KV pull for %s failed, the prompt will be recomputed: %s", pull.request_id, error)
            # off the pull's path: a producer that is unreachable would hold the recompute for as long
            # as the release's connect waits (its lease expiry frees the blocks anyway)
            self._require_pool().submit(self._release, ReleaseSpec(pull.transfer_id, pull.address))
            return (PullReport(0, 0, time.perf_counter() - started, pull.num_tokens, str(error)),
                    tuple(pull.local_block_ids))
        return PullReport(result.num_bytes, result.num_blocks, result.seconds, pull.num_tokens), ()

    def _release(self, release: ReleaseSpec) -> None:
        assert self.client is not None
        try:
            self.client.release(release.address, release.transfer_id)
        except (OSError, RuntimeError) as error:  # the producer's lease expiry frees it instead
            logger.warning("could not release KV %s at %s: %s", release.transfer_id, release.address, error)

    def _require_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            raise RuntimeError("this worker is not a KV consumer (kv_role must be kv_consumer or kv_both)")
        return self._pool
