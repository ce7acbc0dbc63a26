"""Which worker failures end a request, which retry it, and which take the worker out of rotation."""

import grpc
import pytest

from router.failures import verdict_for


@pytest.mark.parametrize("code", [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
                                  grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.DEADLINE_EXCEEDED])
def test_a_request_s_own_error_ends_it_and_never_quarantines_the_worker(code):
    verdict = verdict_for(code)
    assert (verdict.end_request, verdict.quarantine, verdict.retry_elsewhere) == (True, False, False)


def test_a_busy_worker_is_skipped_for_this_request_but_stays_in_rotation():
    verdict = verdict_for(grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert (verdict.end_request, verdict.quarantine, verdict.retry_elsewhere) == (False, False, True)


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL,
                                  grpc.StatusCode.CANCELLED])  # CANCELLED from a worker: it was stopping
def test_a_dead_or_crashed_worker_is_quarantined_and_the_phase_retried(code):
    verdict = verdict_for(code)
    assert (verdict.end_request, verdict.quarantine, verdict.retry_elsewhere) == (False, True, True)
