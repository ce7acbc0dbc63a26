"""The vLLM baseline server's command line follows the EngineSettings a pdserve worker would use."""

import sys

from loadgen.vllm_server import free_port, server_argv
from pdserve.engine import EngineSettings, native_dtype


def test_server_argv_carries_every_engine_setting():
    settings = EngineSettings(model="m", max_model_len=4096, kv_cache_bytes=512 << 20, max_num_seqs=8,
                              max_num_batched_tokens=1024, enable_prefix_caching=False, seed=7)
    argv = server_argv(settings, 8123)
    assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    pairs = dict(zip(argv[3::], argv[4::]))
    assert {k: pairs[k] for k in ("--model", "--port", "--dtype", "--block-size", "--max-model-len",
                                  "--kv-cache-memory-bytes", "--max-num-seqs", "--seed", "--max-num-batched-tokens")} == {
        "--model": "m", "--port": "8123", "--dtype": native_dtype(), "--block-size": "32", "--max-model-len": "4096",
        "--kv-cache-memory-bytes": str(512 << 20), "--max-num-seqs": "8", "--seed": "7", "--max-num-batched-tokens": "1024"}
    assert "--enforce-eager" in argv and "--no-enable-prefix-caching" in argv
    assert "--no-enable-prefix-caching" not in server_argv(EngineSettings(model="m"), 1)
    assert "--served-model-name" not in argv
    named = server_argv(settings, 8123, served_model_name="tiny")
    assert named[named.index("--served-model-name") + 1] == "tiny"


def test_free_port_is_a_usable_port_number():
    assert 1024 <= free_port() <= 65535
