"""pdserve's vLLM plugin counts logprob ranks without a compile on CPU (`pdserve.vllm_plugin`,
"Logprob ranks"): vLLM's own sampler, given the plugin's count, returns the ranks vLLM's function
returns, and the first request that asks for logprobs compiles nothing."""

from __future__ import annotations

import pytest
import torch

from pdserve import vllm_plugin


@pytest.fixture
def sampler_module(monkeypatch):
    from vllm.v1.sample import sampler

    # whatever the sampler holds now (vLLM's compiled count, or the plugin's when an earlier test or
    # import registered it) is put back after the test
    monkeypatch.setattr(sampler, "batched_count_greater_than", sampler.batched_count_greater_than)
    return sampler


def vllms_count(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """vLLM's `batched_count_greater_than` as written, without its compile wrapper."""
    from vllm.v1.sample.ops.logprobs import batched_count_greater_than

    return batched_count_greater_than._torchdynamo_orig_callable(x, values)


def test_the_count_is_vllms_on_ties_and_every_batch_size():
    generator = torch.Generator().manual_seed(3)
    for batch in (1, 2, 7):
        x = torch.randint(-4, 4, (batch, 300), generator=generator).float()   # many ties
        values = x[:, 5:6]
        ours = vllm_plugin.count_greater_or_equal(x, values)
        assert ours.dtype == torch.int64 and ours.shape == (batch,)
        assert torch.equal(ours, vllms_count(x, values))
        assert torch.equal(ours, torch.tensor([int((row >= row[5]).sum()) for row in x]))


def test_vllms_sampler_gathers_its_ranks_with_the_plugins_count_and_compiles_nothing(sampler_module):
    from torch._dynamo.utils import counters

    assert vllm_plugin.count_logprob_ranks_eagerly_on_cpu()   # this host's vLLM platform is the CPU's
    assert sampler_module.batched_count_greater_than is vllm_plugin.count_greater_or_equal
    torch._dynamo.reset()
    counters.clear()
    logprobs = torch.log_softmax(torch.randn(3, 2048, generator=torch.Generator().manual_seed(5)), dim=-1)
    token_ids = torch.tensor([7, 100, 2047])
    gathered = sampler_module.Sampler.gather_logprobs(logprobs, 2, token_ids)
    expected = (logprobs >= logprobs.gather(-1, token_ids.unsqueeze(-1))).sum(-1)
    assert torch.equal(gathered.selected_token_ranks, expected)
    assert gathered.logprob_token_ids[:, 0].tolist() == token_ids.tolist()
    assert counters["stats"]["calls_captured"] == 0 and counters["stats"]["unique_graphs"] == 0, dict(counters["stats"])
