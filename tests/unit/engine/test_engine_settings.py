"""EngineSettings -> vLLM engine arguments: what reaches vLLM, and what is refused before it starts."""

import os

import pytest

from kv_transfer.config import ConnectorConfig
from pdserve.engine import EngineSettings, engine_args, native_dtype, resolved_executor
from pdserve.engine_process import executor_env


@pytest.fixture(autouse=True)
def _own_environment():
    """engine_args sets what vLLM's child processes inherit in os.environ: keep it to each test."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


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
    with pytest.raises(ValueError, match="'x' is not a core"):
        EngineSettings(model="m", cpu_cores="0,x")
    with pytest.raises(ValueError, match="max_num_batched_tokens 32: vLLM needs at least max_num_seqs"):
        EngineSettings(model="m", max_num_seqs=64, max_num_batched_tokens=32)


def test_the_step_token_budget_reaches_vllm_and_a_child_workers_command_line():
    from launch.commands import engine_option_argv

    settings = EngineSettings(model="m", max_num_batched_tokens=512)
    assert engine_args(settings, "colocated").max_num_batched_tokens == 512
    argv = engine_option_argv(settings)
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "512"
    assert "--max-num-batched-tokens" not in engine_option_argv(EngineSettings(model="m"))   # vLLM's own


def test_the_spin_cap_and_the_core_binding_reach_vllms_child_processes_through_the_environment(monkeypatch):
    monkeypatch.delenv("PDSERVE_VLLM_SPIN_S", raising=False)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    engine_args(EngineSettings(model="m", cpu_cores="1", vllm_spin_ms=50), "colocated")
    assert os.environ["PDSERVE_VLLM_SPIN_S"] == "0.05" and os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "1"


def test_a_negative_spin_cap_leaves_vllm_as_it_is(monkeypatch):
    monkeypatch.delenv("PDSERVE_VLLM_SPIN_S", raising=False)
    engine_args(EngineSettings(model="m", vllm_spin_ms=-1), "colocated")
    assert "PDSERVE_VLLM_SPIN_S" not in os.environ


AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse2 avx fma f16c avx2\n"
SAPPHIRE_RAPIDS = "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
GRAVITON3 = "Features\t: fp asimd sve bf16 i8mm\n"


def test_auto_dtype_is_bf16_only_where_the_cpu_computes_it(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert native_dtype(AVX2_ONLY) == "float32"  # bf16 emulated there: 13-67x float32's matmul time
    assert native_dtype(SAPPHIRE_RAPIDS) == "bfloat16"
    assert native_dtype(GRAVITON3) == "bfloat16"
    assert native_dtype("") == "bfloat16"  # nothing known: vLLM's own default


def test_auto_dtype_is_resolved_when_the_settings_are_made_so_workers_get_a_concrete_one():
    settings = EngineSettings(model="m")
    assert settings.dtype == native_dtype() and settings.dtype != "auto"
    assert EngineSettings(model="m", dtype="float16").dtype == "float16"  # an explicit dtype is kept
    from launch.commands import engine_option_argv
    argv = engine_option_argv(settings)
    assert argv[argv.index("--dtype") + 1] == settings.dtype


def test_the_model_runs_in_the_engine_core_process_on_cpu_and_where_vllm_puts_it_otherwise():
    assert resolved_executor(EngineSettings(model="m"), gpu=False) == "uni"     # auto: CPU, one device
    assert resolved_executor(EngineSettings(model="m", tensor_parallel_size=2), gpu=False) == "mp"
    assert resolved_executor(EngineSettings(model="m"), gpu=True) == "mp"       # vLLM's own choice
    assert resolved_executor(EngineSettings(model="m", executor="mp"), gpu=False) == "mp"
    assert resolved_executor(EngineSettings(model="m", executor="uni"), gpu=True) == "uni"
    with pytest.raises(ValueError, match="executor 'ray'"):
        EngineSettings(model="m", executor="ray")
    with pytest.raises(ValueError, match="one device's model"):
        EngineSettings(model="m", executor="uni", tensor_parallel_size=2)


def test_the_in_process_model_gets_the_openmp_binding_vllm_gives_its_model_runner():
    assert executor_env("uni", "0-1") == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_PLACES": "{0,1}",
                                          "OMP_PROC_BIND": "true"}
    assert executor_env("uni", "") == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert executor_env("mp", "1") == {}


def test_the_executor_reaches_vllm_and_does_not_leak_into_the_next_engine(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    args = engine_args(EngineSettings(model="m", cpu_cores="1", executor="uni"), "colocated")
    assert args.distributed_executor_backend == "uni"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and os.environ["OMP_PLACES"] == "{1}"
    args = engine_args(EngineSettings(model="m", executor="mp"), "colocated")
    assert args.distributed_executor_backend is None
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ and "OMP_PLACES" not in os.environ
    assert engine_args(EngineSettings(model="m"), "colocated").distributed_executor_backend == "uni"  # CPU default
    from launch.commands import engine_option_argv
    argv = engine_option_argv(EngineSettings(model="m", executor="mp"))
    assert argv[argv.index("--vllm-executor") + 1] == "mp"
