"""Process-tree CPU accounting from Linux /proc: what a group of processes, or every other
process on the machine, has used.

Contracts: every reader tolerates processes exiting while it looks (an exited process counts 0
and has no children); CPU is user + system time, at /proc's resolution of one clock tick
(`TICKS_PER_S`, usually 10 ms). The parsers (`stat_cpu_ticks`, `machine_busy_ticks`) are pure.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
_PROC = Path("/proc")


def stat_cpu_ticks(stat_text: str) -> tuple[int, int]:
    """(parent pid, utime + stime ticks) from the text of /proc/<pid>/stat; the command name in
    parentheses may itself hold spaces and parentheses."""
    rest = stat_text.rsplit(")", 1)[1].split()  # fields after "pid (comm)": state, ppid, ...
    return int(rest[1]), int(rest[11]) + int(rest[12])


def stat_tree_ticks(stat_text: str) -> int:
    """utime + stime + cutime + cstime from /proc/<pid>/stat's text: the process's own CPU and that
    of the children it has reaped (a child's ticks move there when it is waited for, so a snapshot
    of a process tree counts a finished child's work once, in its parent)."""
    rest = stat_text.rsplit(")", 1)[1].split()
    return sum(int(value) for value in rest[11:15])


def machine_busy_ticks(proc_stat_text: str) -> int:
    """Busy ticks of the whole machine (user+nice+system+irq+softirq+steal) from /proc/stat's text."""
    fields = [int(v) for v in proc_stat_text.split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return user + nice + system + irq + softirq + steal


def core_busy_ticks(proc_stat_text: str) -> dict[int, int]:
    """Busy ticks of each core (user+nice+system+irq+softirq: what the guest's own processes and
    kernel ran; neither idle, iowait nor steal, the hypervisor's) from /proc/stat's text, by core
    number."""
    busy = {}
    for line in proc_stat_text.splitlines():
        name, *values = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in values[:7])
            busy[int(name[3:])] = user + nice + system + irq + softirq
    return busy


def core_busy_s() -> dict[int, float]:
    """CPU seconds each of this machine's cores has been busy since boot (`core_busy_ticks`)."""
    return {core: ticks / TICKS_PER_S for core, ticks in core_busy_ticks((_PROC / "stat").read_text()).items()}


def process_tree(pid: int) -> list[int]:
    """`pid` and its live descendants, `pid` first (Linux)."""
    children: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            children += [int(child) for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    except FileNotFoundError:  # the process, or one of its threads, exited while we looked
        pass
    return [pid] + [p for child in children for p in process_tree(child)]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes have used (0 for one that has exited)."""
    total_ticks = 0
    for pid in pids:
        try:
            total_ticks += stat_cpu_ticks((_PROC / str(pid) / "stat").read_text())[1]
        except FileNotFoundError:
            continue
    return total_ticks / TICKS_PER_S


def threads_cpu_s(root_pid: int) -> list[tuple[int, int, str, float]]:
    """(pid, thread id, the thread's name (/proc's `comm`), its user + system CPU seconds) of every
    live thread of `root_pid` and its live descendants. A thread that has exited is not listed, so
    take the difference of two readings while the threads live."""
    threads = []
    for pid in process_tree(root_pid):
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            continue
        for task in tasks:
            try:
                comm = Path(f"/proc/{pid}/task/{task}/comm").read_text().strip()
                ticks = stat_cpu_ticks(Path(f"/proc/{pid}/task/{task}/stat").read_text())[1]
            except (FileNotFoundError, ProcessLookupError):
                continue
            threads.append((pid, int(task), comm, ticks / TICKS_PER_S))
    return threads


def named_threads_cpu_s(root_pid: int, name_prefix: str) -> float:
    """User + system CPU seconds of the threads whose name (/proc's `comm`) starts with
    `name_prefix`, in `root_pid` and its live descendants (`threads_cpu_s`: a thread that has
    exited counts 0, e.g. a KV server's connection threads live as long as their connection)."""
    return sum(cpu_s for _, _, comm, cpu_s in threads_cpu_s(root_pid) if comm.startswith(name_prefix))


def per_core_ticks(proc_stat_text: str) -> dict[str, tuple[int, int]]:
    """"cpuN" -> (busy, total) ticks from /proc/stat's text; busy is all but idle and iowait."""
    cores = {}
    for line in proc_stat_text.splitlines():
        name, *values = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            ticks = [int(v) for v in values[:8]]
            cores[name] = (sum(ticks) - ticks[3] - ticks[4], sum(ticks))
    return cores


def core_busy_shares(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> dict[str, float]:
    """Each core's busy share of the ticks between two `per_core_ticks` readings."""
    return {core: (after[core][0] - before[core][0]) / max(1, after[core][1] - before[core][1]) for core in after}


def busy_ticks() -> int:
    """Busy CPU ticks of the whole machine since boot."""
    return machine_busy_ticks((_PROC / "stat").read_text())


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, CPU ticks with its reaped children's, `stat_tree_ticks`) for every
    process readable now."""
    table: dict[int, tuple[int, int]] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
            table[int(entry.name)] = (stat_cpu_ticks(text)[0], stat_tree_ticks(text))
        except OSError:
            continue  # exited while we looked
    return table


def tree_ticks(root_pid: int) -> dict[int, int]:
    """CPU ticks of `root_pid` and all its live descendants, by pid, each with the ticks of the
    children it has reaped: a child that started and finished between two readings (a benchmark's
    engine process, run to completion) counts as ours, not as another process's load."""
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    ours, stack = {}, [root_pid]
    while stack:
        pid = stack.pop()
        if pid in table:
            ours[pid] = table[pid][1]
            stack.extend(children.get(pid, ()))
    return ours


def other_load_cores(busy_delta_ticks: int, ours_before: dict[int, int], ours_after: dict[int, int],
                     wall_s: float) -> float:
    """Average cores busy with processes outside our tree over `wall_s`: the machine's busy ticks
    less our tree's ticks (a process of ours started meanwhile counts from 0), never below 0."""
    if wall_s <= 0:
        return 0.0
    ours_delta = sum(ticks - ours_before.get(pid, 0) for pid, ticks in ours_after.items())
    return max(0.0, (busy_delta_ticks - ours_delta) / TICKS_PER_S / wall_s)


@dataclass
class OtherLoad:
    """How much CPU *other* processes use while a run is measured: `start()` / `stop()` bracket
    the run. "Ours" is this process's tree (the benchmark, its servers, their engine processes).
    0.0 is a quiet machine; 1.0 means a whole core was taken by someone else on average."""

    started_s: float
    busy_ticks: int
    ours: dict[int, int]

    @classmethod
    def start(cls) -> OtherLoad:
        return cls(time.monotonic(), busy_ticks(), tree_ticks(os.getpid()))

    def stop(self) -> float:
        """Average cores used by other processes since `start` (never below 0)."""
        wall_s = time.monotonic() - self.started_s
        return other_load_cores(busy_ticks() - self.busy_ticks, self.ours, tree_ticks(os.getpid()), wall_s)


def wait_for_quiet(threshold_cores: float, max_wait_s: float, window_s: float = 2.0) -> tuple[float, float]:
    """Sample other processes' CPU use in `window_s` windows until one is at most `threshold_cores`
    or `max_wait_s` has passed; returns (seconds waited, the last sample in cores)."""
    started = time.monotonic()
    while True:
        meter = OtherLoad.start()
        time.sleep(window_s)
        other_cores = meter.stop()
        waited_s = time.monotonic() - started
        if other_cores <= threshold_cores or waited_s >= max_wait_s:
            return waited_s, other_cores
