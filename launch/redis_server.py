"""A private `redis-server` on a free port, for `pdserve up` and the tests.

Nothing depends on a Redis the machine may or may not run: each cluster starts its own, keeps no
data on disk, and stops it on exit.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass

from pdserve.worker.config import free_port
from launch.commands import redis_argv
from launch.orphans import die_with_parent


class RedisNotFound(RuntimeError):
    pass


@dataclass
class RedisServer:
    process: subprocess.Popen
    port: int
    workdir: str

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_redis(port: int = 0, timeout_s: float = 10.0) -> RedisServer:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisNotFound("redis-server is not installed: `apt-get install redis-server` (make does this)")
    port = port or free_port("127.0.0.1")
    workdir = tempfile.mkdtemp(prefix="pdserve-redis-")
    process = subprocess.Popen(
        redis_argv(binary, "127.0.0.1", port, workdir),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent(),
    )
    server = RedisServer(process, port, workdir)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited with code {process.returncode} (port {port} taken?)")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return server
        except OSError:
            time.sleep(0.05)
    server.stop()
    raise TimeoutError(f"redis-server did not listen on port {port} within {timeout_s}s")
