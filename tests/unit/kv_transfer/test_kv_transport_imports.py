"""The KV transfer's transport side imports no vLLM: a producer process (the throughput pair's, the
fault-injection tests', the profile's transfer probe) moves bytes between caches and needs none of
the engine, and `import vllm` costs seconds of CPU a process (12 s on an AVX2-only EPYC; the
throughput pair's producer took 11 s to start when `kv_transfer.metadata` pulled it in for the
plain records now in `kv_transfer.records`). Only the connector's halves, which subclass vLLM's
connector types, import it."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import kv_transfer
import kv_transfer.transports

VLLM_BOUND = {"kv_transfer.connector", "kv_transfer.metadata", "kv_transfer.scheduler_side", "kv_transfer.worker_side"}


def transport_side_modules() -> list[str]:
    """Every module of `kv_transfer` and its transports but the connector's vLLM-bound halves."""
    names = [f"kv_transfer.{m.name}" for m in pkgutil.iter_modules(kv_transfer.__path__)]
    names += [f"kv_transfer.transports.{m.name}" for m in pkgutil.iter_modules(kv_transfer.transports.__path__)]
    names += ["kv_transfer.throughput.pair"]
    return sorted(set(names) - VLLM_BOUND)


def test_the_transport_side_of_kv_transfer_imports_no_vllm():
    modules = transport_side_modules()
    assert {"kv_transfer.producer", "kv_transfer.consumer", "kv_transfer.records", "kv_transfer.grants",
            "kv_transfer.transports.tcp", "kv_transfer.transports.shm"} <= set(modules)
    probe = (f"import sys; import {', '.join(modules)}; "
             "print(sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.'))[:5])")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]", f"the transport side imports vLLM: {result.stdout}"

