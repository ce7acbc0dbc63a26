"""The handshake refuses a peer whose blocks would mean something else, and says what differs."""

import shutil
import time

import pytest
import torch

from kv_transfer.consumer import PullClient
from kv_transfer.fingerprint import model_fingerprint
from kv_transfer.layout import KVLayout
from kv_transfer.leases import Lease, LeaseTable
from kv_transfer.producer import TransferServer
from kv_transfer.wire import IncompatiblePeer


def _caches(dtype=torch.bfloat16, layers=2, num_blocks=16, block_size=32):
    return {f"layer.{i}": torch.ones(num_blocks, 2, block_size, 64, dtype=dtype) for i in range(layers)}


@pytest.fixture
def checkpoints(tmp_path, make_checkpoint):
    """The same checkpoint at two paths under different names, and another one named like the first."""
    first = make_checkpoint(tmp_path / "node-a" / "llama-3-8b", seed=0)
    same = tmp_path / "mnt" / "shared" / "Meta-Llama-3-8B"
    shutil.copytree(first, same)
    other = make_checkpoint(tmp_path / "node-b" / "llama-3-8b", seed=7)  # a fine-tune in a same-named folder
    return first, same, other


@pytest.fixture
def producer(checkpoints):
    layout = KVLayout(_caches(), 16)
    compat = layout.compat("llama-3-8b", 32, fingerprint=model_fingerprint(checkpoints[0]), num_kv_heads=2,
                           head_dim=64)
    leases = LeaseTable()
    server = TransferServer(layout, compat, leases, "127.0.0.1", 0, transports=("tcp",))
    leases.grant(Lease("t1", "r1", (3, 4), 64, time.monotonic() + 30))
    yield server, f"127.0.0.1:{server.start()}"
    server.stop()


def _consumer(checkpoint, name="llama-3-8b", dtype=torch.bfloat16, block_size=32, transport="tcp", heads=2):
    layout = KVLayout(_caches(dtype, block_size=block_size), 16)
    compat = layout.compat(name, block_size, fingerprint=model_fingerprint(checkpoint), num_kv_heads=heads,
                           head_dim=64)
    return PullClient(layout, compat, transport, timeout_s=10)


def test_the_same_model_at_two_paths_under_two_names_is_accepted(producer, checkpoints):
    server, address = producer
    client = _consumer(checkpoints[1], name="Meta-Llama-3-8B")
    assert client.pull(address, "t1", [3, 4], [8, 9]).num_blocks == 2
    assert (server.stats.data_channels, server.stats.refused_handshakes) == (1, 0)
    client.close()


def test_another_checkpoint_with_the_same_directory_name_is_refused(producer, checkpoints):
    server, address = producer
    mine, theirs = model_fingerprint(checkpoints[0]), model_fingerprint(checkpoints[2])
    with pytest.raises(IncompatiblePeer) as refused:
        _consumer(checkpoints[2]).pull(address, "t1", [3, 4], [8, 9])
    message = str(refused.value)
    assert f"model_fingerprint: '{mine}' at the producer vs '{theirs}' at the consumer" in message
    assert "different checkpoints" in message and "dtype" not in message
    assert server.stats.refused_handshakes == 1


@pytest.mark.parametrize("consumer_kwargs, difference", [
    ({"dtype": torch.float16}, "dtype: 'bfloat16' at the producer vs 'float16' at the consumer"),
    ({"block_size": 16}, "block_size: 32 at the producer vs 16 at the consumer"),
    ({"heads": 4}, "num_kv_heads: 2 at the producer vs 4 at the consumer"),
])
def test_a_mismatched_dtype_block_size_or_geometry_is_refused_naming_it(producer, checkpoints, consumer_kwargs,
                                                                       difference):
    server, address = producer
    with pytest.raises(IncompatiblePeer, match="incompatible KV peer") as refused:
        _consumer(checkpoints[0], **consumer_kwargs).pull(address, "t1", [3, 4], [8, 9])
    assert difference in str(refused.value)
    assert "model_fingerprint" not in str(refused.value)
    assert (server.stats.refused_handshakes, server.stats.transfers) == (1, 0)


def test_a_transport_the_producer_does_not_serve_is_refused(producer, checkpoints):
    server, address = producer
    with pytest.raises(IncompatiblePeer, match=r"transport: \['tcp'\] at the producer vs 'torch' at the consumer"):
        _consumer(checkpoints[0], transport="torch").pull(address, "t1", [3, 4], [8, 9])
    assert server.stats.refused_handshakes == 1
