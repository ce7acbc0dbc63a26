"""Which dtype an engine runs in when asked for `auto`: decided by measurement, cached per host kind.

The flags a CPU reports do not say which dtype is fast on it. Measured with one thread, a
1024x768 by 768x3072 matmul: on an AMX Xeon bfloat16 is ~15x faster than float32; on an
AVX512-BF16 Xeon without AMX float32 was 1.8x faster than bfloat16; on an AVX2-only CPU bfloat16
is emulated at 13-67x float32's time. So `auto` runs a short probe of each candidate dtype
(`pdserve.dtype_probe`: the GEMM kernels vLLM dispatches and an attention) with the threads a
worker gets, chooses here, and caches the decision per host kind, model shape and thread count.

This module is pure: plain values in, a decision out; reading and writing the cache file are the
only I/O, in `load_decision`/`save_decision`.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

CANDIDATES: tuple[str, ...] = ("bfloat16", "float32")
# bfloat16 halves the KV cache per token (twice the blocks in the same memory), so it is kept
# unless float32 is faster by more than this share of bfloat16's time.
BF16_TOLERANCE = 0.10
# The CPU flags that decide which kernels run; a host with another set is another host kind.
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16", "bf16",
                "asimd", "sve")


@dataclass(frozen=True)
class ModelShape:
    """What of a model decides its kernels' speed: the widths of its matmuls and its attention."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def from_config(cls, config: dict) -> "ModelShape":
        """From a Hugging Face `config.json`; raises ValueError naming a missing field."""
        try:
            hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
            return cls(hidden_size=hidden, intermediate_size=int(config["intermediate_size"]), num_heads=heads,
                       num_kv_heads=int(config.get("num_key_value_heads") or heads),
                       head_dim=int(config.get("head_dim") or hidden // heads))
        except KeyError as missing:
            raise ValueError(f"config.json has no {missing.args[0]}: cannot probe the model's kernels") from None

    @property
    def key(self) -> str:
        return (f"h{self.hidden_size}-i{self.intermediate_size}-a{self.num_heads}"
                f"-kv{self.num_kv_heads}-d{self.head_dim}")


@dataclass(frozen=True)
class DtypeDecision:
    dtype: str
    reason: str
    host_kind: str
    shape_key: str
    threads: int
    timings_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # dtype -> probe -> median ms

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "DtypeDecision":
        return cls(**json.loads(text))

    def summary(self) -> str:
        """One line for a person: the choice, why, and what was measured."""
        measured = ", ".join(f"{dtype} {sum(ops.values()):.1f} ms" for dtype, ops in sorted(self.timings_ms.items()))
        return f"dtype {self.dtype}: {self.reason}" + (f" (probe: {measured}; {self.threads} thread(s))"
                                                       if measured else "")


def choose_dtype(timings_ms: dict[str, dict[str, float]], tolerance: float = BF16_TOLERANCE) -> tuple[str, str]:
    """The dtype to run and why, from each candidate's probe timings (dtype -> probe -> ms).

    The fastest total wins, except that bfloat16 is kept while float32 is faster by at most
    `tolerance` of bfloat16's time (bfloat16's half-size KV cache holds twice the tokens). A
    candidate missing a probe the others have (it failed, or was cut short as hopeless) loses."""
    if not timings_ms:
        raise ValueError("no probe timings: nothing to choose from")
    probes = set().union(*(ops.keys() for ops in timings_ms.values()))
    complete = {dtype: sum(ops.values()) for dtype, ops in timings_ms.items() if set(ops) == probes}
    if not complete:
        raise ValueError(f"no dtype finished every probe ({sorted(probes)}): {timings_ms}")
    fastest = min(complete, key=complete.get)
    bf16 = complete.get("bfloat16")
    if fastest != "bfloat16" and bf16 is not None and complete[fastest] >= bf16 * (1 - tolerance):
        return "bfloat16", (f"within {tolerance:.0%} of {fastest} ({bf16:.1f} vs {complete[fastest]:.1f} ms), "
                            "and its KV cache holds twice the tokens")
    others = [f"{dtype} {ms:.1f} ms" for dtype, ms in sorted(complete.items()) if dtype != fastest]
    if not others:
        return fastest, f"the only dtype that finished the probe ({complete[fastest]:.1f} ms)"
    ratio = min(ms for dtype, ms in complete.items() if dtype != fastest) / complete[fastest]
    return fastest, f"fastest on this host ({complete[fastest]:.1f} ms, {ratio:.1f}x ahead of {', '.join(others)})"


def host_kind(cpuinfo: str, torch_version: str, vllm_version: str) -> str:
    """A name for this kind of host: the CPU model, the kernel-relevant flags and the library
    versions. Two hosts of one kind run the same kernels at about the same relative speeds.

    The model name is followed by the x86 family and model numbers where /proc/cpuinfo gives them
    (`-f26m2`): a VM's model name may be only "AMD EPYC", which a Zen 4 (family 25) and a Zen 5
    (family 26) both show, with the same kernel flags, at different speeds."""
    model, family, number, flags = "", "", "", set()
    for line in cpuinfo.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key in ("model name", "Model", "CPU part") and not model:
            model = value
        elif key == "cpu family" and not family:
            family = value
        elif key == "model" and not number:
            number = value
        elif key in ("flags", "Features"):
            flags.update(value.split())
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")[:48] or "unknown-cpu"
    if family.isdigit() and number.isdigit():
        slug += f"-f{family}m{number}"
    present = "+".join(flag for flag in KERNEL_FLAGS if flag in flags) or "noflags"
    versions = hashlib.sha256(f"{torch_version} {vllm_version}".encode()).hexdigest()[:8]
    return f"{slug}_{present}_{versions}"


def cache_path(cache_dir: Path, kind: str, shape: ModelShape, threads: int) -> Path:
    return Path(cache_dir) / f"dtype-{kind}-{shape.key}-t{threads}.json"


def load_decision(path: Path, kind: str) -> DtypeDecision | None:
    """The cached decision, or None when there is none, it is unreadable, or it was made on
    another host kind (the cache folder may be shared, or the host's libraries changed)."""
    try:
        decision = DtypeDecision.from_json(Path(path).read_text())
    except (OSError, ValueError, TypeError):
        return None
    return decision if decision.host_kind == kind else None


def save_decision(path: Path, decision: DtypeDecision) -> None:
    """Writes atomically (a concurrent reader sees the old file or the new one, never half)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{id(decision)}.tmp")
    partial.write_text(decision.to_json())
    partial.replace(path)
