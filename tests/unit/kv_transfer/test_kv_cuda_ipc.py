"""The CUDA IPC transport (`shm`/`auto` on CUDA), proven on CPU.

This machine has no GPU, so the one thing stood in for is the GPU runtime behind `IpcBackend`
(`gpu_stand_in`, see conftest: CPU tensors, a dict as the node's driver). Everything above it is
the real code: the handshake over real sockets, the copies, the NCCL fallback (which runs on gloo
here, since the stand-in's memory is on the CPU). The description's checks: test_kv_cuda_ipc_description.
"""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import pytest
import torch

from kv_transfer.faults import FaultPlan, injector
from kv_transfer.geometry import BlockGeometry
from kv_transfer.layout import KVLayout
from kv_transfer.shm_segment import boot_id
from kv_transfer.sockets import configure, connect
from kv_transfer.transports.choice import CUDA_GPU_HIDDEN, CUDA_NOT_EXPORTED, CUDA_OTHER_NODE
from kv_transfer.transports.cuda_ipc import CudaIpcTransport
from kv_transfer.transports.cuda_ipc_backend import IpcHandle
from kv_transfer.transports.cuda_ipc_cache import CudaCache
from kv_transfer.wire import IncompatiblePeer, TransferError, encode, expect, recv_message, send_message

GEOMETRY = BlockGeometry(num_layers=3, num_kv_heads=2, head_dim=16, block_size=8, dtype="bfloat16")
NUM_BLOCKS = 24
CPU = torch.device("cpu")


def _producer_caches(seed=7):
    return GEOMETRY.caches(NUM_BLOCKS, seed=seed)  # one buffer, the layers at offsets: one storage


def _same_bytes(a, b) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _serve_handshake(transport, sock):
    """The producer's half, as `TransferServer._handshake` runs it; its error, if it failed."""
    hello = recv_message(sock)
    refusal = transport.refusal(hello)
    if refusal:
        send_message(sock, {"op": "REFUSED", "error": refusal})
        return None
    welcome = {"op": "WELCOME", **transport.welcome_fields(hello)}
    send_message(sock, welcome)
    try:
        return transport.producer_channel(sock, hello, CPU, welcome)
    except TransferError as error:
        return error


def _handshake(producer, consumer, hello_extra=None):
    """Both halves over a real TCP connection: (producer channel, consumer channel, sockets)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        consumer_sock = connect("127.0.0.1", listener.getsockname()[1], 10)
        producer_sock, _ = listener.accept()
    configure(producer_sock, 10)
    with ThreadPoolExecutor(1) as pool:
        serving = pool.submit(_serve_handshake, producer, producer_sock)
        offer = consumer.consumer_offer(consumer_sock, CPU)
        send_message(consumer_sock, {"op": "HELLO", "transport": consumer.name, **offer.fields, **(hello_extra or {})})
        reply = recv_message(consumer_sock)
        try:
            if reply["op"] == "REFUSED":
                raise IncompatiblePeer(reply["error"])
            consumer_channel = offer.connect(consumer_sock, reply)
        finally:
            producer_channel = serving.result(timeout=30)
    if isinstance(producer_channel, Exception):
        raise producer_channel
    return producer_channel, consumer_channel, (producer_sock, consumer_sock)


@pytest.fixture
def pair(gpu_stand_in):
    """(source caches, target caches, the producer's exported cache, make, driver): `make(name,
    uuids)` builds a producer transport over the stand-in GPU and a consumer transport (seeing the
    GPUs `uuids`) that copies into the target, and returns them with the consumer's stand-in."""
    driver: dict = {}
    source = _producer_caches()
    cache = CudaCache.of(source, NUM_BLOCKS, gpu_stand_in(driver))
    target = GEOMETRY.caches(NUM_BLOCKS)

    def make(name="auto", uuids=("GPU-consumer", "GPU-producer"), faults=""):
        auto, plan = name == "auto", FaultPlan.parse(faults) if faults else None
        producer = CudaIpcTransport(5.0, cache=cache, fallback_torch=auto, backend=gpu_stand_in(driver),
                                    faults=injector(plan, "producer"))
        consumer_backend = gpu_stand_in(driver, uuids)
        consumer = CudaIpcTransport(5.0, local=KVLayout(target, NUM_BLOCKS), fallback_torch=auto,
                                    backend=consumer_backend, faults=injector(plan, "consumer"))
        return producer, consumer, consumer_backend

    return source, target, cache, make, driver


@pytest.mark.parametrize("name", ["shm", "auto"])
def test_a_consumer_that_sees_the_gpu_copies_exactly_the_leased_blocks_itself(pair, name):
    source, target, _, make, _ = pair
    producer, consumer, backend = make(name)
    producer_channel, channel, socks = _handshake(producer, consumer)
    assert (producer_channel.kind, channel.kind) == ("mapped", "mapped")
    untouched = {n: t[0].clone() for n, t in target.items()}
    copied = channel.copy([1, 2, 9, 10], [5, 6, 7, 20])
    for n in source:
        assert _same_bytes(source[n][[5, 6, 7, 20]], target[n][[1, 2, 9, 10]])
        assert _same_bytes(untouched[n], target[n][0])
    assert copied == 4 * GEOMETRY.bytes_per_block
    block = GEOMETRY.bytes_per_block_layer  # runs (5,7) (7,8) (20,21), layer by layer, then synchronize
    assert backend.copied == [2 * block, block, block] * 3 and backend.synchronized == 1
    for sock in socks:
        sock.close()


def test_an_injected_flip_changes_one_copied_byte_and_a_stall_delays_the_copy_but_not_its_bytes(pair):
    """The fault hook (kv_transfer.faults) at the consumer's copy: the flipped byte is in the
    target before the caller takes its checksums, so the pull reports that block invalid."""
    source, target, _, make, _ = pair
    _, channel, socks = _handshake(*make("shm", faults="flip_bytes@1,stall_reader@2,stall_s=0.5")[:2])
    channel.copy([1, 2, 9, 10], [5, 6, 7, 20])
    differing = sum(int((source[n][[5, 6, 7, 20]].view(torch.uint8) != target[n][[1, 2, 9, 10]].view(torch.uint8))
                        .sum()) for n in source)
    assert differing == 1
    started = time.monotonic()
    channel.copy([1, 2, 9, 10], [5, 6, 7, 20])
    assert time.monotonic() - started >= 0.5
    assert all(_same_bytes(source[n][[5, 6, 7, 20]], target[n][[1, 2, 9, 10]]) for n in source)
    for sock in socks:
        sock.close()


def test_an_injected_silent_producer_answers_nothing_and_raises_once_the_consumer_leaves(pair):
    _, _, _, make, _ = pair
    producer_channel, _, (producer_sock, consumer_sock) = _handshake(*make("shm", faults="producer_silent@1")[:2])
    with ThreadPoolExecutor(1) as pool:
        sending = pool.submit(producer_channel.send, encode({"op": "SENDING", "num_bytes": 12}), [])
        with pytest.raises(FutureTimeout):   # still silent after 0.2 s
            sending.result(timeout=0.2)
        consumer_sock.close()   # the consumer gives up
        with pytest.raises(TransferError, match="never answered"):
            sending.result(timeout=10)
    producer_sock.close()


def test_the_producer_end_sends_the_sending_header_and_no_kv_byte(pair):
    """The producer's end of a mapped channel sends SENDING and no KV byte, as with shm."""
    _, _, _, make, _ = pair
    producer_channel, channel, (producer_sock, consumer_sock) = _handshake(*make("shm")[:2])
    producer_channel.send(encode({"op": "SENDING", "num_bytes": 12}), [])
    assert expect(recv_message(consumer_sock), "SENDING")["num_bytes"] == 12
    consumer_sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        consumer_sock.recv(1)  # nothing else came
    with pytest.raises(TransferError):
        channel.recv([])
    producer_sock.close()
    consumer_sock.close()


def test_cuda_planes_in_separate_storages_copy_plane_by_plane(gpu_stand_in):
    """vLLM's CUDA layout, [2, num_blocks, ...] per layer, one allocation per layer."""
    driver: dict = {}
    generator = torch.Generator().manual_seed(3)
    source = {f"l{i}": torch.randn(2, 10, 4, 2, 8, generator=generator).to(torch.float16) for i in range(2)}
    target = {f"l{i}": torch.zeros(2, 10, 4, 2, 8, dtype=torch.float16) for i in range(2)}
    cache = CudaCache.of(source, 10, gpu_stand_in(driver))
    assert [(l["storage"], l["offset"]) for l in cache.description["layers"]] == [(0, 0), (1, 0)]
    producer = CudaIpcTransport(5.0, cache=cache, backend=gpu_stand_in(driver))
    backend = gpu_stand_in(driver, ("GPU-producer",))
    consumer = CudaIpcTransport(5.0, local=KVLayout(target, 10), backend=backend)
    _, channel, socks = _handshake(producer, consumer)
    channel.copy([0, 1, 2], [7, 8, 3])
    for n in source:
        assert torch.equal(source[n][:, [7, 8, 3]], target[n][:, [0, 1, 2]])
    assert backend.copied == [2 * 128, 128] * 4  # runs (7,9) (3,4) per plane per layer, 128 bytes a block-plane
    for sock in socks:
        sock.close()


@pytest.mark.parametrize("hello, uuids, reason", [
    ({"boot_id": "another-node"}, ("GPU-consumer", "GPU-producer"), CUDA_OTHER_NODE),
    ({}, ("GPU-consumer",), CUDA_GPU_HIDDEN),
])
def test_explicit_shm_is_refused_with_the_reason_off_the_node_or_with_the_gpu_hidden(pair, hello, uuids, reason):
    _, _, _, make, _ = pair
    producer, consumer, _ = make("shm", uuids)
    with pytest.raises(IncompatiblePeer) as refused:
        _handshake(producer, consumer, hello)
    assert str(refused.value) == reason


def test_a_cache_that_could_not_be_exported_is_refused_with_why(gpu_stand_in):
    class NoIpcAllocator(gpu_stand_in):
        def export(self, tensor):
            raise RuntimeError("cudaIpcGetMemHandle: operation not supported")

    cache = CudaCache.of(_producer_caches(), NUM_BLOCKS, NoIpcAllocator({}))
    assert cache.description is None
    producer = CudaIpcTransport(5.0, cache=cache, backend=gpu_stand_in({}))
    assert producer.refusal({"boot_id": boot_id(), "gpu_uuids": ["GPU-producer"]}) == \
        f"{CUDA_NOT_EXPORTED}: RuntimeError: cudaIpcGetMemHandle: operation not supported"
    assert CudaIpcTransport(5.0, cache=None).refusal({"boot_id": boot_id()}) == CUDA_NOT_EXPORTED


def _torch_transfer(producer_channel, consumer_channel, consumer_sock, source, target, remote_ids, local_ids):
    """One transfer over a torch channel, both sides as the producer and consumer run it."""
    remote_layout, local_layout = KVLayout(source, NUM_BLOCKS), KVLayout(target, NUM_BLOCKS)
    with ThreadPoolExecutor(1) as pool:
        sending = pool.submit(producer_channel.send, encode({"op": "SENDING"}),
                              remote_layout.views(remote_ids, paired_with=local_ids))
        expect(recv_message(consumer_sock), "SENDING")
        consumer_channel.recv(local_layout.views(local_ids, paired_with=remote_ids))
        sending.result(timeout=30)


@pytest.mark.parametrize("hello, uuids", [({"boot_id": "another-node"}, ("GPU-producer",)), ({}, ("GPU-consumer",))])
def test_auto_falls_back_to_nccl_off_the_node_or_with_the_gpu_hidden(pair, hello, uuids):
    source, target, _, make, _ = pair
    producer, consumer, backend = make("auto", uuids)
    producer_channel, channel, socks = _handshake(producer, consumer, hello)
    try:
        assert (producer_channel.kind, channel.kind) == ("tensors", "tensors")
        _torch_transfer(producer_channel, channel, socks[1], source, target, [4, 5], [0, 1])
        assert all(_same_bytes(source[n][[4, 5]], target[n][[0, 1]]) for n in source)
        assert backend.copied == []
    finally:
        producer_channel.close()
        channel.close()
        for sock in socks:
            sock.close()


@pytest.mark.parametrize("name", ["auto", "shm"])
def test_a_consumer_that_opens_other_memory_gets_nccl_under_auto_and_an_error_under_shm(pair, name):
    """The proof is the token read through the consumer's own mapping: a wrong one is refused."""
    source, target, _, make, driver = pair
    producer, consumer, _ = make(name)
    token_handle = IpcHandle.from_wire(producer.cache.description["token"]).handle
    driver[token_handle] = torch.zeros(32, dtype=torch.uint8)  # the handle now maps something else
    if name == "shm":
        with pytest.raises(TransferError, match="accepted no usable channel"):
            _handshake(producer, consumer)
        return
    producer_channel, channel, socks = _handshake(producer, consumer)
    try:
        assert channel.kind == "tensors"
        _torch_transfer(producer_channel, channel, socks[1], source, target, [3], [9])
        assert all(_same_bytes(source[n][3], target[n][9]) for n in source)
    finally:
        producer_channel.close()
        channel.close()
        for sock in socks:
            sock.close()


def test_handles_that_cannot_be_opened_here_give_nccl_under_auto(pair, gpu_stand_in):
    _, target, _, make, _ = pair
    producer, _, _ = make("auto")
    other_driver = gpu_stand_in({}, ("GPU-producer",))  # sees the GPU, but none of the handles exist for it
    consumer = CudaIpcTransport(5.0, local=KVLayout(target, NUM_BLOCKS), fallback_torch=True, backend=other_driver)
    producer_channel, channel, socks = _handshake(producer, consumer)
    try:
        assert channel.kind == "tensors"
    finally:
        producer_channel.close()
        channel.close()
        for sock in socks:
            sock.close()


def test_a_copy_that_fails_half_way_still_waits_for_what_was_enqueued(pair, gpu_stand_in):
    """The producer's pin ends at DONE or when the exchange fails: no copy may still run then."""
    _, target, _, make, driver = pair

    class FailingDevice(gpu_stand_in):
        def copy(self, pairs, stream):
            super().copy(pairs[:1], stream)
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    producer, _, _ = make("shm")
    backend = FailingDevice(driver, ("GPU-producer",))
    consumer = CudaIpcTransport(5.0, local=KVLayout(target, NUM_BLOCKS), backend=backend)
    _, channel, socks = _handshake(producer, consumer)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        channel.copy([0, 1], [2, 3])
    assert (len(backend.copied), backend.synchronized) == (1, 1)
    for sock in socks:
        sock.close()


def test_the_channel_goes_stale_when_the_producer_closes_and_closing_it_lets_go_of_the_cache(pair):
    _, _, _, make, _ = pair
    _, channel, (producer_sock, consumer_sock) = _handshake(*make("shm")[:2])
    assert channel.stale() is False  # alive and idle: the check neither blocks nor reads
    producer_sock.close()
    deadline = time.monotonic() + 5
    while not channel.stale() and time.monotonic() < deadline:  # the FIN crosses the loopback
        time.sleep(0.01)
    assert channel.stale() is True
    channel.close()
    with pytest.raises(TransferError, match="closed"):
        channel.copy([0], [0])
    consumer_sock.close()
