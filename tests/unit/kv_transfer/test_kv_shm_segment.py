"""The producer's shared-memory segment (kv_transfer/shm_segment.py): made private and unlinked,
checked before a consumer trusts it, swept when its engine died, and what vLLM allocates in it."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time

import pytest
import torch

from kv_transfer.shm_segment import (HEADER_BYTES, PREFIX, SEGMENT_DIR, Segment, SegmentAllocation, SegmentError,
                                     map_segment, sweep_stale)


def test_a_segment_is_private_and_unlinked_on_close():
    segment = Segment(1 << 20)
    info = os.stat(segment.path)
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_size == HEADER_BYTES + (1 << 20)
    assert segment.path.parent == SEGMENT_DIR and segment.path.name.startswith(f"{PREFIX}{os.getuid()}-")
    assert int(segment.tensor.abs().sum()) == 0 and segment.tensor.numel() == 1 << 20
    segment.close()
    assert not segment.path.exists()


def test_mapping_checks_the_file_before_trusting_it(tmp_path):
    segment = Segment(4096)
    try:
        mapped = map_segment(str(segment.path), 4096)
        assert mapped.token == segment.token
        mapped.close()
        with pytest.raises(SegmentError, match="holds"):
            map_segment(str(segment.path), 8192)  # another size than advertised
        os.chmod(segment.path, 0o644)
        with pytest.raises(SegmentError, match="0600"):
            map_segment(str(segment.path), 4096)
        with pytest.raises(SegmentError, match="not a pdserve KV segment path"):
            map_segment(str(tmp_path / "elsewhere"), 4096)
    finally:
        segment.close()


def test_the_segment_of_a_killed_engine_is_swept_and_a_live_one_kept():
    live = Segment(4096)
    owner = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom kv_transfer.shm_segment import Segment\n"
                              "s = Segment(4096)\nprint(s.path, flush=True)\ntime.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        dead_path = owner.stdout.readline().strip()
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        assert os.path.exists(dead_path)  # SIGKILL: nobody unlinked it
        removed = sweep_stale()
        assert os.path.basename(dead_path) in removed and not os.path.exists(dead_path)
        assert live.path.exists()
    finally:
        owner.kill()
        live.close()


def test_the_allocation_context_puts_exactly_the_cache_in_a_segment():
    allocation = SegmentAllocation(3 << 20)
    with allocation:
        other = torch.zeros(16, dtype=torch.int8)
        cache = torch.zeros(3 << 20, dtype=torch.int8, device="cpu")
        again = torch.zeros(3 << 20, dtype=torch.int8)  # one cache per engine: the second is ordinary
    try:
        assert allocation.segment is not None
        assert cache.data_ptr() == allocation.segment.base_address
        assert other.data_ptr() != allocation.segment.base_address
        assert again.data_ptr() != allocation.segment.base_address
    finally:
        allocation.segment.close()


def test_a_segment_that_cannot_be_made_leaves_the_cache_in_private_memory(tmp_path):
    allocation = SegmentAllocation(1 << 20, folder=tmp_path / "missing")  # no such folder: creation fails
    with allocation:
        cache = torch.zeros(1 << 20, dtype=torch.int8)
    assert allocation.segment is None and cache.numel() == 1 << 20 and int(cache.abs().sum()) == 0


def test_an_unfinished_segment_is_swept_only_once_its_maker_is_surely_gone():
    from kv_transfer.shm_segment import NEW_PREFIX, UNFINISHED_AGE_S

    fresh = SEGMENT_DIR / f"{NEW_PREFIX}{os.getuid()}-fresh{os.getpid()}"
    old = SEGMENT_DIR / f"{NEW_PREFIX}{os.getuid()}-old{os.getpid()}"
    for path in (fresh, old):
        path.write_bytes(b"")
    long_ago = time.time() - UNFINISHED_AGE_S - 5
    os.utime(old, (long_ago, long_ago))
    try:
        removed = sweep_stale()
        assert old.name in removed and not old.exists()
        assert fresh.exists()  # its maker may be between creating and locking it
    finally:
        fresh.unlink(missing_ok=True)
        old.unlink(missing_ok=True)
