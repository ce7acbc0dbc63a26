"""What a profile records about where it was measured: the host, the model, the engine settings."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from planner.profile import HardwareInfo, ModelInfo
from pdserve.cpu_placement import parse_cores


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo on Linux, else what `platform` knows."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def count_cores(cpu_cores: str) -> int:
    """Cores in a binding like "0", "0-3" or "0,2,4-5"; all visible cores for ""."""
    if not cpu_cores:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return len(parse_cores(cpu_cores))


def hardware_info(cpu_cores: str) -> HardwareInfo:
    """A "device" here is what one worker gets: the cores its engine is bound to."""
    return HardwareInfo(cpu_model=cpu_model(), num_cores=count_cores(cpu_cores), device="cpu")


def model_info(model_dir: str | Path, dtype: str, block_size: int) -> ModelInfo:
    """Layer and head counts from the checkpoint's Hugging Face config.json."""
    path = Path(model_dir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: --model must be a Hugging Face checkpoint directory "
                                "(make one with `pdserve make-model --size tiny --out models/tiny`)")
    config = json.loads(path.read_text())
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return ModelInfo(name=Path(model_dir).resolve().name, num_layers=config["num_hidden_layers"],
                     hidden_size=config["hidden_size"], num_attention_heads=heads,
                     num_kv_heads=config.get("num_key_value_heads", heads), dtype=dtype, block_size=block_size,
                     head_dim=head_dim)
