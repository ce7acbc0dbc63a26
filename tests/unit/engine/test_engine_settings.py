"""EngineSettings -> vLLM engine arguments: what reaches vLLM, and what is refused before it starts."""

import pytest

from kv_transfer.config import ConnectorConfig
from pdserve.engine import EngineSettings, engine_args


def test_a_colocated_engine_may_span_several_gpus():
    args = engine_args(EngineSettings(model="m", tensor_parallel_size=2), "colocated")
    assert args.tensor_parallel_size == 2 and args.kv_transfer_config is None


def test_a_disaggregated_worker_spanning_several_gpus_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="moves one rank's KV cache"):
        engine_args(EngineSettings(model="m", tensor_parallel_size=2), "decode", ConnectorConfig())


def test_nonsense_settings_are_refused():
    with pytest.raises(ValueError, match="tensor_parallel_size 0"):
        EngineSettings(model="m", tensor_parallel_size=0)
    with pytest.raises(ValueError, match="multiple of 32"):
        EngineSettings(model="m", block_size=16)
