"""pdserve's vLLM plugin caps how long vLLM's shared-memory queue readers busy-poll."""

import time

import pytest
import zmq

from pdserve import vllm_plugin


@pytest.fixture
def spin_condition_class():
    """vLLM's SpinCondition, restored after the test (the cap patches the class)."""
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    original = SpinCondition.wait
    yield SpinCondition
    SpinCondition.wait = original
    if hasattr(SpinCondition, "_pdserve_original_wait"):
        del SpinCondition._pdserve_original_wait


def _reader(spin_condition_class, tmp_path):
    context = zmq.Context()
    return spin_condition_class(is_reader=True, context=context, notify_address=f"ipc://{tmp_path}/notify")


def _seconds_to_wait(condition, timeout_ms: int) -> float:
    condition.last_read = time.monotonic()  # a message was just read
    started = time.monotonic()
    condition.wait(timeout_ms=timeout_ms)
    return time.monotonic() - started


def test_vllms_plugin_loader_finds_pdserves_plugin():
    from vllm.plugins import load_plugins_by_group

    assert load_plugins_by_group("vllm.general_plugins")["pdserve_spin"] is vllm_plugin.register


def test_a_capped_reader_sleeps_on_its_socket_instead_of_spinning(spin_condition_class, tmp_path):
    condition = _reader(spin_condition_class, tmp_path)
    assert condition.busy_loop_s == 1  # vLLM's own: right after a read, wait() only yields the core
    assert _seconds_to_wait(condition, timeout_ms=200) < 0.05
    vllm_plugin.cap_shm_spin(0.0)
    assert _seconds_to_wait(condition, timeout_ms=200) >= 0.19  # slept on the socket until the timeout
    assert condition.busy_loop_s == 0.0


def test_capping_twice_keeps_one_layer_and_the_lower_cap_of_a_later_call(spin_condition_class, tmp_path):
    vllm_plugin.cap_shm_spin(0.5)
    vllm_plugin.cap_shm_spin(0.0)
    condition = _reader(spin_condition_class, tmp_path)
    assert _seconds_to_wait(condition, timeout_ms=100) >= 0.09 and condition.busy_loop_s == 0.0


def test_without_the_environment_variable_vllm_is_left_alone(spin_condition_class, monkeypatch):
    monkeypatch.delenv(vllm_plugin.SPIN_ENV, raising=False)
    before = spin_condition_class.wait
    vllm_plugin.register()
    assert spin_condition_class.wait is before


def test_a_negative_cap_is_refused(monkeypatch):
    monkeypatch.setenv(vllm_plugin.SPIN_ENV, "-1")
    with pytest.raises(ValueError, match="must be >= 0"):
        vllm_plugin.register()
