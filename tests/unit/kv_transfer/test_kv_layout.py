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


def test_compat_reports_every_mismatched_field_but_the_display_name():
    a = KVLayout(_cpu_caches(layers=3), 8).compat("tiny", 32, fingerprint="sha256:aa", num_kv_heads=2, head_dim=8)
    b = KVLayout(_cpu_caches(layers=4), 8).compat("other-name", 32, fingerprint="sha256:aa", num_kv_heads=2,
                                                   head_dim=8)
    assert a.mismatches(b) == ["num_layers: 3 at the producer vs 4 at the consumer",
                               "bytes_per_block: 6144 at the producer vs 8192 at the consumer"]
    assert a.mismatches(a) == []
    assert a.mismatches({}, "producer", "consumer")[0] == "model_fingerprint: 'sha256:aa' at the producer vs " \
                                                          "'<not sent>' at the consumer"


def test_blocks_that_are_not_adjacent_in_memory_move_one_block_per_view_and_alias_the_cache():
    """Layers interleaved per block (every other block-sized slot of one buffer is another layer):
    two consecutive block ids are not one piece of memory, so a run must not be flattened (that
    would copy, and writes into the copy would never reach the cache)."""
    buffer = torch.zeros(8, 2, 2, 32, 16, dtype=torch.bfloat16)
    caches = {"l0": buffer[:, 0], "l1": buffer[:, 1]}
    layout = KVLayout(caches, num_blocks=8)
    assert layout.blocks_adjacent is False
    assert layout.compat("m", 32).layout == "blocks-first/1-plane/strided"
    views = layout.views([2, 3])
    assert [v.numel() for v in views] == [2048] * 4  # 2 layers x 2 single blocks, no run of 2
    for view in views:
        view.fill_(9)
    assert buffer[2:4].view(torch.uint8).eq(9).all()
    assert buffer[[0, 1, 4, 5, 6, 7]].view(torch.uint8).eq(0).all()
    assert [len(b) for b in layout.buffers([2, 3])] == [2048] * 4


def test_byte_buffers_are_the_same_ranges_as_the_tensor_views():
    caches = _cpu_caches()
    layout = KVLayout(caches, num_blocks=8)
    assert layout.compat("m", 32).layout == "blocks-first/1-plane/adjacent"
    buffers = layout.buffers([5, 6, 1], paired_with=[0, 1, 2])
    views = layout.views([5, 6, 1], paired_with=[0, 1, 2])
    assert [len(b) for b in buffers] == [v.numel() for v in views] == [2 * 2048, 2048] * 3
    buffers[1][:] = bytes([3]) * 2048  # layer 0, block 1
    assert caches["model.layers.0.attn"][1].view(torch.uint8).eq(3).all()
    assert views[1].eq(3).all()


def test_paired_runs_give_both_starts_and_cut_where_either_side_breaks():
    from kv_transfer.layout import paired_runs

    assert paired_runs([1, 2, 3], [7, 8, 20]) == [(1, 7, 2), (3, 20, 1)]
    assert paired_runs([5, 6, 7, 20], [1, 2, 9, 10]) == [(5, 1, 2), (7, 9, 1), (20, 10, 1)]
    assert paired_runs([], []) == []
    with pytest.raises(LayoutError):
        paired_runs([1, 2], [3])
