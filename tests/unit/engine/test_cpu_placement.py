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
