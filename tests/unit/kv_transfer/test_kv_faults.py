"""The pure parts of fault injection and checksums: plan decisions, parsing, the checksum function
and its framing (which blocks a mismatch names), all with plain values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kv_transfer.checksum import (block_checksums, copy_with_checksums, mismatched, reference_sums)
from kv_transfer.config import ConnectorConfig
from kv_transfer.faults import FAULTS_ENV, FaultInjector, FaultPlan, FaultRule, injector
from kv_transfer.geometry import BlockGeometry
from kv_transfer.layout import KVLayout
from kv_transfer.lease_board import lease_checksum
from kv_transfer.transports.faulty import split_at


def test_an_nth_rule_fires_on_exactly_that_transfer_of_its_side():
    plan = FaultPlan((FaultRule("flip_bytes", nth=3), FaultRule("producer_silent", nth=1)), seed=5)
    assert [plan.decide("consumer", i) and plan.decide("consumer", i).kind for i in range(1, 6)] == \
        [None, None, "flip_bytes", None, None]
    assert plan.decide("producer", 1).kind == "producer_silent" and plan.decide("producer", 2) is None


def test_probability_rules_are_fixed_by_the_seed_and_near_their_rate():
    plan = FaultPlan((FaultRule("drop_connection_mid_block", probability=0.25),), seed=11)
    fired = [plan.decide("producer", i) is not None for i in range(1, 2001)]
    assert fired == [FaultPlan(plan.rules, seed=11).decide("producer", i) is not None for i in range(1, 2001)]
    assert fired != [FaultPlan(plan.rules, seed=12).decide("producer", i) is not None for i in range(1, 2001)]
    assert 400 <= sum(fired) <= 600
    fractions = {plan.decide("producer", i).fraction for i in range(1, 200) if plan.decide("producer", i)}
    assert all(0.0 <= f < 1.0 for f in fractions) and len(fractions) > 10


def test_a_plan_parses_from_its_text_and_refuses_what_it_cannot_mean():
    plan = FaultPlan.parse("flip_bytes@2, stall_reader~0.5, seed=7, stall_s=0.25")
    assert plan == FaultPlan((FaultRule("flip_bytes", nth=2), FaultRule("stall_reader", probability=0.5)),
                             seed=7, stall_s=0.25)
    assert not FaultPlan.parse("")
    for bad in ("flip_bytes", "melt@1", "flip_bytes@-1", "flip_bytes~2", "seed=x"):
        with pytest.raises(ValueError, match="bad fault plan item"):
            FaultPlan.parse(bad)
    with pytest.raises(ValueError, match="exactly one trigger"):
        FaultRule("flip_bytes")


def test_an_injector_counts_its_sides_transfers_and_none_exists_without_rules_for_it():
    plan = FaultPlan.parse("flip_bytes@2")
    assert injector(plan, "producer") is None and injector(None, "consumer") is None
    consumer = injector(plan, "consumer")
    assert isinstance(consumer, FaultInjector)
    assert [f and f.kind for f in (consumer.next_fault(), consumer.next_fault(), consumer.next_fault())] == \
        [None, "flip_bytes", None]
    assert consumer.fired == [(2, "flip_bytes")]


def test_the_config_takes_a_plan_from_the_environment_only_at_its_entry_point():
    assert ConnectorConfig.from_extra({}, environ={}).faults is None
    config = ConnectorConfig.from_extra({}, environ={FAULTS_ENV: "producer_silent@1"})
    assert config.faults == FaultPlan((FaultRule("producer_silent", nth=1),))
    assert ConnectorConfig.from_extra({"fault_plan": "flip_bytes@1"}, environ={FAULTS_ENV: "x@1"}).fault_plan == \
        "flip_bytes@1"
    with pytest.raises(ValueError, match="unknown fault kind"):
        ConnectorConfig(fault_plan="melt@1")


def test_split_at_cuts_buffers_mid_block_and_keeps_every_byte():
    buffers = [memoryview(bytearray(range(10))), memoryview(bytearray(range(10, 16)))]
    before, after = split_at(buffers, 0.75)
    assert [bytes(b) for b in before] == [bytes(range(10)), bytes([10, 11])]
    assert [bytes(b) for b in after] == [bytes(range(12, 16))]
    assert sum(map(len, split_at(buffers, 0.0)[0])) == 1 and sum(map(len, split_at(buffers, 0.999)[1])) == 1


def test_the_kernel_equals_the_numpy_reference_and_sees_one_flipped_bit_or_swapped_words():
    words = np.random.default_rng(0).integers(0, 2**63, size=4096, dtype=np.uint64)
    target = np.zeros(4096 * 8, dtype=np.uint8)
    sums = copy_with_checksums([target], [words.view(np.uint8)], [4096], [0], 8)
    assert sums == [int(v) for v in reference_sums(words, 512)]
    assert np.array_equal(target.view(np.uint64), words)
    flipped = words.copy()
    flipped[700] ^= np.uint64(1 << 63)
    swapped = words.copy()
    swapped[[10, 11]] = swapped[[11, 10]]
    assert [i for i, (a, b) in enumerate(zip(reference_sums(words, 512), reference_sums(flipped, 512))) if a != b] == [1]
    assert reference_sums(swapped, 512)[0] != reference_sums(words, 512)[0]


def test_block_checksums_fold_every_layer_and_name_exactly_the_changed_block():
    geometry = BlockGeometry(num_layers=3, num_kv_heads=2, head_dim=32, block_size=32, dtype="bfloat16")
    caches = geometry.caches(12, seed=4)
    layout = KVLayout(caches, 12)
    ids = [2, 3, 4, 9]
    before = block_checksums(layout, ids)
    assert before == block_checksums(layout, [2]) + block_checksums(layout, [3, 4]) + block_checksums(layout, [9])
    caches[sorted(caches)[2]].view(torch.uint8)[4].view(-1)[100] ^= 0xFF   # block 4, last layer
    after = block_checksums(layout, ids)
    assert mismatched(ids, before, after) == [4]
    assert mismatched(ids, before, after[:3]) == ids   # a list that does not describe these blocks
    assert lease_checksum(before) != lease_checksum(after) and lease_checksum([]) != 0
