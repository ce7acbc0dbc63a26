"""vLLM's own OpenAI-compatible server as a child process: the colocated baseline benchmarks and
tests measure pdserve against.

The server runs the same `pdserve.engine.EngineSettings` a pdserve worker would (model, dtype,
block size, context, KV cache bytes, batch limit, prefix caching, seed), so a comparison differs
only in how the engines are arranged. `settings.cpu_cores` binds its threads
(`VLLM_CPU_OMP_THREADS_BIND`, e.g. "0-1" for both cores). Without it vLLM binds "auto": on x86 it
keeps one CPU for its front end and binds its worker to the rest. On two vCPUs that is one each,
and the engine core's polling of its worker (vLLM's default multiprocessing executor) shares the
front end's CPU with the API process: measured on a 2-vCPU EPYC, 16 streams at once arrive one
request after another, each whole in a burst (every request's 64 tokens within 1-2 ms, 100 ms
apart), where bound to both cores they decode together.

Contract: `start()` returns once `GET /health` answers 200 (or raises with the log's tail when
the process dies or the timeout passes, leaving nothing running); `stop()` ends the whole
process group (SIGTERM, then SIGKILL) and is safe to call twice.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from pdserve.engine import EngineSettings


def free_port() -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_argv(settings: EngineSettings, port: int, served_model_name: str | None = None,
                extra_args: tuple[str, ...] = ()) -> list[str]:
    """The `python -m vllm.entrypoints.openai.api_server ...` command line for `settings`; served
    as `served_model_name` when given (vLLM's default name is `settings.model` as given, a path,
    where pdserve's router serves the path's last part); `extra_args`, more of vLLM's server flags."""
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", settings.model,
            "--host", "127.0.0.1", "--port", str(port), "--dtype", settings.dtype,
            "--block-size", str(settings.block_size), "--max-model-len", str(settings.max_model_len),
            "--kv-cache-memory-bytes", str(settings.kv_cache_bytes), "--max-num-seqs", str(settings.max_num_seqs),
            "--seed", str(settings.seed), "--enforce-eager", "--disable-log-stats",
            "--disable-uvicorn-access-log"]
    if settings.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(settings.max_num_batched_tokens)]
    if served_model_name is not None:
        argv += ["--served-model-name", served_model_name]
    return argv + ([] if settings.enable_prefix_caching else ["--no-enable-prefix-caching"]) + list(extra_args)


class VllmOpenAIServer:
    """`with VllmOpenAIServer(settings) as server: ... server.url` (http://127.0.0.1:PORT)."""

    def __init__(self, settings: EngineSettings, port: int = 0, log_path: Path | None = None,
                 served_model_name: str | None = None, extra_args: tuple[str, ...] = ()) -> None:
        self.settings = settings
        self.served_model_name = served_model_name
        self.extra_args = tuple(extra_args)
        self.port = port or free_port()
        self.log_path = log_path or Path(tempfile.mkdtemp(prefix="vllm-server-")) / "server.log"
        self._process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The API process's pid (its engine core is a child of it); only while started."""
        if self._process is None:
            raise RuntimeError("the server is not started")
        return self._process.pid

    def start(self, timeout_s: float = 300.0) -> "VllmOpenAIServer":
        env = os.environ | {"VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
                            "PYTHONUNBUFFERED": "1"}
        if self.settings.cpu_cores:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.settings.cpu_cores
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(server_argv(self.settings, self.port, self.served_model_name, self.extra_args), stdout=log,
                                             stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            self._wait_healthy(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"vLLM's server exited with {self._process.returncode}; log "
                                   f"{self.log_path}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass  # not listening yet
            time.sleep(0.5)
        raise TimeoutError(f"vLLM's server not healthy within {timeout_s:g} s; log {self.log_path}:\n"
                           f"{self.log_tail()}")

    def stop(self, timeout_s: float = 30.0) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        _signal_group(process.pid, signal.SIGTERM)  # the group: the API server and its engine core
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def __enter__(self) -> "VllmOpenAIServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass  # the whole group has already exited
