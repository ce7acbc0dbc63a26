"""Helpers shared by the KV transfer tests."""

import json
import secrets

import pytest
import torch
from safetensors.torch import save_file


def _write_checkpoint(directory, seed=0, config_extra=None):
    """A small Llama-style checkpoint directory: config.json, two safetensors shards, a tokenizer."""
    directory.mkdir(parents=True)
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
              "num_key_value_heads": 2, "_name_or_path": str(directory), **(config_extra or {})}
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    generator = torch.Generator().manual_seed(seed)
    save_file({"model.embed_tokens.weight": torch.randn(256, 64, generator=generator),
               "model.norm.weight": torch.ones(64)}, str(directory / "model-00001-of-00002.safetensors"))
    save_file({"lm_head.weight": torch.randn(256, 64, generator=generator)},
              str(directory / "model-00002-of-00002.safetensors"))
    (directory / "tokenizer.json").write_text("{}")
    return directory


@pytest.fixture
def make_checkpoint():
    """`make_checkpoint(directory, seed=0, config_extra=None) -> directory`"""
    return _write_checkpoint


class GpuStandIn:
    """Stands in for the GPU runtime behind `IpcBackend`, which this machine does not have (only
    for that: everything above it is the real code). `driver`, shared by a producer's and a
    consumer's stand-ins, plays the node's CUDA driver: exporting registers a storage's memory under
    a fresh random handle, opening returns that same memory, as an IPC open maps the same device
    memory; a handle it never issued fails as the driver would. `uuids` are the visible GPUs."""

    def __init__(self, driver: dict, uuids=("GPU-producer",)):
        self.driver, self.uuids = driver, tuple(uuids)
        self.copied: list[int] = []   # the bytes of every copy enqueued, in order
        self.synchronized = 0

    def device_uuids(self):
        return self.uuids

    def export(self, tensor):
        from kv_transfer.transports.cuda_ipc_backend import IpcHandle

        storage = tensor.untyped_storage()
        handle = secrets.token_bytes(64)
        self.driver[handle] = torch.empty(0, dtype=torch.uint8).set_(storage)
        return IpcHandle(handle, storage.nbytes(), 0, b"/torch_4242_7_0", 0, bytes(64), False)

    def new_token(self, device, token):
        return torch.frombuffer(bytearray(token), dtype=torch.uint8)

    def open(self, handle, device_index):
        if handle.handle not in self.driver:
            raise RuntimeError("CUDA error: invalid resource handle")
        return self.driver[handle.handle]

    def read(self, tensor):
        return tensor.numpy().tobytes()

    def new_stream(self, source, target):
        return self.copied

    def copy(self, pairs, stream):
        for target, source in pairs:
            target.copy_(source)
            stream.append(target.numel())

    def synchronize(self, stream):
        self.synchronized += 1


@pytest.fixture
def gpu_stand_in():
    """The `GpuStandIn` class: `gpu_stand_in(driver, uuids=("GPU-producer",))`."""
    return GpuStandIn
