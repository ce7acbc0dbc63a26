"""How much CPU *other* processes used while a benchmark run was measured (Linux /proc).

The machine is shared: another engineer's engine on our two cores slows whichever system is being
measured. `OtherLoad.start()` / `.stop()` bracket a run and return the average number of cores
busy with processes outside this benchmark's process tree (the benchmark itself, its servers and
their engine processes): `(all busy CPU time - our tree's CPU time) / wall time`.
0.0 is a quiet machine; 1.0 means a whole core of our two was taken by someone else on average.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
_PROC = Path("/proc")


def busy_ticks() -> int:
    """Busy CPU ticks of the whole machine since boot (user+nice+system+irq+softirq+steal)."""
    fields = [int(v) for v in (_PROC / "stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return user + nice + system + irq + softirq + steal


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, utime + stime ticks) for every process readable now."""
    table: dict[int, tuple[int, int]] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        rest = stat[stat.rindex(")") + 2:].split()  # fields after "pid (comm) "
        table[int(entry.name)] = (int(rest[1]), int(rest[11]) + int(rest[12]))
    return table


def tree_ticks(root_pid: int) -> dict[int, int]:
    """CPU ticks of `root_pid` and all its live descendants, by pid."""
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


@dataclass
class OtherLoad:
    started_s: float
    busy_ticks: int
    ours: dict[int, int]

    @classmethod
    def start(cls) -> "OtherLoad":
        return cls(time.monotonic(), busy_ticks(), tree_ticks(os.getpid()))

    def stop(self) -> float:
        """Average cores used by other processes since `start` (never below 0)."""
        wall_s = time.monotonic() - self.started_s
        ours_now = tree_ticks(os.getpid())
        ours_delta = sum(ticks - self.ours.get(pid, 0) for pid, ticks in ours_now.items())
        other_ticks = busy_ticks() - self.busy_ticks - ours_delta
        return max(0.0, other_ticks / _TICKS_PER_S / wall_s) if wall_s > 0 else 0.0


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
