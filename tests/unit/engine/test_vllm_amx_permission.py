"""pdserve's vLLM plugin asks Linux for AMX tile data where the CPU has AMX: vLLM's bfloat16 CPU
attention runs AMX instructions without asking, and its process dies with SIGILL."""

import json
import platform
import subprocess
import sys

import pytest

# In a fresh process: nothing there has asked for AMX yet (oneDNN asks on its first AMX kernel).
PROBE = """
import ctypes, json, os
import torch
from pdserve import vllm_plugin

def tile_data_permitted():
    mask = ctypes.c_uint64(0)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(158, 0x1022, ctypes.byref(mask)) != 0:  # arch_prctl(ARCH_GET_XCOMP_PERM)
        return False  # a kernel before 5.16: no AMX permission to have
    return bool(mask.value & (1 << 18))  # XFEATURE_XTILEDATA

os.environ.pop(vllm_plugin.SPIN_ENV, None)
before = tile_data_permitted()
vllm_plugin.register()
print(json.dumps({"amx": torch.cpu._is_amx_tile_supported(), "before": before, "after": tile_data_permitted(),
                  "again": vllm_plugin.request_amx_permission()}))
"""


@pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64", reason="arch_prctl is x86-64 Linux")
def test_registering_the_plugin_grants_amx_tile_data_where_the_cpu_has_amx():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    if seen["amx"]:
        assert not seen["before"], "a fresh process already had AMX tile data: this test cannot see the plugin work"
        assert seen["after"] and seen["again"]
    else:  # nothing to ask for, and nothing asked
        assert not seen["after"] and seen["again"] is False


def test_registering_the_plugin_asks_for_amx_whatever_the_spin_setting(monkeypatch):
    """On every host, AMX or not: register() asks, with and without the spin cap set."""
    from pdserve import vllm_plugin

    asked = []
    monkeypatch.setattr(vllm_plugin, "request_amx_permission", lambda: asked.append(True) or False)
    monkeypatch.setattr(vllm_plugin, "cap_shm_spin", lambda spin_s: None)
    monkeypatch.delenv(vllm_plugin.SPIN_ENV, raising=False)
    vllm_plugin.register()
    monkeypatch.setenv(vllm_plugin.SPIN_ENV, "0.05")
    vllm_plugin.register()
    assert asked == [True, True]


def test_a_torch_without_the_private_amx_api_costs_a_warning_not_the_process(monkeypatch, caplog):
    import torch

    from pdserve import vllm_plugin

    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    assert vllm_plugin.request_amx_permission() is False
    assert "could not ask for AMX" in caplog.text
