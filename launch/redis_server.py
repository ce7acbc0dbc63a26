"""A private `redis-server` on a free port, for `pdserve up` and the tests.

Nothing depends on a Redis the machine may or may not run: each cluster starts its own, keeps no
data on disk, and stops it on exit. It is a `launch.supervisor.ChildProcess`, so it also stops
when the process that started it dies, even by SIGKILL.

With a `password_file` (what `LocalCluster` always gives) it requires that password: it is read
from the file into a 0600 `redis.conf` in the server's private (0700) working folder, which
redis-server reads at start, so the password never appears on its command line. `url` is what may
go on other processes' command lines (no password; they get the file); `client_url` is for this
process's own connections.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from launch.commands import Host, redis_argv
from launch.credentials import write_redis_config
from launch.supervisor import ChildProcess, tcp_probe
from pdserve.redis_auth import load_password, url_with_password
from pdserve.worker.config import free_port


class RedisNotFound(RuntimeError):
    pass


@dataclass
class RedisServer:
    process: ChildProcess
    port: int
    workdir: str
    password_file: Path | None = None   # None: no password (tests of their own Redis)
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        """Where it listens, without the password: safe to print and to pass on command lines."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def client_url(self) -> str:
        """`url` with the password in it, for this process's connections only."""
        return url_with_password(self.url, load_password(self.password_file) if self.password_file else None)

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, SIGKILL after `timeout_s`; then its working folder (and log) is removed."""
        self.process.stop(timeout_s)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_redis(port: int = 0, timeout_s: float = 10.0, password_file: Path | None = None,
                host: Host = Host()) -> RedisServer:
    """A running redis-server on `host` (default 127.0.0.1) at `port` (0: one free on this host's
    loopback), accepting connections, requiring the password in `password_file` if given;
    ChildExited (with its log, e.g. the port was taken) or TimeoutError otherwise."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisNotFound("redis-server is not installed: `apt-get install redis-server` (make does this)")
    port = port or free_port("127.0.0.1")   # elsewhere (a namespace), a guess that rarely misses
    workdir = tempfile.mkdtemp(prefix="pdserve-redis-")   # 0700
    url = f"redis://{host.address}:{port}/0"
    config = write_redis_config(Path(workdir), load_password(password_file)) if password_file else ""
    process = ChildProcess([*host.command_prefix, *redis_argv(binary, host.address, port, workdir, config_file=config)],
                           Path(workdir) / "redis-server.log", tcp_probe(host.address, port, url))
    server = RedisServer(process, port, workdir, Path(password_file) if password_file else None, host.address)
    try:
        process.start().wait_ready(timeout_s)
    except BaseException:
        server.stop()
        raise
    return server
