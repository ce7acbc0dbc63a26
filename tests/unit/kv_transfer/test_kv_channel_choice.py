"""Which channel a consumer gets: the pure decision, and the transport each configured name builds."""

import pytest
import torch

from kv_transfer.layout import KVLayout
from kv_transfer.transports.base import SERVED, get_transport, served
from kv_transfer.transports.choice import (CPU_NOT_SHARED, CPU_OTHER_HOST, CUDA_GPU_HIDDEN, CUDA_NOT_EXPORTED,
                                           CUDA_OTHER_NODE, TCP_ON_GPU, ChannelChoice, choose_channel, same_boot)
from kv_transfer.transports.cuda_ipc import CudaIpcTransport
from kv_transfer.transports.shm import ShmTransport
from kv_transfer.transports.tcp import TcpTransport
from kv_transfer.transports.torch_dist import TorchDistTransport

# device, requested, same boot, producer GPU visible to the consumer, cache shareable -> choice
DECISIONS = [
    ("cpu", "shm", True, False, True, ChannelChoice("shm")),
    ("cpu", "auto", True, False, True, ChannelChoice("shm")),
    ("cpu", "shm", False, False, True, ChannelChoice(None, CPU_OTHER_HOST)),
    ("cpu", "auto", False, False, True, ChannelChoice("tcp", CPU_OTHER_HOST)),
    ("cpu", "shm", True, False, False, ChannelChoice(None, CPU_NOT_SHARED)),
    ("cpu", "auto", True, False, False, ChannelChoice("tcp", CPU_NOT_SHARED)),
    ("cpu", "auto", False, False, False, ChannelChoice("tcp", CPU_NOT_SHARED)),
    ("cpu", "tcp", False, False, False, ChannelChoice("tcp")),
    ("cpu", "torch", True, False, True, ChannelChoice("torch")),
    ("cuda", "shm", True, True, True, ChannelChoice("cuda_ipc")),
    ("cuda", "auto", True, True, True, ChannelChoice("cuda_ipc")),
    ("cuda", "shm", False, True, True, ChannelChoice(None, CUDA_OTHER_NODE)),
    ("cuda", "auto", False, True, True, ChannelChoice("torch", CUDA_OTHER_NODE)),
    ("cuda", "auto", False, False, True, ChannelChoice("torch", CUDA_OTHER_NODE)),
    ("cuda", "shm", True, False, True, ChannelChoice(None, CUDA_GPU_HIDDEN)),
    ("cuda", "auto", True, False, True, ChannelChoice("torch", CUDA_GPU_HIDDEN)),
    ("cuda", "shm", True, True, False, ChannelChoice(None, CUDA_NOT_EXPORTED)),
    ("cuda", "auto", True, True, False, ChannelChoice("torch", CUDA_NOT_EXPORTED)),
    ("cuda", "torch", False, False, False, ChannelChoice("torch")),
    ("cuda", "tcp", True, True, True, ChannelChoice(None, TCP_ON_GPU)),
]


@pytest.mark.parametrize("device, requested, one_boot, visible, shareable, expected", DECISIONS)
def test_the_channel_follows_the_decision_table(device, requested, one_boot, visible, shareable, expected):
    assert choose_channel(device, requested, same_boot=one_boot, peer_gpu_visible=visible,
                          cache_shared=shareable) == expected


def test_an_unknown_transport_or_device_has_no_one_sided_channel():
    assert choose_channel("cpu", "rdma", same_boot=True, peer_gpu_visible=True, cache_shared=True).channel is None
    xpu = choose_channel("xpu", "auto", same_boot=True, peer_gpu_visible=True, cache_shared=True)
    assert xpu == ChannelChoice("torch", "KV caches on xpu have no one-sided channel")
    assert choose_channel("xpu", "shm", same_boot=True, peer_gpu_visible=True, cache_shared=True).channel is None


def test_the_same_boot_needs_a_boot_id_on_both_sides():
    assert same_boot({"boot_id": "b-1"}, "b-1") is True
    assert same_boot({"boot_id": "b-2"}, "b-1") is False
    assert same_boot({}, "b-1") is False
    assert same_boot({"boot_id": ""}, "") is False  # no /proc here: never "one host"


def test_cpu_producers_serve_as_before_and_cuda_ones_fall_back_to_torch():
    assert [served(name) for name in ("tcp", "torch", "shm", "auto")] == [SERVED[n] for n in SERVED]
    assert served("shm", "cuda") == ("shm", "auto", "torch")
    assert served("auto", "cuda") == ("auto", "shm", "torch")
    assert served("torch", "cuda") == ("torch", "auto")


def _layout() -> KVLayout:
    return KVLayout({"layer.0": torch.zeros(4, 2, 8, 16)}, 4)


@pytest.mark.parametrize("name, device, kind, transport_name", [
    ("shm", "cpu", ShmTransport, "shm"),
    ("auto", "cpu", ShmTransport, "auto"),
    ("shm", "cuda", CudaIpcTransport, "shm"),
    ("auto", "cuda", CudaIpcTransport, "auto"),
    ("tcp", "cuda", TcpTransport, "tcp"),
    ("torch", "cuda", TorchDistTransport, "torch"),
])
def test_get_transport_picks_the_implementation_by_the_cache_device(name, device, kind, transport_name):
    """Building a CUDA transport touches no GPU (this machine has none): CUDA runs only at handshake."""
    transport = get_transport(name, 5.0, device=torch.device(device))
    assert type(transport) is kind and transport.name == transport_name


def test_a_consumer_layout_decides_the_device_when_none_is_given():
    transport = get_transport("auto", 5.0, local=_layout())
    assert type(transport) is ShmTransport and transport.local is not None


@pytest.mark.parametrize("device_type, in_a_segment", [("cpu", True), ("cuda", False)])
def test_only_a_cpu_producer_allocates_its_cache_in_a_segment(device_type, in_a_segment):
    """CUDA needs no special allocation (any cudaMalloc'd cache exports), so vLLM keeps its own."""
    from kv_transfer.config import ConnectorConfig
    from kv_transfer.shm_segment import SegmentAllocation
    from kv_transfer.worker_side import PDWorker

    worker = PDWorker(ConnectorConfig(transport="auto"), True, False, 16, 8, cache_bytes=1 << 20,
                      device_type=device_type)
    assert isinstance(worker.allocation_context(), SegmentAllocation) is in_a_segment
