"""Which data channel a producer gives a consumer: one pure decision, made at handshake.

The configured transport names (`tcp`, `torch`, `shm`, `auto`) stay the same on every device; what
they mean depends on where the producer's KV cache lives:

    cache  requested  one node, cache exportable (and, CUDA: its GPU visible)   otherwise
    cpu    shm        shm       (the consumer copies out of the segment)       refused, with the reason
    cpu    auto       shm                                                      tcp
    cuda   shm        cuda_ipc  (the consumer copies device to device)         refused, with the reason
    cuda   auto       cuda_ipc                                                 torch (NCCL)
    any    torch      torch
    cpu    tcp        tcp;  cuda: refused (tcp moves CPU caches; use torch or auto)

"One node" is the same kernel boot id on both sides; "visible" means the producer's GPU UUID is
among the consumer's visible devices (CUDA IPC can only map memory of a GPU the process sees).
The transports gather those facts (`kv_transfer.transports.shm`, `kv_transfer.transports.cuda_ipc`)
and call `choose_channel`; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Channel = Literal["shm", "cuda_ipc", "tcp", "torch"]

CPU_NOT_SHARED = "the producer's KV cache is not in shared memory (its transport is not shm or auto)"
CPU_OTHER_HOST = "the consumer runs on another host (kernel boot ids differ)"
CUDA_NOT_EXPORTED = ("the producer's KV cache cannot be opened through CUDA IPC (its transport is not shm or "
                     "auto, or exporting its handles failed)")
CUDA_OTHER_NODE = ("the consumer runs on another node (kernel boot ids differ): CUDA IPC works within one node; "
                   "use the torch transport (NCCL) or auto")
CUDA_GPU_HIDDEN = ("the producer's GPU is not visible to the consumer (CUDA_VISIBLE_DEVICES or the container's "
                   "device list hides it): CUDA IPC can only map a visible GPU's memory")
TCP_ON_GPU = "the tcp transport moves CPU KV caches only; use the torch transport (NCCL) or auto"


@dataclass(frozen=True)
class ChannelChoice:
    """`channel` None: refused, and `reason` says why. Otherwise `reason` says why the one-sided
    channel was not taken ("" when it was, or when none was asked for)."""

    channel: Channel | None
    reason: str = ""


def choose_channel(device_type: str, requested: str, *, same_boot: bool, peer_gpu_visible: bool,
                   cache_shared: bool) -> ChannelChoice:
    """The channel for a consumer that asked for transport `requested`, given the producer's cache
    device type ("cpu", "cuda"), whether both run on one kernel boot, whether the producer's GPU is
    among the consumer's visible devices (ignored on CPU), and whether the producer's cache can be
    read one-sidedly (CPU: it lives in a segment; CUDA: its IPC handles were exported)."""
    if requested == "torch":
        return ChannelChoice("torch")
    if requested == "tcp":
        return ChannelChoice("tcp") if device_type == "cpu" else ChannelChoice(None, TCP_ON_GPU)
    if requested not in ("shm", "auto"):
        return ChannelChoice(None, f"unknown KV transport {requested!r}")
    if device_type not in ("cpu", "cuda"):
        why = f"KV caches on {device_type} have no one-sided channel"
        return ChannelChoice("torch" if requested == "auto" else None, why)
    one_sided, fallback = ("shm", "tcp") if device_type == "cpu" else ("cuda_ipc", "torch")
    why_not = _why_not_one_sided(device_type, same_boot, peer_gpu_visible, cache_shared)
    if not why_not:
        return ChannelChoice(one_sided)
    return ChannelChoice(fallback if requested == "auto" else None, why_not)


def _why_not_one_sided(device_type: str, same_boot: bool, peer_gpu_visible: bool, cache_shared: bool) -> str:
    if device_type == "cpu":
        return CPU_NOT_SHARED if not cache_shared else CPU_OTHER_HOST if not same_boot else ""
    if not cache_shared:
        return CUDA_NOT_EXPORTED
    if not same_boot:
        return CUDA_OTHER_NODE
    return "" if peer_gpu_visible else CUDA_GPU_HIDDEN


def same_boot(hello: dict, ours: str) -> bool:
    """Whether the consumer's HELLO names our kernel boot id `ours` (an empty one matches nothing)."""
    theirs = hello.get("boot_id")
    return bool(ours) and isinstance(theirs, str) and theirs == ours
