"""pdserve's vLLM plugin: while an engine core only holds finished requests' blocks for a KV pull,
it waits for its next request between empty steps instead of stepping every millisecond."""

import queue
import threading
import time

import pytest

from pdserve import vllm_plugin


@pytest.mark.parametrize(
    "running, waiting, batches, has_requests, holding",
    [
        (0, 0, 0, True, True),     # finished requests held for a pull (or ids the next step clears)
        (0, 0, 0, False, False),   # nothing at all: vLLM's loop blocks on its input queue by itself
        (1, 0, 0, True, False),    # a request running: step at vLLM's pace
        (0, 1, 0, True, False),    # waiting (e.g. for its remote KV on a decode engine): notice it at once
        (0, 0, 1, True, False),    # a batch in flight
    ],
)
def test_an_engine_core_only_holds_when_it_has_requests_and_none_to_run(running, waiting, batches, has_requests,
                                                                         holding):
    assert vllm_plugin.only_holding(running, waiting, batches, has_requests) is holding


class _Scheduler:
    def __init__(self, counts: tuple[int, int], has_requests: bool = True):
        self.counts, self.pending, self.steps = counts, has_requests, 0

    def get_request_counts(self):
        return self.counts

    def has_requests(self):
        return self.pending


class _Core:
    """The attributes vLLM's `EngineCoreProc._process_engine_step` reads, around a scheduler whose
    steps run nothing (a GPU-free stand-in for the engine, not for the loop under test)."""

    def __init__(self, scheduler: _Scheduler):
        self.scheduler, self.batch_queue, self.input_queue = scheduler, None, queue.Queue()
        self.output_queue, self.handled = queue.Queue(), []

    def step_fn(self):
        self.scheduler.steps += 1
        return {}, False

    def post_step(self, model_executed: bool) -> None:
        pass

    def _handle_client_request(self, request_type, request) -> None:
        self.handled.append((request_type, request))


@pytest.fixture
def engine_core_class():
    """vLLM's EngineCoreProc with vLLM's own `_process_engine_step`, whatever an earlier test
    installed (`vllm_plugin.register()` installs the hold wait wherever PDSERVE_VLLM_HOLD_WAIT_S is
    set, and `pdserve.engine.engine_args` sets it in this process); put back as found after."""
    from vllm.v1.engine.core import EngineCoreProc

    found = EngineCoreProc.__dict__.get("_process_engine_step")
    installed = EngineCoreProc.__dict__.get("_pdserve_original_step")
    if installed is not None:
        EngineCoreProc._process_engine_step = installed
        del EngineCoreProc._pdserve_original_step
    yield EngineCoreProc
    EngineCoreProc._process_engine_step = found
    if installed is not None:
        EngineCoreProc._pdserve_original_step = installed
    elif "_pdserve_original_step" in EngineCoreProc.__dict__:
        del EngineCoreProc._pdserve_original_step


def _steps_in(engine_core_class, core: _Core, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        engine_core_class._process_engine_step(core)
    return core.scheduler.steps


def test_holding_an_engine_core_steps_every_wait_instead_of_every_millisecond(engine_core_class):
    vllm_own = _steps_in(engine_core_class, _Core(_Scheduler((0, 0))), 0.3)
    vllm_plugin.wait_for_input_while_holding(0.05)
    vllm_plugin.wait_for_input_while_holding(0.05)  # installed twice: still one layer
    waiting = _steps_in(engine_core_class, _Core(_Scheduler((0, 0))), 0.3)
    assert vllm_own >= 50       # vLLM's loop: a step, 1 ms asleep, a step (hundreds in 0.3 s)
    assert 2 <= waiting <= 8    # one step every 50 ms
    running = _steps_in(engine_core_class, _Core(_Scheduler((1, 0))), 0.3)
    assert running >= 50        # a running request is stepped at vLLM's pace


def test_a_request_arriving_while_it_holds_is_handled_at_once(engine_core_class):
    vllm_plugin.wait_for_input_while_holding(5.0)
    core = _Core(_Scheduler((0, 0)))
    threading.Timer(0.1, core.input_queue.put, args=(("ADD", "request-1"),)).start()
    started = time.monotonic()
    engine_core_class._process_engine_step(core)
    assert core.handled == [("ADD", "request-1")] and time.monotonic() - started < 2.0


def test_register_installs_the_hold_wait_only_when_the_variable_asks_for_it(engine_core_class, monkeypatch):
    vllm_own = engine_core_class._process_engine_step
    monkeypatch.delenv(vllm_plugin.SPIN_ENV, raising=False)
    for value in ("", "0"):
        monkeypatch.setenv(vllm_plugin.HOLD_WAIT_ENV, value)
        vllm_plugin.register()
        assert engine_core_class._process_engine_step is vllm_own
    monkeypatch.setenv(vllm_plugin.HOLD_WAIT_ENV, "0.05")
    vllm_plugin.register()
    assert engine_core_class._process_engine_step is not vllm_own
    assert engine_core_class._pdserve_original_step is vllm_own
