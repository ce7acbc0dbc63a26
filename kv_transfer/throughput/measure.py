"""Times every way of moving a prompt's KV between the pair's two processes, interleaved."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kv_transfer.geometry import BlockGeometry
from kv_transfer.throughput.pair import Consumer, method_names, open_pair
from kv_transfer.throughput.summary import Row, summarize

EVICTION_BYTES = 256 << 20  # well above any last-level cache of a host this runs on


def measure(geometry: BlockGeometry, prompt_tokens: Sequence[int], repeats: int, *,
            methods: Sequence[str] | None = None, eviction_bytes: int = EVICTION_BYTES,
            cores: tuple[int, int] | None = (0, 1), on_round: Callable[[], None] | None = None,
            unchecked: bool = False, secured: bool = False) -> list[Row]:
    """A row per prompt length and method (all of `method_names(geometry)` unless `methods` picks
    some), prompts in the order given, methods in the order they run.

    One untimed round warms connections and caches, then `repeats` timed rounds; a round moves
    each prompt once by each method, interleaved so host noise hits every method alike, and
    writes `eviction_bytes` of scratch before every transfer. `on_round` is called after each
    timed round of each prompt (`repeats * len(set(prompt_tokens))` calls). `unchecked` adds each
    pdserve transport without checksum verification, `secured` the security variants of `pdserve
    tcp` (`method_names`)."""
    chosen = _chosen_methods(geometry, methods, unchecked, secured)
    if repeats < 1 or not prompt_tokens or min(prompt_tokens) < 1:
        raise ValueError(f"need repeats >= 1 and at least one positive prompt length, "
                         f"got repeats={repeats}, prompt_tokens={list(prompt_tokens)}")
    counts = {n: -(-n // geometry.block_size) for n in prompt_tokens}  # blocks per prompt
    max_bytes = max(counts.values()) * geometry.bytes_per_block
    with open_pair(geometry, 2 * max(counts.values()), max_bytes, eviction_bytes=eviction_bytes,
                   cores=cores, unchecked=unchecked, secured=secured) as consumer:
        for tokens, count in counts.items():
            consumer.grant(_transfer_id(tokens), count)
        samples = _rounds(consumer, counts, repeats, chosen, on_round or (lambda: None))
    return summarize(samples, {tokens: count * geometry.bytes_per_block for tokens, count in counts.items()})


def _chosen_methods(geometry: BlockGeometry, methods: Sequence[str] | None, unchecked: bool,
                    secured: bool) -> tuple[str, ...]:
    known = method_names(geometry, unchecked, secured)
    if methods is None:
        return known
    unknown = [m for m in methods if m not in known]
    if unknown or not methods:
        raise ValueError(f"unknown methods {unknown}; pick one or more of {list(known)}")
    return tuple(m for m in known if m in methods)


def _rounds(consumer: Consumer, counts: dict[int, int], repeats: int, chosen: tuple[str, ...],
            on_round: Callable[[], None]) -> dict[tuple[int, str], list[float]]:
    samples: dict[tuple[int, str], list[float]] = {}
    for repeat in range(repeats + 1):  # round 0 warms up
        for tokens, count in counts.items():
            ways = consumer.methods(_transfer_id(tokens), count)
            for method in chosen:
                consumer.evict_caches()
                seconds = ways[method]()
                if repeat:
                    samples.setdefault((tokens, method), []).append(seconds)
            if repeat:
                on_round()
    return samples


def _transfer_id(prompt_tokens: int) -> str:
    return f"prompt-{prompt_tokens}"
