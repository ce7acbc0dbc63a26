"""The router binds its gRPC port before anything imports vLLM (seconds to a minute on a loaded
host), so a restarting router holds the calls that reach it instead of refusing them
(router/main.py; tests/chaos/test_control_plane.py holds it to that on a real cluster, where a fast
host leaves only the import's time between the bind and serving)."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_router_process_imports_no_vllm():
    probe = ("import sys, router.main; "
             "print(sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.'))[:5])")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]", f"router.main imports vLLM before its port is bound: {result.stdout}"
