"""Process-tree CPU accounting (loadgen/proc_cpu.py): /proc's fields parsed, trees walked on real
processes, other processes' load from tick counts."""

import os
import subprocess
import time

from loadgen.proc_cpu import (TICKS_PER_S, core_busy_ticks, cpu_seconds, machine_busy_ticks, other_load_cores,
                              process_tree, stat_cpu_ticks, stat_tree_ticks, tree_ticks)


def test_a_stat_line_gives_the_parent_and_user_plus_system_ticks_even_with_parentheses_in_the_name():
    fields = ["S", "41"] + ["0"] * 9 + ["250", "70"] + ["0"] * 10  # state, ppid, ..., utime, stime, ...
    assert stat_cpu_ticks("1234 (vllm (engine) 0) " + " ".join(fields)) == (41, 320)


def test_a_process_tree_reading_counts_the_ticks_of_children_already_reaped():
    fields = ["S", "41"] + ["0"] * 9 + ["250", "70", "900", "30"] + ["0"] * 8  # utime, stime, cutime, cstime
    assert stat_tree_ticks("1234 (bench) " + " ".join(fields)) == 1250


def test_a_child_that_ran_and_finished_between_two_readings_counts_as_ours():
    before = sum(tree_ticks(os.getpid()).values())
    subprocess.run(["python3", "-c", "import time\nend = time.process_time() + 0.3\n"
                    "while time.process_time() < end: pass"], check=True)
    assert (sum(tree_ticks(os.getpid()).values()) - before) / TICKS_PER_S >= 0.2


def test_the_machine_is_busy_for_every_tick_but_idle_and_iowait():
    assert machine_busy_ticks("cpu  100 5 30 9000 40 2 3 1 0 0\ncpu0 1 2 3 4 5 6 7 8\n") == 141


def test_each_cores_busy_ticks_leave_out_idle_iowait_and_the_hypervisors_steal():
    text = "cpu  200 0 60 9000 0 0 0 0 0 0\ncpu0 100 5 30 4000 40 2 3 500 0 0\ncpu1 90 0 20 5000 0 0 1 7 0 0\nintr 5 1\n"
    assert core_busy_ticks(text) == {0: 140, 1: 111}


def test_this_machines_cores_each_have_a_busy_count():
    from loadgen.proc_cpu import core_busy_s
    busy = core_busy_s()
    assert len(busy) == os.cpu_count() and all(seconds >= 0 for seconds in busy.values())


def test_other_load_is_the_machines_busy_ticks_less_ours_per_second_never_below_zero():
    before, after = {1: 100, 2: 50}, {1: 130, 2: 50, 3: 20}  # pid 3 started during the run: all its ticks are ours
    assert other_load_cores(4 * TICKS_PER_S + 50, before, after, wall_s=2.0) == 2.0
    assert other_load_cores(10, before, after, wall_s=2.0) == 0.0
    assert other_load_cores(10, before, after, wall_s=0.0) == 0.0


def test_a_process_tree_holds_the_root_first_and_its_live_children():
    parent = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 10
        while len(process_tree(parent.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = process_tree(parent.pid)
        assert tree[0] == parent.pid and len(tree) == 3
    finally:
        for pid in process_tree(parent.pid)[1:]:
            os.kill(pid, 9)
        parent.kill()
        parent.wait()
    assert process_tree(parent.pid) == [parent.pid]  # reaped: no children, counted as itself
    assert cpu_seconds([parent.pid]) == 0.0  # an exited process counts 0


def test_cpu_seconds_grow_with_this_process_work():
    before = cpu_seconds([os.getpid()])
    deadline = time.process_time() + 0.1
    while time.process_time() < deadline:
        pass
    assert cpu_seconds([os.getpid()]) - before >= 0.05


def test_named_threads_cpu_counts_only_the_threads_of_that_name():
    import threading

    from kv_transfer.threads import name_this_thread
    from loadgen.proc_cpu import named_threads_cpu_s, threads_cpu_s

    done = threading.Event()

    def spin(name: str, seconds: float) -> None:
        name_this_thread(name)
        until = time.thread_time() + seconds
        while time.thread_time() < until:
            pass
        done.wait()

    busy = threading.Thread(target=spin, args=("pdserve-kv-test", 0.4))
    other = threading.Thread(target=spin, args=("someone-else", 0.4))
    before = named_threads_cpu_s(os.getpid(), "pdserve-kv-")
    busy.start(), other.start()
    deadline = time.monotonic() + 30
    while named_threads_cpu_s(os.getpid(), "pdserve-kv-") - before < 0.35 and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        counted = named_threads_cpu_s(os.getpid(), "pdserve-kv-") - before
        assert 0.35 <= counted < 0.7  # the named thread's 0.4 s (tick resolution), not the other's
        assert named_threads_cpu_s(os.getpid(), "no-such-thread-") == 0.0
        # every thread listed with its process, its id and its name: the main thread's id is the pid's
        listed = {(pid, tid, name) for pid, tid, name, _ in threads_cpu_s(os.getpid())}
        assert (os.getpid(), busy.native_id, "pdserve-kv-test") in listed
        assert any(tid == os.getpid() for _, tid, _ in listed)
    finally:
        done.set()
        busy.join(), other.join()
