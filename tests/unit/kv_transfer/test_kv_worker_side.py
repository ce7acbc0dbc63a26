"""The connector's worker half, both roles, over real sockets: pulls, releases and what vLLM is told."""

import time
from pathlib import Path

import pytest
import torch

from kv_transfer.config import ConnectorConfig
from kv_transfer.consumer import PullClient
from kv_transfer.layout import KVLayout
from kv_transfer.leases import Lease, LeaseTable
from kv_transfer.metadata import PDConnectorMetadata
from kv_transfer.records import LeaseGrant, PullSpec
from kv_transfer.threads import PULL_THREAD_NAME
from kv_transfer.producer import TransferServer
from kv_transfer.wire import IncompatiblePeer
from kv_transfer.worker_side import ModelIdentity, PDWorker

IDENTITY = ModelIdentity("sha256:feed", num_kv_heads=2, head_dim=32)


def _caches(seed, num_blocks=32):
    generator = torch.Generator().manual_seed(seed)
    return {f"layer.{i}": torch.randn(num_blocks, 2, 32, 64, generator=generator).to(torch.bfloat16)
            for i in range(3)}


def _until(read, timeout_s=5.0):
    """Polls `read()` (one engine step each) until it returns something truthy."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = read()
        if value:
            return value
        time.sleep(0.01)
    raise TimeoutError("nothing happened in time")


@pytest.fixture
def producer():
    source = _caches(0)
    layout = KVLayout(source, 32)
    leases = LeaseTable()
    compat = layout.compat("m", 32, fingerprint=IDENTITY.fingerprint, num_kv_heads=2, head_dim=32)
    server = TransferServer(layout, compat, leases, "127.0.0.1", 0)
    yield source, leases, server, f"127.0.0.1:{server.start()}"
    server.stop()


def test_a_consumer_pull_releases_the_producer_lease_without_a_second_connection(producer):
    source, leases, server, address = producer
    leases.grant(Lease("x1", "prefill-req", (4, 5, 6), 90, time.monotonic() + 30))
    target = _caches(1)
    worker = PDWorker(ConnectorConfig(transport="tcp"), False, True, 32, 32, IDENTITY)
    worker.register_kv_caches(target)
    worker.start_load_kv(PDConnectorMetadata(pulls=[PullSpec("dec-1", "x1", address, (4, 5, 6), (20, 21, 22), 90)]))
    sending, recving, failed = _until(lambda: [r for r in [worker.get_transfer_results()] if r[1]] or None)[0]
    assert (sending, recving, failed) == (set(), {"dec-1"}, set())
    for name in source:
        assert torch.equal(source[name][4:7], target[name][20:23])
    meta = worker.take_worker_meta()
    report = meta.reports["dec-1"]
    assert (report.num_bytes, report.num_blocks, report.num_tokens, report.error) == (3 * 3 * 8192, 3, 90, "")
    assert _until(lambda: leases.take_released()) == {"prefill-req"}
    assert server.stats.connections == 1  # the release rode on the pull's connection
    worker.shutdown()


def _kernel_thread_names() -> set[str]:
    tasks = Path("/proc/self/task")
    return {(task / "comm").read_text().strip() for task in tasks.iterdir() if (task / "comm").exists()}


def test_a_consumers_pulls_run_on_threads_the_kernel_knows_by_name_so_their_cpu_can_be_read(producer):
    # the profile reads the KV connector's CPU in an engine's process by these names (`kv_transfer.threads.KV_THREAD_PREFIX`)
    source, leases, server, address = producer
    leases.grant(Lease("n1", "prefill-req", (4,), 32, time.monotonic() + 30))
    worker = PDWorker(ConnectorConfig(transport="tcp"), False, True, 32, 32, IDENTITY)
    worker.register_kv_caches(_caches(1))
    worker.start_load_kv(PDConnectorMetadata(pulls=[PullSpec("dec-n", "n1", address, (4,), (9,), 32)]))
    _until(lambda: [r for r in [worker.get_transfer_results()] if r[1]] or None)
    assert PULL_THREAD_NAME in _kernel_thread_names()
    assert {name for name in _kernel_thread_names() if name.startswith("pdserve-kv-conn")}   # the producer's side


def test_a_failed_pull_is_reported_with_its_blocks_invalid_and_the_lease_released(producer):
    _, leases, server, address = producer
    leases.grant(Lease("x2", "prefill-req", (4,), 20, time.monotonic() + 30))
    worker = PDWorker(ConnectorConfig(transport="tcp"), False, True, 32, 32, IDENTITY)
    worker.register_kv_caches(_caches(1))
    # block 5 is not part of the transfer: the producer answers MISSING
    worker.start_load_kv(PDConnectorMetadata(pulls=[PullSpec("dec-2", "x2", address, (5,), (9,), 20)]))
    sending, recving, failed = _until(lambda: [r for r in [worker.get_transfer_results()] if r[1]] or None)[0]
    assert (recving, failed, worker.take_invalid_block_ids()) == ({"dec-2"}, {"dec-2"}, {9})
    report = worker.take_worker_meta().reports["dec-2"]
    assert report.num_bytes == 0 and report.error == "requested blocks are not part of the transfer"
    assert report.as_params()["kv_loaded_tokens"] == 0
    # the failure path's one-shot RELEASE, sent off the pull's path (the recompute does not wait for it)
    assert _until(leases.take_released) == {"prefill-req"}
    assert server.stats.connections == 2
    worker.shutdown()


def test_a_producer_worker_serves_its_transport_only_and_reports_the_sent_request():
    config = ConnectorConfig(transport="tcp", host="127.0.0.1", port=0, pull_timeout_s=5.0)
    worker = PDWorker(config, True, False, 32, 32, IDENTITY)
    source = _caches(2)
    worker.register_kv_caches(source)
    address = f"127.0.0.1:{worker.server.port}"
    worker.start_load_kv(PDConnectorMetadata(grants=[LeaseGrant("x3", "pre-3", (1, 2), 40, 30.0)]))
    layout = KVLayout(_caches(3), 32)
    compat = layout.compat("m", 32, fingerprint=IDENTITY.fingerprint, num_kv_heads=2, head_dim=32)
    with pytest.raises(IncompatiblePeer, match="transport"):
        PullClient(layout, compat, "torch").pull(address, "x3", [1, 2], [1, 2])
    assert worker.get_transfer_results() == (set(), set(), set()) and worker.server.num_held_leases == 1
    client = PullClient(layout, compat, "tcp")
    client.pull(address, "x3", [1, 2], [7, 8], release=True)
    assert _until(lambda: worker.get_transfer_results()[0]) == {"pre-3"}
    assert worker.server.num_held_leases == 0
    client.close()
    worker.shutdown()


def test_an_unpulled_lease_expires_into_finished_sending():
    config = ConnectorConfig(transport="tcp", host="127.0.0.1", port=0, lease_s=0.05)
    worker = PDWorker(config, True, False, 32, 32, IDENTITY)
    worker.register_kv_caches(_caches(2))
    worker.start_load_kv(PDConnectorMetadata(grants=[LeaseGrant("x4", "pre-4", (3,), 10, 0.05)]))
    assert worker.get_transfer_results() == (set(), set(), set())
    time.sleep(0.1)
    assert worker.get_transfer_results() == ({"pre-4"}, set(), set())
    assert worker.leases.num_expired == 1
    worker.shutdown()


def test_workers_given_the_cluster_secret_file_pull_from_each_other_and_refuse_a_worker_without_it(tmp_path):
    """Both connector halves as vLLM builds them from `kv_connector_extra_config`: the file's path and
    the worker id, nothing else; the prefill worker's own process releases as the producer's owner."""
    from kv_transfer.auth import Credentials, create_secret_file
    from kv_transfer.consumer import release_transfer
    from kv_transfer.wire import TransferError

    secret_file = str(create_secret_file(tmp_path / "cluster-secret"))
    prefill = PDWorker(ConnectorConfig(transport="tcp", port=0, cluster_secret_file=secret_file, worker_id="prefill-0"),
                       True, False, 32, 32, IDENTITY)
    prefill.register_kv_caches(_caches(0))
    address = f"127.0.0.1:{prefill.server.port}"
    prefill.leases.grant(Lease("x5", "prefill-req", (4, 5), 64, time.monotonic() + 30))
    decode = PDWorker(ConnectorConfig(transport="tcp", cluster_secret_file=secret_file, worker_id="decode-0"),
                      False, True, 32, 32, IDENTITY)
    decode.register_kv_caches(_caches(1))
    stranger = PDWorker(ConnectorConfig(transport="tcp", worker_id="decode-9"), False, True, 32, 32, IDENTITY)
    stranger.register_kv_caches(_caches(1))
    with pytest.raises(TransferError, match="authentication failed"):
        stranger.client.pull(address, "x5", [4, 5], [1, 2])
    assert decode.client.pull(address, "x5", [4, 5], [1, 2]).num_blocks == 2
    assert prefill.leases.consumer_of("x5") == "decode-0"
    owner = Credentials.from_file(secret_file, "prefill-0")   # what pdserve.worker.main installs for its process
    assert release_transfer(address, "x5", credentials=owner) is True
    # the lease ends once the pull's send is done with it (the producer's thread may still be closing it)
    assert _until(prefill.leases.take_released) == {"prefill-req"}
    for worker in (stranger, decode, prefill):
        worker.shutdown()


def _connector(worker: PDWorker):
    """The connector's worker role around `worker`, built without a vLLM config (which only picks the
    half); vLLM's model runner calls it as here: bind the step's metadata, run the forward, then
    `start_load_kv` and `get_finished`."""
    from kv_transfer.connector import PDConnector

    connector = PDConnector.__new__(PDConnector)
    connector._scheduler, connector._worker, connector._started = None, worker, None
    connector._connector_metadata = None
    return connector


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_a_steps_pull_starts_when_its_metadata_is_bound_on_a_cpu_cache_and_once(producer, device_type):
    """On a CPU the forward runs to its end between the metadata's binding and `start_load_kv`: a
    pull started only there is reported a step late. It starts at the binding instead, and
    `start_load_kv` does not pull it again; on a GPU vLLM's own order stands."""
    source, leases, server, address = producer
    leases.grant(Lease("x9", "prefill-req", (4, 5), 60, time.monotonic() + 30))
    target = _caches(1)
    worker = PDWorker(ConnectorConfig(transport="tcp"), False, True, 32, 32, IDENTITY, device_type=device_type)
    worker.register_kv_caches(target)
    connector = _connector(worker)
    meta = PDConnectorMetadata(pulls=[PullSpec("dec-9", "x9", address, (4, 5), (20, 21), 60)])
    connector.bind_connector_metadata(meta)
    if device_type == "cpu":   # in flight before the forward: its bytes land while the step computes
        _until(lambda: all(torch.equal(source[n][4:6], target[n][20:22]) for n in source))
    else:
        assert worker.get_transfer_results() == (set(), set(), set()) and not worker._inflight
    connector.start_load_kv(forward_context=None)
    finished = _until(lambda: connector.get_finished(set())[1])
    assert finished == {"dec-9"}
    connector.start_load_kv(forward_context=None)   # the same step's metadata again: nothing new
    connector.clear_connector_metadata()
    assert not worker._inflight and worker.get_transfer_results() == (set(), set(), set())
    assert leases.num_held == 0          # pulled once, and its lease released by that pull
