import pytest
import torch

from kv_transfer.layout import KVLayout, LayoutError, coalesce


def test_coalesce_merges_consecutive_ids_in_order():
    assert coalesce([3, 4, 5, 9, 10, 2]) == [(3, 6), (9, 11), (2, 3)]
    assert coalesce([]) == []
    assert coalesce([7]) == [(7, 8)]


def _cpu_caches(num_blocks=8, layers=3):
    return {f"model.layers.{i}.attn": torch.zeros(num_blocks, 2, 32, 16, dtype=torch.bfloat16) for i in range(layers)}


def test_cpu_layout_views_alias_the_cache_in_layer_then_block_order():
    caches = _cpu_caches()
    layout = KVLayout(caches, num_blocks=8)
    views = layout.views([2, 3, 6])
    assert len(views) == 3 * 2  # 3 layers x 2 runs
    assert [v.numel() for v in views] == [2 * 2048, 2048] * 3
    views[1].fill_(7)  # layer 0, block 6
    assert caches["model.layers.0.attn"][6].view(torch.uint8).eq(7).all()
    assert caches["model.layers.0.attn"][5].view(torch.uint8).eq(0).all()
    assert layout.bytes_per_block == 3 * 2 * 32 * 16 * 2


def test_cuda_style_layout_with_k_and_v_planes_moves_both():
    caches = {"l0": torch.zeros(2, 8, 32, 2, 16, dtype=torch.float16)}
    layout = KVLayout(caches, num_blocks=8)
    views = layout.views([1, 2])
    assert len(views) == 2  # K plane run, V plane run
    views[1].fill_(1)
    assert caches["l0"][1, 1:3].view(torch.uint8).eq(1).all() and caches["l0"][0].view(torch.uint8).eq(0).all()


def test_unknown_layout_and_out_of_range_blocks_are_refused():
    with pytest.raises(LayoutError, match="no block dimension"):
        KVLayout({"l0": torch.zeros(3, 5, 7)}, num_blocks=8)
    with pytest.raises(LayoutError, match="block id 8 outside"):
        KVLayout(_cpu_caches(), num_blocks=8).views([8])


def test_compat_reports_every_mismatched_field():
    a = KVLayout(_cpu_caches(layers=3), 8).compat("tiny", 32)
    b = KVLayout(_cpu_caches(layers=4), 8).compat("bench", 32)
    diffs = a.mismatches(b)
    assert [d.split(":")[0] for d in diffs] == ["model", "num_layers", "bytes_per_block"]
    assert a.mismatches(a) == []
