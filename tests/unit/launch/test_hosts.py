"""Where a cluster's processes run (`launch.commands.Host`): the flags that bind them to a host's
address, the command prefix that runs them there, and a real Redis started through a prefix.
The same hooks put each process in a network namespace in tests/integration/test_hosts_apart.py."""

from __future__ import annotations

import sys

import redis

from launch.commands import Host, pdserve_argv
from launch.redis_server import start_redis
from launch.supervisor import pdserve_child


def test_the_default_host_is_this_hosts_loopback_with_no_prefix():
    assert Host() == Host("127.0.0.1", ())


def test_a_worker_listens_on_and_advertises_its_hosts_address_a_router_only_listens():
    host = Host("10.213.4.3", ("ip", "netns", "exec", "h1"))
    assert host.listen_argv(advertise=True) == ["--host", "10.213.4.3", "--advertise-host", "10.213.4.3"]
    assert host.listen_argv(advertise=False) == ["--host", "10.213.4.3"]


def test_a_pdserve_child_runs_through_its_command_prefix(tmp_path):
    child = pdserve_child(["worker", "--role", "decode"], tmp_path, "w0", command_prefix=("ip", "netns", "exec", "h1"))
    ready = str(tmp_path / "w0.ready")
    assert child.argv == ["ip", "netns", "exec", "h1", *pdserve_argv(["worker", "--role", "decode", "--ready-file", ready])]
    assert pdserve_child(["router"], tmp_path, "r").argv[0] == sys.executable   # no prefix: run here


def test_redis_started_through_a_prefix_serves_at_its_hosts_address():
    server = start_redis(host=Host("127.0.0.1", ("env", "PDSERVE_PLACED=1")))   # `env` execs, as `ip netns exec` does
    try:
        assert server.process.argv[:2] == ["env", "PDSERVE_PLACED=1"]
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        with redis.Redis.from_url(server.client_url) as client:
            assert client.ping() is True
    finally:
        server.stop()
