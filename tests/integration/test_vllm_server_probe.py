"""The profiler's probe of vLLM's own server (`planner.profiler.vllm_server_probe`) against the real
server the compatibility suite runs (tiny model, the clusters' engine settings): lone requests and
batched streams over HTTP/SSE are timed and fitted end to end.

Against an engine model that costs nothing, everything the client saw is the server's: a first
token and a step that cost more than nothing, and a spread around each; the API process's and the
client's CPU, read from /proc over steady runs, is more than nothing too. How large depends on the
host: only signs, bounds a request's timeout would catch, and the progress steps are asserted."""

from __future__ import annotations

import pytest

from planner.perf_model import DecodeCoeffs, PerfModel, PrefillCoeffs
from planner.profiler.serving_fit import serving_plan
from planner.profiler.vllm_server_probe import measure_server_at, vllm_server_steps

pytestmark = pytest.mark.integration

FREE = PerfModel(prefill=PrefillCoeffs(0.0, 0.0, 0.0), decode=DecodeCoeffs(0.0, 0.0, 0.0), transfer={})


def test_the_probe_times_vllm_s_server_and_fits_its_costs(vllm_openai_server):
    settings = vllm_openai_server.settings
    plan = serving_plan(settings.max_model_len, settings.max_num_seqs, quick=True)
    notes: list[tuple[str, bool]] = []
    costs = measure_server_at(vllm_openai_server.url, FREE, (), plan, 250,
                              lambda label, step=True: notes.append((label, step)), vllm_openai_server.pid)
    assert 0 < costs.first_token_s < 10 and costs.handoff_s == 0
    assert costs.decode_step_s + costs.decode_cpu_s_per_token > 0   # every served step costs something
    assert costs.decode_step_s < 10 and costs.decode_cpu_s_per_token < 1
    # the front end (the API process) and this client took CPU for the requests they served; the
    # front end's part is within the whole, and the host model is on over the server's cores
    assert costs.host_cores > 0 and costs.host_cpu_s_per_request + costs.host_cpu_s_per_token > 0
    assert costs.router_cpu_s_per_request + costs.router_cpu_s_per_token > 0
    assert costs.router_cpu_s_per_request <= costs.host_cpu_s_per_request < 1
    assert costs.decode_cpu_s_per_request == costs.prefill_cpu_s_per_request == 0   # no workers apart
    assert len(costs.first_token_spread_s) > 1 and len(costs.decode_step_spread_s) > 1
    assert list(costs.decode_step_spread_s) == sorted(costs.decode_step_spread_s)
    # the probe's own steps: lone lengths and batches, plus the server's start it did not make here
    assert sum(step for _, step in notes) == vllm_server_steps(settings.max_model_len, settings.max_num_seqs, True) - 1
    assert any(label.startswith("vLLM's server: decode steps at batch") for label, _ in notes)
