"""Core lists and binding a worker's process tree to its cores."""

import os
import subprocess
import sys

import pytest

from pdserve.cpu_placement import parse_cores


@pytest.mark.parametrize("spec, cores", [("0", {0}), ("0-3", {0, 1, 2, 3}), ("0,2,4-5", {0, 2, 4, 5}),
                                         (" 1 - 2 ", {1, 2})])
def test_core_lists_parse_to_exact_sets(spec, cores):
    assert parse_cores(spec) == cores


@pytest.mark.parametrize("spec", ["", "a", "1-", "3-1", "0,,1", "-2"])
def test_a_bad_core_list_is_refused_naming_the_part(spec):
    with pytest.raises(ValueError, match="is not a core or a range"):
        parse_cores(spec)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to tell a binding apart")
def test_a_bound_process_and_the_processes_it_starts_later_run_on_its_cores():
    last = max(os.sched_getaffinity(0))
    script = ("import os, subprocess, sys; from pdserve.cpu_placement import bind_this_process; "
              f"bind_this_process('{last}'); "
              "print(subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'], "
              "capture_output=True, text=True).stdout.strip())")
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert child.stdout.strip() == f"[{last}]"


def test_a_workers_cores_decide_the_thread_counts_of_every_pool():
    from pdserve.engine_process import thread_env

    assert thread_env("0-1") == {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    assert thread_env("3") == {"VLLM_CPU_OMP_THREADS_BIND": "3", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    assert thread_env("") == {}


def test_binding_moves_the_threads_already_running_too():
    """A thread started before the binding (as an import's would be) runs on the bound cores after it."""
    import os
    import subprocess
    import sys

    core = sorted(os.sched_getaffinity(0))[-1]
    code = ("import os, threading, time\n"
            "from pdserve.cpu_placement import bind_this_process\n"
            "ready, done = threading.Event(), threading.Event()\n"
            "ids = []\n"
            "def run():\n"
            "    ids.append(threading.get_native_id()); ready.set(); done.wait()\n"
            "t = threading.Thread(target=run); t.start(); ready.wait()\n"
            f"bind_this_process('{core}')\n"
            "print(sorted(os.sched_getaffinity(ids[0]))); done.set(); t.join()\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str([core])
