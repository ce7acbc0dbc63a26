"""The prompt-loss probe's streams on a real cluster (`planner.profiler.prompt_loss_probe.
probes_beside_streams`): streams the cluster refuses end the probe at once with the cluster's own
error, which the profile reports and goes on without rows (`serving_probe.measured_prompt_loss`),
rather than waiting `STREAMS_START_S` for streams that will never decode."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from pdserve.errors import InvalidRequest
from planner.profiler.prompt_loss_probe import PROBE_PAUSE_S, STREAMS_START_S, probes_beside_streams

pytestmark = pytest.mark.integration


def test_streams_the_cluster_refuses_end_the_probe_with_its_error(tcp_cluster, tiny_model):
    vocab_size = json.loads((tiny_model / "config.json").read_text())["vocab_size"]
    started = time.monotonic()
    # ids drawn up to 100x the vocabulary: the router refuses both streams' prompts as invalid
    with pytest.raises(InvalidRequest, match="outside the vocabulary"):
        asyncio.run(probes_beside_streams(tcp_cluster.grpc_target, batch=2, lengths=(32,), repeats=1,
                                          vocab_size=100 * vocab_size, output_tokens=64, seed=0))
    assert time.monotonic() - started < STREAMS_START_S / 4


def test_streams_that_decode_let_the_probes_run_and_return_their_window(tcp_cluster, tiny_model):
    vocab_size = json.loads((tiny_model / "config.json").read_text())["vocab_size"]
    before = time.monotonic()
    start_s, end_s = asyncio.run(probes_beside_streams(tcp_cluster.grpc_target, batch=2, lengths=(32, 64),
                                                       repeats=1, vocab_size=vocab_size, output_tokens=400, seed=1))
    assert before < start_s < end_s < time.monotonic()
    assert end_s - start_s >= 2 * PROBE_PAUSE_S   # each probe waits that long before it is sent
