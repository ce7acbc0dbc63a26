"""The local actuator's bookkeeping over a WorkerBackend: sizes, newest-first removal, drains in the
background, the unmanaged floor. The backend here records calls and can hold a drain open; the
real backends (LocalCluster, WorkerProcesses) run in tests/integration/test_planner_scaling.py."""

from __future__ import annotations

import threading

import pytest

from planner.actuators.base import Actuator
from planner.actuators.local import LocalActuator, LocalScaleError
from planner.pool_sizes import PoolSizes


class Backend:
    def __init__(self) -> None:
        self.workers: list[str] = []
        self.removed: list[str] = []
        self.release = threading.Event()
        self.release.set()
        self._n = 0

    def add_worker(self, role: str, wait: bool = True) -> str:
        assert wait is False  # the actuator never blocks on an engine start
        worker_id = f"{role}-{self._n}"
        self._n += 1
        self.workers.append(worker_id)
        return worker_id

    def remove_worker(self, worker_id: str) -> int:
        self.release.wait(5)
        self.workers.remove(worker_id)
        self.removed.append(worker_id)
        return 0

    def worker_ids(self, role: str) -> list[str]:
        return [w for w in self.workers if w.startswith(f"{role}-")]


def test_it_is_an_actuator_and_counts_unmanaged_workers():
    actuator = LocalActuator(Backend(), unmanaged=PoolSizes(1, 1))
    assert isinstance(actuator, Actuator)
    assert actuator.current() == {"prefill": 1, "decode": 1}


def test_scale_up_starts_the_difference_and_is_idempotent():
    backend = Backend()
    actuator = LocalActuator(backend, unmanaged=PoolSizes(1, 1))
    actuator.scale("decode", 3)
    actuator.scale("decode", 3)
    assert backend.workers == ["decode-0", "decode-1"]
    assert actuator.current() == {"prefill": 1, "decode": 3}


def test_scale_down_drains_the_newest_in_the_background_and_stops_counting_it_at_once():
    backend = Backend()
    actuator = LocalActuator(backend)
    actuator.scale("decode", 3)
    backend.release.clear()  # the drain is still running (a request in flight)
    actuator.scale("decode", 1)
    assert actuator.current()["decode"] == 1  # the draining ones no longer count
    assert backend.workers == ["decode-0", "decode-1", "decode-2"]  # but they still run
    actuator.scale("decode", 1)  # idempotent while draining: nothing more removed
    backend.release.set()
    actuator.wait_for_drains()
    assert sorted(backend.removed) == ["decode-1", "decode-2"] and backend.workers == ["decode-0"]  # newest went
    assert actuator.current()["decode"] == 1


def test_shrinking_below_the_unmanaged_workers_is_refused_with_the_fix():
    actuator = LocalActuator(Backend(), unmanaged=PoolSizes(1, 2))
    with pytest.raises(LocalScaleError, match="set the planner's --min-decode to at least 2"):
        actuator.scale("decode", 1)


@pytest.mark.parametrize("role, replicas, message", [("gpu", 1, "role must be one of"),
                                                     ("decode", -1, "int >= 0"), ("decode", True, "int >= 0")])
def test_bad_requests_are_refused(role, replicas, message):
    with pytest.raises(ValueError, match=message):
        LocalActuator(Backend()).scale(role, replicas)
