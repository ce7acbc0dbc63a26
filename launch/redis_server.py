"""A private `redis-server` on a free port, for `pdserve up` and the tests.

Nothing depends on a Redis the machine may or may not run: each cluster starts its own, keeps no
data on disk, and stops it on exit. It is a `launch.supervisor.ChildProcess`, so it also stops
when the process that started it dies, even by SIGKILL.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from launch.commands import redis_argv
from launch.supervisor import ChildProcess, tcp_probe
from pdserve.worker.config import free_port


class RedisNotFound(RuntimeError):
    pass


@dataclass
class RedisServer:
    process: ChildProcess
    port: int
    workdir: str

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, SIGKILL after `timeout_s`; then its working folder (and log) is removed."""
        self.process.stop(timeout_s)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_redis(port: int = 0, timeout_s: float = 10.0) -> RedisServer:
    """A running redis-server on 127.0.0.1:`port` (0: a free one), accepting connections;
    ChildExited (with its log, e.g. the port was taken) or TimeoutError otherwise."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisNotFound("redis-server is not installed: `apt-get install redis-server` (make does this)")
    port = port or free_port("127.0.0.1")
    workdir = tempfile.mkdtemp(prefix="pdserve-redis-")
    url = f"redis://127.0.0.1:{port}/0"
    process = ChildProcess(redis_argv(binary, "127.0.0.1", port, workdir), Path(workdir) / "redis-server.log",
                           tcp_probe("127.0.0.1", port, url))
    server = RedisServer(process, port, workdir)
    try:
        process.start().wait_ready(timeout_s)
    except BaseException:
        server.stop()
        raise
    return server
