"""How vLLM's engine core starts (`pdserve.engine_process`): the environment, fork or spawn, re-exec."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pdserve.preload import Preload
from pdserve.engine_process import (REEXEC_MARK, START_KEYS, engine_environment, initial_environ, reexec_env,
                                    start_method, started_under)

NEEDED = engine_environment({"PATH": "/bin"}, cpu_cores="1", executor="uni", spin_ms=5, hold_wait_ms=50,
                            preload=Preload(("/lib/libtcmalloc.so",)))


def test_the_engine_environment_binds_the_cores_runs_the_model_in_the_engine_core_and_preloads():
    assert NEEDED == {"PATH": "/bin", "VLLM_CPU_OMP_THREADS_BIND": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                      "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_PLACES": "{1}", "OMP_PROC_BIND": "true",
                      "PDSERVE_VLLM_SPIN_S": "0.005", "PDSERVE_VLLM_HOLD_WAIT_S": "0.05",
                      "LD_PRELOAD": "/lib/libtcmalloc.so"}


def test_one_engines_binding_replaces_anothers_and_what_the_environment_already_says_is_kept_where_it_should_be():
    before = {"OMP_PLACES": "{0,1}", "OMP_PROC_BIND": "true", "OMP_NUM_THREADS": "2", "LD_PRELOAD": "/a.so /t.so",
              "PDSERVE_VLLM_HOLD_WAIT_S": "0", "PDSERVE_VLLM_SPIN_S": "1"}
    env = engine_environment(before, cpu_cores="", executor="mp", spin_ms=-1, hold_wait_ms=50, preload=Preload(("/t.so",)))
    assert "OMP_PLACES" not in env and "OMP_NUM_THREADS" not in env     # another engine's binding is gone
    assert env["LD_PRELOAD"] == "/t.so:/a.so"                          # ours first, theirs kept, once
    assert env["PDSERVE_VLLM_HOLD_WAIT_S"] == "0"                      # the operator's 0 (vLLM's loop) wins
    assert env["PDSERVE_VLLM_SPIN_S"] == "1"                           # negative spin: leave what is there


def test_started_under_compares_only_what_is_read_once_at_start():
    assert started_under(NEEDED, NEEDED | {"HOME": "/root", "TERM": "x"})
    for key in ("OMP_NUM_THREADS", "LD_PRELOAD", "PDSERVE_VLLM_SPIN_S", "OMP_PLACES"):
        assert not started_under(NEEDED, {k: v for k, v in NEEDED.items() if k != key}), key
    assert not started_under(NEEDED, NEEDED | {"OMP_NUM_THREADS": "2"})
    assert set(START_KEYS) >= {"LD_PRELOAD", "OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND"}


@pytest.mark.parametrize("requested, gpu, executor, fork_safe, initial, expected", [
    ("auto", False, "uni", True, NEEDED, "fork"),
    ("fork", False, "uni", True, NEEDED, "fork"),
    ("spawn", False, "uni", True, NEEDED, "spawn"),          # asked for
    ("auto", False, "uni", True, {"PATH": "/bin"}, "spawn"),  # started under another environment
    ("fork", False, "uni", True, {"PATH": "/bin"}, "spawn"),  # fork is not forced where it would be wrong
    ("auto", False, "uni", False, NEEDED, "spawn"),          # the process may have run OpenMP
    ("auto", False, "mp", True, NEEDED, "spawn"),            # a model runner needs OpenMP variables of its own
    ("auto", True, "uni", True, NEEDED, None),               # GPU: vLLM's choice
    ("spawn", True, "mp", False, {}, None),
])
def test_the_engine_core_is_forked_only_where_the_child_computes_as_a_spawned_one_would(
        requested, gpu, executor, fork_safe, initial, expected):
    assert start_method(requested, gpu=gpu, executor=executor, fork_safe=fork_safe, needed=NEEDED,
                        initial=initial) == expected


def test_an_unknown_start_method_is_refused():
    with pytest.raises(ValueError, match="one of auto, fork, spawn"):
        start_method("forkserver", gpu=False, executor="uni", fork_safe=True, needed=NEEDED, initial=NEEDED)


def test_a_worker_re_executes_once_and_only_where_its_engine_core_could_then_be_forked():
    env = reexec_env("auto", gpu=False, executor="uni", needed=NEEDED, initial={"PATH": "/bin"})
    assert env == {REEXEC_MARK: "1"} | NEEDED and next(iter(env)) == REEXEC_MARK
    assert start_method("auto", gpu=False, executor="uni", fork_safe=True, needed=NEEDED, initial=env) == "fork"
    assert reexec_env("auto", gpu=False, executor="uni", needed=NEEDED, initial=env) is None        # never twice
    assert reexec_env("auto", gpu=False, executor="uni", needed=NEEDED, initial=NEEDED) is None     # nothing to do
    assert reexec_env("auto", gpu=False, executor="uni", needed=NEEDED,
                      initial={REEXEC_MARK: "1"}) is None                                           # no loop
    assert reexec_env("auto", gpu=False, executor="uni", needed=NEEDED, initial={}) is None   # /proc unreadable: no loop
    assert reexec_env("spawn", gpu=False, executor="uni", needed=NEEDED, initial={"PATH": "/bin"}) is None
    assert reexec_env("auto", gpu=True, executor="uni", needed=NEEDED, initial={}) is None
    assert reexec_env("auto", gpu=False, executor="mp", needed=NEEDED, initial={}) is None


def test_the_initial_environment_is_what_the_process_was_executed_with_not_what_it_set_since():
    code = ("import os, json; from pdserve.engine_process import initial_environ; os.environ['LATER'] = '1'; "
            "e = initial_environ(); print(json.dumps([e.get('AT_START'), e.get('LATER')]))")
    out = subprocess.run([sys.executable, "-c", code], env=os.environ | {"AT_START": "a=b"}, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == '["a=b", null]'
    assert initial_environ(pid=2 ** 22 + 12345) == {}   # no such process: nothing, no error


def test_pytorchs_openmp_runtime_is_preloaded_last_as_vllm_adds_it_unless_one_is_there():
    from pdserve.preload import with_openmp

    tcmalloc = Preload(("/lib/libtcmalloc.so",), {"iomp5": "pip install intel-openmp"})
    assert with_openmp(tcmalloc, "", "/t/lib/libgomp.so.1") == Preload(("/lib/libtcmalloc.so", "/t/lib/libgomp.so.1"),
                                                                     {"iomp5": "pip install intel-openmp"})
    assert with_openmp(Preload(("/v/libiomp5.so",)), "", "/t/lib/libgomp.so.1") == Preload(("/v/libiomp5.so",))
    assert with_openmp(tcmalloc, "/x/libgomp-a1.so.1", "/t/lib/libgomp.so.1") == tcmalloc
    assert with_openmp(tcmalloc, "", None) == tcmalloc


def test_pytorchs_openmp_runtime_is_found_where_vllm_looks_for_it():
    from pdserve.preload import torch_libgomp

    import torch

    found = torch_libgomp()
    assert found is not None and "libgomp" in os.path.basename(found) and os.path.isfile(found)
    assert os.path.dirname(torch.__file__) in found or "torch.libs" in found
