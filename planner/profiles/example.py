"""The example profile: the `bench` model (12 layers, hidden 768, 4 KV heads) on 2 CPU cores.

It stands in for a `pdserve profile` run until one is checked in, and the tests use it. The
tables are generated from timings measured by hand on this machine, not invented:
prefill of 1,024 tokens ~0.3 s (about linear plus a small quadratic term); a decode step ~11 ms
at batch 1, ~22 ms at batch 8, ~71 ms at batch 32 (with 512 tokens of context each; context
adds a little); KV transfer over tcp ~ bytes / 2 GB/s + 1 ms; a prompt in small chunks a little slower than in one
pass (`planner.perf_model`'s chunked term). The curves through those anchors
are below; a deterministic +-2% wobble stands in for measurement noise so that fitting has
something to report. `example.json` beside this file is `build_example_profile()` written out.
"""

from __future__ import annotations

from pathlib import Path

from planner.profile import (
    DecodeSample,
    EngineSettings,
    HardwareInfo,
    ModelInfo,
    PrefillSample,
    Profile,
    TransferSample,
)
from router.policies.placement.cost import prior_units

EXAMPLE_PROFILE_PATH = Path(__file__).with_name("example.json")
PREFILL_CASES = [(n, 2048) for n in (64, 128, 256, 512, 1024, 2048)] + [(1024, 256), (2048, 512), (2048, 256)]
DECODE_BATCHES = (1, 2, 4, 8, 16, 32)
DECODE_CONTEXT_PER_SEQ = (128, 512, 1024)
TRANSFER_BYTES = (393_216, 1_572_864, 6_291_456, 25_165_824)  # 1, 4, 16, 64 blocks of 32 tokens


def _wobble(i: int) -> float:
    """A fixed pattern in [-2%, +2%] standing in for run-to-run noise."""
    return 1.0 + 0.01 * ((i * 7) % 5 - 2)


def _prefill_s(prompt_tokens: int, chunk_tokens: int) -> float:
    chunks = -(-prompt_tokens // chunk_tokens)
    # a chunk's queries over the earlier chunks cost a third more than the one-pass attention (the
    # slow Zen 4 EPYC's profile: 71 against 225 ns a unit)
    return (0.010 * chunks + 2.5e-4 * prompt_tokens + 3.5e-8 * prompt_tokens**2
            + 1.2e-8 * prior_units(prompt_tokens, chunk_tokens))


def _decode_step_s(batch_size: int, context_tokens: int) -> float:
    # through (1, 11 ms), (8, 22 ms), (32, 71 ms) at 512 context tokens per sequence
    return (9.55 + 1.307 * batch_size + 0.01517 * batch_size**2 + 0.00025 * context_tokens) / 1e3


def build_example_profile() -> Profile:
    prefill = tuple(
        PrefillSample(n, chunk, round(_prefill_s(n, chunk) * _wobble(i), 6))
        for i, (n, chunk) in enumerate(PREFILL_CASES)
    )
    cases = [(b, b * c) for b in DECODE_BATCHES for c in DECODE_CONTEXT_PER_SEQ]
    decode = tuple(
        DecodeSample(b, ctx, round(_decode_step_s(b, ctx) * _wobble(i), 6)) for i, (b, ctx) in enumerate(cases)
    )
    transfer = tuple(
        TransferSample("tcp", size, round((1e-3 + size / 2e9) * _wobble(i), 6))
        for i, size in enumerate(TRANSFER_BYTES)
    )
    return Profile(
        hardware=HardwareInfo(cpu_model="AMD EPYC", num_cores=2, device="cpu"),
        model=ModelInfo(name="bench", num_layers=12, hidden_size=768, num_attention_heads=12,
                        num_kv_heads=4, dtype="bfloat16", block_size=32),
        engine=EngineSettings(vllm_version="0.32.0", max_num_batched_tokens=2048, max_num_seqs=128,
                              kv_cache_memory_bytes=1 << 30, enforce_eager=True),
        prefill=prefill,
        decode=decode,
        kv_transfer=transfer,
        created_at="2025-11-22T00:00:00Z",
        notes="example: curves through hand-measured anchors on 2 cores (see planner/profiles/example.py)",
    )
