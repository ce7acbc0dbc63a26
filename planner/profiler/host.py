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


def hardware_info(cpu_cores: str, model_dir: str = "", dtype: str = "") -> HardwareInfo:
    """A "device" here is what one worker gets: the cores its engine is bound to. With the model
    and the engine's dtype, it records how that dtype was chosen."""
    from pdserve.dtype_probe import this_host_kind

    return HardwareInfo(cpu_model=cpu_model(), num_cores=count_cores(cpu_cores), device="cpu",
                        host_kind=this_host_kind(), dtype_choice=dtype_choice(model_dir, cpu_cores, dtype))


def dtype_choice(model_dir: str, cpu_cores: str, dtype: str) -> str:
    """The probe's decision for this model and these cores when the engine runs what it chose,
    else a note that the dtype was given (or that nothing was probed)."""
    from pdserve.dtype_probe import cached_decision

    decision = cached_decision(model_dir, cpu_cores) if model_dir else None
    if decision is None:
        return f"{dtype}: not probed on this host kind" if dtype else ""
    if decision.dtype != dtype:
        return f"{dtype}: given explicitly (the probe chose {decision.dtype})"
    return decision.summary()


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
