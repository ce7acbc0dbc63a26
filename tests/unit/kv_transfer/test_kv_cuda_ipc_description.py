"""The CUDA IPC description of a producer's cache: what goes on the wire (base64 in JSON, no
pickle), the checks a consumer makes before anything reaches the driver, and the copy plan.
The GPU runtime is `gpu_stand_in` (see conftest), as this machine has no GPU."""

import base64
import copy
import json

import pytest

from kv_transfer.geometry import BlockGeometry
from kv_transfer.layout import KVLayout
from kv_transfer.shm_segment import boot_id
from kv_transfer.transports.cuda_ipc_backend import IpcHandle
from kv_transfer.transports.cuda_ipc_cache import CudaCache, open_cache, plan_copies
from kv_transfer.wire import TransferError

GEOMETRY = BlockGeometry(num_layers=3, num_kv_heads=2, head_dim=16, block_size=8, dtype="bfloat16")
NUM_BLOCKS = 24


@pytest.fixture
def pair(gpu_stand_in):
    """(source caches, target caches, the producer's exported cache, a consumer stand-in seeing its GPU)."""
    driver: dict = {}
    source = GEOMETRY.caches(NUM_BLOCKS, seed=7)  # one buffer, the layers at offsets: one storage
    cache = CudaCache.of(source, NUM_BLOCKS, gpu_stand_in(driver))
    return source, GEOMETRY.caches(NUM_BLOCKS), cache, gpu_stand_in(driver, ("GPU-consumer", "GPU-producer"))


def test_the_producer_describes_one_handle_per_storage_and_each_layer_in_it(pair):
    _, _, cache, _ = pair
    description = cache.description
    assert len(description["storages"]) == 1 and description["device_uuid"] == "GPU-producer"
    assert description["boot_id"] == boot_id() and description["num_blocks"] == NUM_BLOCKS
    layer_bytes = NUM_BLOCKS * GEOMETRY.bytes_per_block_layer
    places = [(layer["storage"], layer["offset"]) for layer in description["layers"]]
    assert places == [(0, 0), (0, layer_bytes), (0, 2 * layer_bytes)]
    first = description["layers"][0]
    assert (first["shape"], first["dtype"]) == ([NUM_BLOCKS, 2, 8, 32], "bfloat16")
    assert IpcHandle.from_wire(description["storages"][0]).size_bytes == 3 * layer_bytes
    assert json.loads(json.dumps(description)) == description  # plain JSON all the way down


def test_a_handle_travels_as_base64_json_and_comes_back_equal():
    handle = IpcHandle(b"\x00\xffhandle", 4096, 512, b"/torch_12_345_6", 9999, bytes(64), True)
    assert IpcHandle.from_wire(json.loads(json.dumps(handle.to_wire()))) == handle


@pytest.mark.parametrize("change, error", [
    ({"handle": "not base64!"}, "not base64"),
    ({"handle": ""}, "out of range"),
    ({"size_bytes": 0}, "out of range"),
    ({"offset_bytes": -512}, "out of range"),
    ({"size_bytes": "4096"}, "must be an integer"),
    ({"ref_counter": base64.b64encode(b"/etc/passwd").decode()}, "not one of torch's"),
    ({"ref_counter_offset": 10000}, "not one of torch's"),
    ({"event_sync": True, "event": base64.b64encode(b"short").decode()}, "event fields"),
    ({"event_sync": 1}, "event fields"),
])
def test_a_malformed_handle_never_reaches_the_driver(change, error):
    fields = IpcHandle(b"h" * 64, 4096, 512, b"/torch_12_345_6", 3, bytes(64), False).to_wire()
    with pytest.raises(TransferError, match=error):
        IpcHandle.from_wire({**fields, **change})


def _tampered(description: dict, **layer0) -> dict:
    changed = copy.deepcopy(description)
    changed["layers"][0].update(layer0)
    return changed


@pytest.mark.parametrize("layer0, error", [
    ({"offset": 3 * NUM_BLOCKS * GEOMETRY.bytes_per_block_layer}, "lies outside"),
    ({"shape": [NUM_BLOCKS + 200, 2, 8, 32]}, "lies outside"),
    ({"offset": 1}, "lies outside"),                       # not aligned to a bfloat16
    ({"storage": 1}, "no valid storage"),
    ({"stride": [-1, 512, 32, 1]}, "degenerate"),
    ({"shape": [NUM_BLOCKS, 2, 8]}, "of one length"),
    ({"dtype": "Tensor"}, "unknown KV dtype"),
    ({"shape": [NUM_BLOCKS, 2, 8, 16], "stride": [256, 128, 16, 1]}, "not a KV layout|layers of"),
])
def test_a_description_whose_layers_leave_their_storage_is_refused(pair, layer0, error):
    _, target, cache, consumer = pair
    with pytest.raises(TransferError, match=error):
        open_cache(consumer, _tampered(cache.description, **layer0), KVLayout(target, NUM_BLOCKS))


def test_a_description_for_another_gpu_or_another_cache_shape_is_refused(pair, gpu_stand_in):
    _, _, cache, consumer = pair
    other = BlockGeometry(num_layers=2, num_kv_heads=2, head_dim=16, block_size=8, dtype="bfloat16")
    with pytest.raises(TransferError, match="not visible here"):
        open_cache(gpu_stand_in(consumer.driver, ("GPU-consumer",)), cache.description, KVLayout(other.caches(4), 4))
    with pytest.raises(TransferError, match="3 layers .* ours 2"):
        open_cache(consumer, cache.description, KVLayout(other.caches(NUM_BLOCKS), NUM_BLOCKS))


def test_copies_are_planned_per_run_of_blocks_consecutive_on_both_sides(pair):
    source, target, cache, consumer = pair
    opened = open_cache(consumer, cache.description, KVLayout(target, NUM_BLOCKS))
    pairs = plan_copies(KVLayout(target, NUM_BLOCKS), opened.remote, [0, 1, 2, 8], [10, 11, 20, 21])
    block = GEOMETRY.bytes_per_block_layer
    assert [(t.numel(), s.numel()) for t, s in pairs] == [(2 * block, 2 * block), (block, block), (block, block)] * 3
    assert pairs[0][1].data_ptr() == source["model.layers.0.self_attn.attn"][10].data_ptr()  # the producer's memory
    assert pairs[0][0].data_ptr() == target["model.layers.0.self_attn.attn"][0].data_ptr()
    assert opened.token == cache.token
