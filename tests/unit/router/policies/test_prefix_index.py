"""The router's prefix index: chained block hashes, longest match in chain order, LRU per worker."""

import pytest

from router.policies.prefix_index import PrefixIndex, block_hashes

PROMPT = list(range(100, 112))   # three blocks of four tokens


def test_longest_match_counts_whole_blocks_in_chain_order():
    index = PrefixIndex(block_size=4, capacity_blocks_per_worker=100)
    index.record("d0", PROMPT)
    assert index.longest_prefix_tokens("d0", PROMPT + [7, 8, 9, 10, 11]) == 12
    assert index.longest_prefix_tokens("d0", PROMPT[:10]) == 8        # the partial last block is not counted
    assert index.longest_prefix_tokens("d0", [1, 2, 3, 4]) == 0
    assert index.longest_prefix_tokens("elsewhere", PROMPT) == 0


def test_a_salted_prompt_matches_only_blocks_recorded_under_the_same_salt():
    """vLLM folds a request's cache_salt into its first block's hash: the index does the same."""
    index = PrefixIndex(block_size=4, capacity_blocks_per_worker=100)
    index.record("d0", PROMPT, salt="tenant-a")
    assert index.longest_prefix_tokens("d0", PROMPT, salt="tenant-a") == 12
    assert index.longest_prefix_tokens("d0", PROMPT, salt="tenant-b") == 0
    assert index.match_all(PROMPT) == {}                                   # unsalted: no match either
    index.record("d1", PROMPT)
    assert index.match_all(PROMPT, salt="tenant-a") == {"d0": 12}
    assert block_hashes(PROMPT, 4, salt="") == block_hashes(PROMPT, 4)    # "" is no salt
    assert block_hashes(PROMPT, 4, salt="a")[1:] != block_hashes(PROMPT, 4)[1:]   # the whole chain moves


def test_a_partial_last_block_is_never_recorded():
    index = PrefixIndex(block_size=4, capacity_blocks_per_worker=100)
    index.record("d0", PROMPT[:10])
    assert index.blocks_of("d0") == 2
    assert index.longest_prefix_tokens("d0", PROMPT) == 8


def test_a_prompt_diverging_mid_block_matches_only_the_blocks_before():
    index = PrefixIndex(block_size=4, capacity_blocks_per_worker=100)
    index.record("d0", PROMPT)
    diverged = PROMPT[:6] + [999] + PROMPT[7:]
    assert index.longest_prefix_tokens("d0", diverged) == 4


def test_same_block_after_a_different_prefix_does_not_match():
    index = PrefixIndex(block_size=4, capacity_blocks_per_worker=100)
    index.record("d0", PROMPT)
    assert index.longest_prefix_tokens("d0", [0, 0, 0, 0] + PROMPT[4:]) == 0   # hashes chain the parent


def test_match_all_reports_every_worker_with_a_match():
    index = PrefixIndex(block_size=4, capacity_blocks_per_worker=100)
    index.record("d0", PROMPT)
    index.record("p0", PROMPT[:8])
    index.record("p1", [1, 2, 3, 4])
    assert index.match_all(PROMPT) == {"d0": 12, "p0": 8}


def test_lru_evicts_the_least_recently_recorded_or_matched_from_the_chain_tail():
    index = PrefixIndex(block_size=4, capacity_blocks_per_worker=4)
    first, second, third = PROMPT[:8], list(range(200, 208)), list(range(300, 304))
    index.record("d0", first)
    index.record("d0", second)
    assert index.longest_prefix_tokens("d0", first) == 8     # a match is a use: `first` is now the newest
    index.record("d0", third)                                # one block over: `second`'s tail block goes
    assert index.match_all(first) == {"d0": 8}
    assert index.match_all(second) == {"d0": 4}
    index.record("d0", list(range(400, 404)))                # and then its head
    assert index.match_all(second) == {}
    assert (index.match_all(first), index.match_all(third), index.blocks_of("d0")) == ({"d0": 8}, {"d0": 4}, 4)


def test_a_prompt_longer_than_the_capacity_keeps_its_head():
    index = PrefixIndex(block_size=4, capacity_blocks_per_worker=2)
    index.record("d0", PROMPT)
    assert index.blocks_of("d0") == 2
    assert index.longest_prefix_tokens("d0", PROMPT) == 8


def test_evicting_a_block_makes_its_descendants_unmatchable():
    index = PrefixIndex(block_size=4, capacity_blocks_per_worker=100)
    index.record("d0", PROMPT)
    hashes = block_hashes(PROMPT, 4)
    assert index.evict_blocks("d0", [hashes[1], "unknown"]) == 1
    assert index.longest_prefix_tokens("d0", PROMPT) == 4
    assert index.blocks_of("d0") == 2                        # the orphaned third block waits for the LRU
    assert index.evict_blocks("gone", hashes) == 0


def test_a_forgotten_worker_matches_nothing():
    index = PrefixIndex(block_size=4, capacity_blocks_per_worker=100)
    index.record("d0", PROMPT)
    index.forget_worker("d0")
    assert (index.longest_prefix_tokens("d0", PROMPT), index.match_all(PROMPT), index.blocks_of("d0")) == (0, {}, 0)


def test_an_engine_hash_function_can_be_plugged_in():
    def engine_hash(parent, tokens):
        return f"{parent}/{sum(tokens)}"

    index = PrefixIndex(block_size=4, capacity_blocks_per_worker=100, hash_block=engine_hash)
    assert block_hashes(PROMPT, 4, engine_hash) == ["None/406", "None/406/422", "None/406/422/438"]
    index.record("d0", PROMPT)
    assert index.evict_blocks("d0", ["None/406/422/438"]) == 1
    assert index.longest_prefix_tokens("d0", PROMPT) == 8


def test_an_index_needs_positive_sizes():
    with pytest.raises(ValueError, match="need block_size >= 1"):
        PrefixIndex(block_size=0, capacity_blocks_per_worker=10)


def test_a_workers_own_capacity_trims_its_lru_and_leaves_the_others():
    index = PrefixIndex(block_size=2, capacity_blocks_per_worker=100)
    index.record("w1", list(range(20)))   # 10 blocks
    index.record("w2", list(range(20)))
    index.set_capacity("w1", 4)
    assert index.blocks_of("w1") == 4 and index.blocks_of("w2") == 10
    assert index.longest_prefix_tokens("w1", list(range(20))) == 8   # the chain's head is kept
    index.forget_worker("w1")
    assert index.capacity_of("w1") == 100 and index.workers() == ["w2"]
    with pytest.raises(ValueError):
        index.set_capacity("w2", 0)
