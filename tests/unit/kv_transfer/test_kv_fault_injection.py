"""Every injected transfer fault, over real sockets, real shared memory and a real gloo pair, ends in a load error
vLLM recomputes (or a retry that loads the right bytes) within its timeout: no hang, no lease left
pinned, no flipped byte reported loaded. Producer: a `TransferServer`; consumer: the connector's
worker half (`PDWorker`), whose report is what vLLM is told."""

from __future__ import annotations

import time

import pytest
import torch

from kv_transfer.config import ConnectorConfig
from kv_transfer.faults import FaultPlan
from kv_transfer.geometry import BlockGeometry
from kv_transfer.layout import KVLayout
from kv_transfer.lease_board import LeaseBoard
from kv_transfer.leases import Lease, LeaseTable
from kv_transfer.metadata import PDConnectorMetadata
from kv_transfer.records import PullSpec
from kv_transfer.producer import TransferServer
from kv_transfer.shm_segment import Segment
from kv_transfer.transports.base import SERVED
from kv_transfer.transports.shm import SharedCache, ShmConsumerChannel
from kv_transfer.worker_side import ModelIdentity, PDWorker

SMALL = BlockGeometry(num_layers=3, num_kv_heads=2, head_dim=32, block_size=32, dtype="bfloat16")   # 24 KiB a block
BIG = BlockGeometry(num_layers=4, num_kv_heads=8, head_dim=128, block_size=32, dtype="bfloat16")    # 512 KiB a block
IDENTITY = ModelIdentity("sha256:feed", num_kv_heads=2, head_dim=32)
TIMEOUT_S = 1.0      # the pull and I/O timeout every test runs with
MARGIN_S = 3.0       # what a slow, shared host may add to it


class Pair:
    """A producer (its cache seeded, in a segment for shm) and a consumer worker pulling from it."""

    def __init__(self, transport: str, geometry: BlockGeometry = SMALL, num_blocks: int = 24,
                 producer_faults: str = "", consumer_faults: str = "", board: bool = True):
        self.num_blocks = num_blocks
        self.segment = Segment(geometry.cache_bytes(num_blocks)) if transport == "shm" else None
        self.source = geometry.caches(num_blocks, seed=None, memory=self.segment.tensor if self.segment else None)
        for index, tensor in enumerate(self.source.values()):
            raw = tensor.view(torch.uint8)
            raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(index)))
        layout = KVLayout(self.source, num_blocks)
        self.leases = LeaseTable()
        if self.segment is not None and board:
            self.leases.attach_board(LeaseBoard(self.segment.board_area()))
        identity = ModelIdentity("sha256:feed", geometry.num_kv_heads, geometry.head_dim)
        compat = layout.compat("", geometry.block_size, fingerprint=identity.fingerprint,
                               num_kv_heads=geometry.num_kv_heads, head_dim=geometry.head_dim)
        shared = SharedCache.of(self.segment, self.source, num_blocks) if self.segment else None
        self.server = TransferServer(layout, compat, self.leases, "127.0.0.1", 0, grant_wait_s=0.2,
                                     io_timeout_s=TIMEOUT_S, transports=SERVED[transport], shared_cache=shared,
                                     faults=FaultPlan.parse(producer_faults) or None)
        self.address = f"127.0.0.1:{self.server.start()}"
        self.target = geometry.caches(num_blocks)
        config = ConnectorConfig(transport=transport, pull_timeout_s=TIMEOUT_S, fault_plan=consumer_faults)
        self.worker = PDWorker(config, False, True, geometry.block_size, num_blocks, identity)
        self.worker.register_kv_caches(self.target)

    def pull(self, transfer_id: str, remote: tuple[int, ...], local: tuple[int, ...], lease_s: float = 30.0):
        """Grants `remote` and pulls it into `local` as vLLM would: (finished, failed, invalid ids, seconds)."""
        self.leases.grant(Lease(transfer_id, f"prefill-{transfer_id}", remote, 32 * len(remote),
                                time.monotonic() + lease_s))
        started = time.monotonic()
        self.worker.start_load_kv(PDConnectorMetadata(pulls=[PullSpec(transfer_id, transfer_id, self.address, remote,
                                                                      local, 32 * len(remote))]))
        deadline = started + TIMEOUT_S * 4 + MARGIN_S + 10
        while time.monotonic() < deadline:
            _, finished, failed = self.worker.get_transfer_results()
            if finished:
                return finished, failed, self.worker.take_invalid_block_ids(), time.monotonic() - started
            time.sleep(0.01)
        raise AssertionError(f"pull of {transfer_id} did not end within {deadline - started:.0f} s: a hang")

    def loaded(self, remote, local) -> list[bool]:
        """Per block: do our local bytes equal the producer's, in every layer?"""
        return [all(torch.equal(self.source[n][r].view(torch.uint8), self.target[n][l].view(torch.uint8))
                    for n in self.source) for r, l in zip(remote, local)]

    def held_leases(self, timeout_s: float = MARGIN_S + TIMEOUT_S) -> int:
        """The producer's pinned leases once the failure paths settle (0 expected)."""
        deadline = time.monotonic() + timeout_s
        while self.leases.num_held and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.leases.num_held

    def close(self) -> None:
        self.worker.shutdown()
        self.server.stop()
        if self.segment is not None:
            self.segment.close()


@pytest.fixture
def pairs():
    made = []
    yield lambda *args, **kwargs: made.append(Pair(*args, **kwargs)) or made[-1]
    for pair in made:
        pair.close()


REMOTE, LOCAL = (3, 4, 5, 6, 10), (11, 12, 13, 20, 21)


@pytest.mark.parametrize("transport", ["tcp", "shm", "torch"])
def test_flipped_bytes_are_a_load_error_for_exactly_their_block_and_the_rest_loads(pairs, transport):
    pair = pairs(transport, consumer_faults="flip_bytes@1,seed=3")
    finished, failed, invalid, seconds = pair.pull("t-flip", REMOTE, LOCAL)
    good = pair.loaded(REMOTE, LOCAL)
    assert finished == {"t-flip"} and failed == set()   # vLLM keeps the good prefix, recomputes from the bad block
    assert len(invalid) == 1 and good.count(False) == 1 and invalid == {LOCAL[good.index(False)]}
    assert seconds < TIMEOUT_S + MARGIN_S
    assert pair.held_leases() == 0
    finished, failed, invalid, _ = pair.pull("t-next", (7, 8), (1, 2))   # the next pull is untouched
    assert (finished, failed, invalid, pair.loaded((7, 8), (1, 2))) == ({"t-next"}, set(), set(), [True, True])


@pytest.mark.parametrize("transport", ["tcp", "shm", "torch"])
def test_a_producer_that_never_answers_fails_the_pull_within_its_timeout(pairs, transport):
    pair = pairs(transport, producer_faults="producer_silent@1", board=False)
    finished, failed, invalid, seconds = pair.pull("t-silent", REMOTE, LOCAL)
    assert (finished, failed, invalid) == ({"t-silent"}, {"t-silent"}, set(LOCAL))
    assert TIMEOUT_S * 0.9 <= seconds < TIMEOUT_S + MARGIN_S
    assert pair.held_leases() == 0   # the consumer's one-shot release, once the producer's pin ends


@pytest.mark.parametrize("transport", ["tcp", "torch"])
def test_a_connection_dropped_mid_block_fails_the_pull_and_the_next_one_reconnects(pairs, transport):
    pair = pairs(transport, producer_faults="drop_connection_mid_block@1,seed=1")
    finished, failed, invalid, seconds = pair.pull("t-drop", REMOTE, LOCAL)
    assert (finished, failed, invalid) == ({"t-drop"}, {"t-drop"}, set(LOCAL))
    assert seconds < TIMEOUT_S + MARGIN_S and pair.server.faults.fired == [(1, "drop_connection_mid_block")]
    assert pair.held_leases() == 0
    finished, failed, _, _ = pair.pull("t-after", REMOTE, LOCAL)
    assert (finished, failed, pair.loaded(REMOTE, LOCAL)) == ({"t-after"}, set(), [True] * 5)
    assert pair.server.stats.data_channels == 2


def test_a_one_sided_producer_that_drops_the_connection_costs_a_retry_not_a_recompute(pairs):
    pair = pairs("shm", producer_faults="drop_connection_mid_block@2", board=False)
    assert pair.pull("t-first", (1,), (1,))[:3] == ({"t-first"}, set(), set())   # the connection is now cached
    finished, failed, invalid, seconds = pair.pull("t-drop", REMOTE, LOCAL)
    assert (finished, failed, invalid, pair.loaded(REMOTE, LOCAL)) == ({"t-drop"}, set(), set(), [True] * 5)
    assert pair.worker.take_worker_meta().reports["t-drop"].error == ""
    assert seconds < MARGIN_S and pair.held_leases() == 0


@pytest.mark.parametrize("transport", ["tcp", "torch"])
def test_a_consumer_that_stops_reading_is_dropped_by_the_producer_and_fails_its_pull(pairs, transport):
    """64 blocks of 512 KiB: more than loopback's socket buffers hold (tcp), and messages whose
    receives are not posted (torch), so the producer's send blocks and gives up after its I/O
    timeout; the consumer, waking, finds the connection gone."""
    pair = pairs(transport, geometry=BIG, num_blocks=72, consumer_faults=f"stall_reader@1,stall_s={TIMEOUT_S * 2.5}")
    remote, local = tuple(range(64)), tuple(range(4, 68))
    finished, failed, invalid, seconds = pair.pull("t-stall", remote, local)
    assert (finished, failed, invalid) == ({"t-stall"}, {"t-stall"}, set(local))
    assert seconds < TIMEOUT_S * 2.5 + MARGIN_S
    assert pair.held_leases() == 0


def test_a_one_sided_copy_that_stalls_past_the_lease_is_not_reported_loaded(pairs):
    pair = pairs("shm", consumer_faults=f"stall_reader@1,stall_s={TIMEOUT_S}")
    finished, failed, invalid, seconds = pair.pull("t-stall", REMOTE, LOCAL, lease_s=TIMEOUT_S / 4)
    assert (finished, failed, invalid) == ({"t-stall"}, {"t-stall"}, set(LOCAL))   # expired: MISSING
    assert seconds < TIMEOUT_S + MARGIN_S and pair.held_leases() == 0


def test_blocks_rewritten_under_a_held_lease_during_a_copy_are_caught_by_their_checksum(pairs, monkeypatch):
    """An abort racing a write that the lease protocol missed (a bug, a stray writer): the board
    still vouches for the lease, but the copy's checksums do not fold to the board's, the producer's
    per-block checksums name the rewritten block, and only it is reported invalid."""
    pair = pairs("shm")
    copy = ShmConsumerChannel.copy

    def copy_while_overwritten(channel, local, remote):
        for tensor in pair.source.values():
            tensor[remote[2]] = 0   # the engine writing into block 5 mid-copy
        return copy(channel, local, remote)

    monkeypatch.setattr(ShmConsumerChannel, "copy", copy_while_overwritten)
    finished, failed, invalid, _ = pair.pull("t-race", REMOTE, LOCAL)
    assert (finished, failed, invalid) == ({"t-race"}, set(), {LOCAL[2]})
    assert pair.server.stats.vouched_transfers == 0 and pair.held_leases() == 0
