"""The KV throughput benchmark's library: the block geometry's bytes, the pure summary of the
samples, and a short real run of the producer/consumer pair (no speeds asserted)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from kv_transfer.geometry import BlockGeometry
from kv_transfer.layout import KVLayout
from kv_transfer.shm_segment import PREFIX, SEGMENT_DIR
from kv_transfer.throughput import reference
from kv_transfer.throughput.measure import measure
from kv_transfer.throughput.pair import PRODUCER_SEED, method_names, open_pair
from kv_transfer.throughput.report import cost_table, markdown_table
from kv_transfer.throughput.summary import Row, quartiles, speedup, summarize

BENCH = BlockGeometry(num_layers=12, num_kv_heads=4, head_dim=64, block_size=32, dtype="bfloat16")
SMALL = BlockGeometry(num_layers=2, num_kv_heads=2, head_dim=64, block_size=32, dtype="bfloat16")


# ---- geometry -----------------------------------------------------------------------------------
def test_a_bench_block_is_384_kib_over_its_twelve_layers():
    assert BENCH.block_shape == (4, 32, 128)
    assert BENCH.bytes_per_block_layer == 32 * 1024
    assert BENCH.bytes_per_block == 384 * 1024
    assert 256 * BENCH.bytes_per_block == 96 * 2**20  # an 8,192-token prompt


def test_the_geometry_bytes_are_what_a_layout_of_its_caches_moves():
    for geometry in (BENCH, BlockGeometry(3, 2, 16, 16, "float32")):
        layout = KVLayout(geometry.caches(4), 4)
        assert layout.bytes_per_block == geometry.bytes_per_block
        assert layout.blocks_adjacent and len(layout.layers) == geometry.num_layers


def test_seeded_caches_are_the_same_bytes_in_every_build_and_zeros_without_a_seed():
    first, again = SMALL.caches(3, seed=7), SMALL.caches(3, seed=7)
    assert list(first) == ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
    assert all(t.shape == (3, 2, 32, 128) and t.dtype == torch.bfloat16 for t in first.values())
    assert all(torch.equal(first[n].view(torch.int16), again[n].view(torch.int16)) for n in first)
    assert all(not t.view(torch.int16).any() for t in SMALL.caches(3).values())


@pytest.mark.parametrize("field, value", [("dtype", "int8"), ("num_layers", 0), ("block_size", -1)])
def test_a_geometry_that_cannot_hold_a_block_is_refused(field, value):
    values = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_size": 32, "dtype": "bfloat16"}
    with pytest.raises(ValueError, match=field if field != "dtype" else "int8"):
        BlockGeometry(**{**values, field: value})


# ---- summary ------------------------------------------------------------------------------------
def test_quartiles_are_samples_at_a_quarter_and_three_quarters():
    assert quartiles([4.0, 1.0, 3.0, 2.0]) == (2.0, 4.0)
    assert quartiles([5.0, 1.0, 2.0, 4.0, 3.0, 6.0, 7.0, 8.0]) == (3.0, 7.0)
    assert quartiles([0.5]) == (0.5, 0.5)
    with pytest.raises(ValueError):
        quartiles([])


def test_summarize_keeps_the_sample_order_and_computes_median_and_rate():
    samples = {(1024, "pdserve tcp"): [0.004, 0.001, 0.002], (1024, "raw socket"): [0.001, 0.003, 0.001, 0.003],
               (8192, "pdserve tcp"): [0.010]}
    rows = summarize(samples, {1024: 12_000_000, 8192: 96_000_000})
    assert rows == [Row(1024, 12_000_000, "pdserve tcp", 0.002, 6.0, [0.004, 0.001, 0.002]),
                    Row(1024, 12_000_000, "raw socket", 0.002, 6.0, [0.001, 0.003, 0.001, 0.003]),
                    Row(8192, 96_000_000, "pdserve tcp", 0.010, 9.6, [0.010])]
    assert (rows[1].p25_s, rows[1].p75_s) == (0.001, 0.003)


def test_speedup_is_the_reference_median_over_the_row_median_on_the_same_prompt():
    rows = [Row(1024, 8, "pdserve tcp", 0.004, 0.0, [0.004]), Row(1024, 8, "raw socket", 0.002, 0.0, [0.002]),
            Row(8192, 64, "raw socket", 0.001, 0.0, [0.001])]
    assert speedup(rows, rows[0], "raw socket") == 0.5
    assert speedup(rows, rows[1], "pdserve tcp") == 2.0
    assert speedup(rows, rows[0], "memcpy") is None


def test_the_table_shows_ms_spread_rates_and_dashes_for_missing_references():
    rows = [Row(1024, 12 * 2**20, "pdserve tcp", 0.004, 3.0, [0.003, 0.004, 0.005, 0.006]),
            Row(1024, 12 * 2**20, "raw socket", 0.002, 6.0, [0.002])]
    assert markdown_table(rows).splitlines() == [
        "| prompt | bytes | method | median ms | p25-p75 ms | GB/s | vs raw socket | vs raw gloo | vs memcpy |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|",
        "| 1024 | 12 MiB | pdserve tcp | 4.00 | 4.00-6.00 | 3.00 | 0.50 | - | - |",
        "| 1024 | 12 MiB | raw socket | 2.00 | 2.00-2.00 | 6.00 | 1.00 | - | - |"]


def test_the_cost_table_gives_each_pairs_median_ratio_per_prompt_length():
    rows = [Row(n, 1, method, median, 1.0, [median]) for n, scale in ((1024, 1), (8192, 8))
            for method, median in (("pdserve tcp", 0.004 * scale), ("pdserve tcp, encrypted", 0.005 * scale))]
    assert cost_table(rows, [("pdserve tcp, encrypted", "pdserve tcp"), ("not measured", "pdserve tcp")]).splitlines() == [
        "| method | reference | 1024-token median ratio | 8192-token median ratio |",
        "|---|---|---:|---:|",
        "| pdserve tcp, encrypted | pdserve tcp | 1.250 | 1.250 |",
        "| not measured | pdserve tcp | - | - |"]


# ---- the pair, for real -------------------------------------------------------------------------
def test_every_method_delivers_the_producers_exact_bytes():
    num_blocks, count = 4, 2
    nbytes = count * SMALL.bytes_per_block
    expected_cache = KVLayout(SMALL.caches(num_blocks, seed=PRODUCER_SEED), num_blocks)
    expected_raw = reference.payload(nbytes)
    with open_pair(SMALL, num_blocks, nbytes, eviction_bytes=0, cores=None) as consumer:
        consumer.grant("t", count)
        ways = consumer.methods("t", count)
        assert list(ways) == list(method_names(SMALL)) == [
            "pdserve tcp", "pdserve torch", "pdserve shm", "raw socket", "raw socket x2", "raw socket, host defaults", "raw gloo",
            "raw gloo x2", "memcpy"]
        for method, run in ways.items():
            for view in consumer.layout.views([2, 3]):
                view.zero_()
            consumer.raw_target.zero_()
            assert run() > 0, method
            if method.startswith("pdserve"):
                got, want = consumer.layout.views([2, 3]), expected_cache.views([0, 1])
                assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), method
            else:
                parts = SMALL.num_layers if method.endswith("x2") else 1
                got = reference.split(consumer.raw_target, nbytes, parts)
                assert all(torch.equal(g, w) for g, w in zip(got, reference.split(expected_raw, nbytes, parts))), method


def _our_segments() -> set[Path]:
    return set(SEGMENT_DIR.glob(f"{PREFIX}{os.getuid()}-*"))


def test_the_secured_ways_deliver_the_producers_exact_bytes_on_kept_and_new_connections():
    num_blocks, count = 4, 2
    expected = KVLayout(SMALL.caches(num_blocks, seed=PRODUCER_SEED), num_blocks).views([0, 1])
    secured = ["pdserve tcp, authenticated", "pdserve tcp, encrypted", "pdserve tcp, new connection",
               "pdserve tcp, authenticated, new connection", "pdserve tcp, encrypted, new connection"]
    assert list(method_names(SMALL, secured=True))[3:8] == secured
    with open_pair(SMALL, num_blocks, count * SMALL.bytes_per_block, eviction_bytes=0, cores=None,
                   secured=True) as consumer:
        consumer.grant("t", count)
        ways = consumer.methods("t", count)
        for method in secured * 2:
            for view in consumer.layout.views([2, 3]):
                view.zero_()
            assert ways[method]() > 0, method
            assert all(torch.equal(g, w) for g, w in zip(consumer.layout.views([2, 3]), expected, strict=True)), method


def test_pdserve_shm_copies_the_producers_exact_bytes_and_the_pair_unlinks_its_segment():
    num_blocks, count = 6, 3
    expected = KVLayout(SMALL.caches(num_blocks, seed=PRODUCER_SEED), num_blocks)
    before = _our_segments()  # other tests may hold live segments of their own
    with open_pair(SMALL, num_blocks, count * SMALL.bytes_per_block, eviction_bytes=0, cores=None) as consumer:
        consumer.grant("t", count)
        during = _our_segments() - before
        for _ in range(2):  # the second pull reuses the connection and its mapping
            for view in consumer.layout.views([3, 4, 5]):
                view.zero_()
            assert consumer.methods("t", count)["pdserve shm"]() > 0  # explicit shm: no tcp fallback
            got, want = consumer.layout.views([3, 4, 5]), expected.views([0, 1, 2])
            assert all(torch.equal(g.view(torch.uint8), w.view(torch.uint8))
                       for g, w in zip(got, want, strict=True))
    assert len(during) == 1
    assert not (during & _our_segments())


def test_a_short_measurement_has_a_row_per_prompt_and_method_and_restores_the_callers_pinning():
    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    rounds = []
    rows = measure(SMALL, [32, 100], repeats=2, methods=["pdserve tcp", "raw socket", "memcpy"],
                   eviction_bytes=1 << 20, on_round=lambda: rounds.append(1))
    assert [(r.prompt_tokens, r.num_bytes, r.method) for r in rows] == [
        (32, 1 * SMALL.bytes_per_block, "pdserve tcp"), (32, 1 * SMALL.bytes_per_block, "raw socket"),
        (32, 1 * SMALL.bytes_per_block, "memcpy"), (100, 4 * SMALL.bytes_per_block, "pdserve tcp"),
        (100, 4 * SMALL.bytes_per_block, "raw socket"), (100, 4 * SMALL.bytes_per_block, "memcpy")]
    assert all(len(r.seconds) == 2 and min(r.seconds) > 0 and r.gb_per_s > 0 for r in rows)
    assert len(rounds) == 4
    assert (os.sched_getaffinity(0), torch.get_num_threads()) == (affinity, threads)


def test_unknown_methods_are_refused_with_the_known_ones_named():
    with pytest.raises(ValueError, match="raw gloo x2"):
        measure(SMALL, [32], repeats=1, methods=["carrier pigeon"])
