"""The cluster's Redis requires a password: a real redis-server started as `LocalCluster` starts
it, clients with and without the password, the worker's registration path, and how the password
reaches processes (files named on command lines, never the password itself)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from cli.main import build_parser
from cli.commands.credential_options import redis_connection_url
from launch.commands import ClusterSpec, worker_argv
from launch.credentials import ClusterCredentials, write_member_files
from launch.redis_server import start_redis
from pdserve.engine import EngineSettings
from pdserve.keys import worker_key
from pdserve.redis_auth import (RedisPasswordError, connection_url, create_password_file, load_password, redacted,
                                url_with_password)
from pdserve.registry import Registry, WorkerRecord

SPEC = ClusterSpec(engine=EngineSettings(model="m", dtype="float32"))


@pytest.fixture(scope="module")
def locked_redis(tmp_path_factory):
    """A redis-server requiring the password in its 0600 file, as `LocalCluster` starts it."""
    password_file = create_password_file(tmp_path_factory.mktemp("cluster") / "redis-password")
    server = start_redis(password_file=password_file)
    yield server
    server.stop()


def test_a_client_without_the_password_or_with_a_wrong_one_is_refused(locked_redis):
    with redis.Redis.from_url(locked_redis.url) as anonymous:
        with pytest.raises(redis.AuthenticationError):
            anonymous.hset(worker_key("default", "intruder"), mapping={"grpc_address": "10.6.6.6:1"})
    with redis.Redis.from_url(url_with_password(locked_redis.url, "not-the-password")) as wrong:
        with pytest.raises(redis.AuthenticationError):
            wrong.ping()
    with redis.Redis.from_url(locked_redis.client_url) as member:
        assert member.ping() is True
        assert member.exists(worker_key("default", "intruder")) == 0


async def test_a_worker_registers_only_with_the_clusters_password_file(locked_redis):
    """The registration path of `pdserve worker`: its flags, the URL its entry point connects with,
    and the registry's heartbeat."""
    common = ["worker", "--role", "decode", "--redis-url", locked_redis.url, "--model", "m"]
    with_file = build_parser().parse_args([*common, "--redis-password-file", str(locked_redis.password_file)])
    without = build_parser().parse_args(common)
    record = WorkerRecord("decode-9", "decode", "m", "127.0.0.1:50061")

    refused = Registry(redis_connection_url(without, "worker"), "pw-test")
    with pytest.raises(redis.AuthenticationError):
        await refused.heartbeat(record, ttl_s=5)
    await refused.close()
    registry = Registry(redis_connection_url(with_file, "worker"), "pw-test")
    try:
        await registry.heartbeat(record, ttl_s=5)
        assert [r.worker_id for r in await registry.workers()] == ["decode-9"]
    finally:
        await registry.deregister("decode-9")
        await registry.close()


async def test_the_password_is_on_no_command_line_and_its_files_are_private(locked_redis):
    password = load_password(locked_redis.password_file)
    cmdline = Path(f"/proc/{locked_redis.process.pid}/cmdline").read_bytes().decode(errors="replace")
    assert "redis-server" in cmdline and password not in cmdline   # what `ps` shows (redis retitles itself)
    argv = locked_redis.process.argv                               # what it was started with
    assert str(Path(locked_redis.workdir) / "redis.conf") in argv and not any(password in arg for arg in argv)
    for path in (locked_redis.password_file, Path(locked_redis.workdir) / "redis.conf"):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(locked_redis.workdir).st_mode) == 0o700
    client = aioredis.from_url(locked_redis.client_url)
    try:
        assert await client.config_get("protected-mode") == {"protected-mode": "yes"}
    finally:
        await client.aclose()


def test_a_url_gets_the_password_quoted_and_prints_without_it():
    url = url_with_password("redis://10.0.0.5:6379/0", "p@ss:w/rd")
    assert url == "redis://:p%40ss%3Aw%2Frd@10.0.0.5:6379/0"
    assert redis.connection.parse_url(url)["password"] == "p@ss:w/rd"
    assert redacted(url) == "redis://:***@10.0.0.5:6379/0"
    assert url_with_password("rediss://app@h:1/0", "x") == "rediss://app:x@h:1/0"
    assert url_with_password("redis://h:1/0", None) == "redis://h:1/0"
    with pytest.raises(RedisPasswordError, match="keep the password in the file only"):
        url_with_password("redis://:old@h:1/0", "new")
    with pytest.raises(RedisPasswordError, match="redis:// and rediss://"):
        url_with_password("unix:///run/redis.sock", "x")


def test_a_password_file_must_hold_one_line(tmp_path):
    assert connection_url("redis://h:1/0", "") == "redis://h:1/0"
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "two-lines").write_text("a\nb\n")
    for name in ("empty", "two-lines", "missing"):
        with pytest.raises(RedisPasswordError, match=f"{tmp_path / name}"):
            load_password(tmp_path / name)


def test_command_lines_name_the_credential_files_and_refuse_a_url_holding_a_password():
    router = SPEC.router_argv("redis://127.0.0.1:7/0", "/run/c/cluster-secret", "/run/c/redis-password")
    worker = SPEC.worker_argv("decode", "decode-0", "redis://127.0.0.1:7/0", "", "/run/c/cluster-secret",
                              "/run/c/redis-password")
    for argv in (router, worker):
        assert argv[argv.index("--cluster-secret-file") + 1] == "/run/c/cluster-secret"
        assert argv[argv.index("--redis-password-file") + 1] == "/run/c/redis-password"
    assert "--redis-password-file" not in SPEC.router_argv("redis://127.0.0.1:7/0")
    with pytest.raises(ValueError, match="must not hold a password"):
        worker_argv(role="decode", worker_id="d", redis_url="redis://:secret@h:1/0", cluster="c", transport="tcp",
                    cpu_cores="", lease_s=1.0, ttl_s=3.0, engine=SPEC.engine)
    with pytest.raises(ValueError, match="must not hold a password"):
        SPEC.router_argv("redis://:secret@h:1/0")


@pytest.mark.parametrize("command", [["worker", "--role", "decode", "--model", "m"], ["router", "--model", "m"],
                                     ["planner"]])
def test_every_entry_point_takes_the_files_from_the_environment(monkeypatch, command):
    monkeypatch.setenv("PDSERVE_REDIS_PASSWORD_FILE", "/run/secrets/redis-password")
    monkeypatch.setenv("PDSERVE_CLUSTER_SECRET_FILE", "/run/secrets/cluster-secret")
    args = build_parser().parse_args([*command, "--redis-url", "redis://h:1/0"])
    assert args.redis_password_file == "/run/secrets/redis-password"
    assert args.cluster_secret_file == "/run/secrets/cluster-secret"


def test_a_ray_member_writes_its_credentials_to_private_files_and_names_them(tmp_path):
    credentials = ClusterCredentials.generate()
    flags = write_member_files(credentials, tmp_path, "decode-3")

    assert flags == ["--cluster-secret-file", str(tmp_path / ".decode-3.cluster-secret"),
                     "--redis-password-file", str(tmp_path / ".decode-3.redis-password")]
    assert (tmp_path / ".decode-3.cluster-secret").read_text() == credentials.cluster_secret + "\n"
    assert load_password(tmp_path / ".decode-3.redis-password") == credentials.redis_password
    assert {stat.S_IMODE(os.stat(tmp_path / name).st_mode) for name in os.listdir(tmp_path)} == {0o600}
    assert credentials.cluster_secret not in repr(credentials) and credentials.redis_password not in repr(credentials)
    assert write_member_files(ClusterCredentials.generate(redis_password=""), tmp_path, "router")[::2] == \
        ["--cluster-secret-file"]


def test_a_ray_cluster_carries_its_credentials_as_values_hidden_from_repr():
    from launch.ray.spec import Launch, RayClusterSpec

    spec = RayClusterSpec(SPEC, redis_url="redis://10.0.0.5:6379/0", redis_password="their-password")
    credentials = ClusterCredentials.generate()
    launch = Launch("decode-1", "decode", ("worker",), credentials=credentials)
    assert "their-password" not in repr(spec)
    assert credentials.cluster_secret not in repr(launch) and credentials.redis_password not in repr(launch)
    with pytest.raises(ValueError, match="a Redis password is for the Redis of --redis-url"):
        RayClusterSpec(SPEC, redis_password="their-password")
    with pytest.raises(ValueError, match="at least 16 bytes"):
        ClusterCredentials("short")
