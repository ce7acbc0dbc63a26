"""A real `pdserve router` process with TLS and an API key file, over real sockets (no workers:
a call that gets past the key check ends in 503 / UNAVAILABLE for want of a worker, which proves it
got past). Refused calls do no work: the router's request counter (`pdserve_requests_total`, which
every handler counts into) stays where it was; only `pdserve_unauthenticated_requests_total` moves.
"""

from __future__ import annotations

import os
import re
import ssl
import subprocess
import sys
import time

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from launch.supervisor import pdserve_child
from pdserve.client import Client, NoHealthyWorker, Unauthenticated
from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc
from tests.tls_certs import make_pki

KEY = "k3y-0f-the-test-" + "0" * 16
OLD_KEY = "old-key-still-valid-during-roll"
WRONG = "wrong-key-" + "1" * 22
COMPLETION = {"prompt": "Hello", "max_tokens": 4}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def router(tmp_path_factory, tiny_model, redis_server, pki):
    """(grpc target, https URL, pid) of a router requiring TLS and one of two keys."""
    folder = tmp_path_factory.mktemp("router")
    keys = folder / "api-keys"
    keys.write_text(f"# rotated in\n{KEY}\n# rotated out after the roll\n{OLD_KEY}\n")
    keys.chmod(0o600)
    child = pdserve_child(["router", "--model", str(tiny_model), "--redis-url", redis_server.url, "--cluster",
                           "public-auth", "--grpc-port", "0", "--http-port", "0", "--drain-timeout-s", "0", "--api-key-file", str(keys),
                           "--tls-cert-file", str(pki.server_cert_file), "--tls-key-file", str(pki.server_key_file)],
                          folder, "router").start()
    try:
        grpc_target, http_url = child.wait_ready(60).split()
        yield grpc_target, http_url, child.pid
    finally:
        child.stop(timeout_s=10)


@pytest.fixture(scope="module")
def https(router, pki):
    with httpx.Client(base_url=router[1], verify=ssl.create_default_context(cafile=str(pki.ca_file)),
                      timeout=10) as client:
        yield client


@pytest.fixture(scope="module")
def roots(pki) -> bytes:
    return pki.ca_file.read_bytes()


def counted(https: httpx.Client) -> dict[str, float]:
    """pdserve_requests_total summed over its labels, and the refusals by API, from /metrics."""
    text = https.get("/metrics").text
    total = sum(float(v) for v in re.findall(r"^pdserve_requests_total\{[^}]*\} (\S+)$", text, re.M))
    refused = {api: float(v) for api, v in
               re.findall(r'^pdserve_unauthenticated_requests_total\{api="(\w+)"\} (\S+)$', text, re.M)}
    return {"requests": total, "http": refused.get("http", 0.0), "grpc": refused.get("grpc", 0.0)}


def counted_after(https: httpx.Client, name: str, expected: float, timeout_s: float = 5.0) -> float:
    """`counted(https)[name]` once it reaches `expected` (a gRPC call is counted as its handler
    returns, which may be just after the client has its status), or as it is at the deadline."""
    deadline = time.monotonic() + timeout_s
    while (value := counted(https)[name]) < expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return value


def test_the_router_serves_https_and_says_so_in_its_ready_line(router):
    assert router[1].startswith("https://127.0.0.1:")


@pytest.mark.parametrize("headers", [{}, {"Authorization": f"Bearer {WRONG}"}, {"Authorization": f"Basic {KEY}"},
                                     {"Authorization": KEY}, {"X-Api-Key": KEY}])
def test_http_without_the_right_key_is_401_before_any_work(https, headers):
    before = counted(https)
    response = https.post("/v1/completions", json=COMPLETION, headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json() == {"error": {
        "message": "a missing or wrong API key: send the header `Authorization: Bearer <key>`",
        "type": "invalid_request_error", "param": None, "code": 401}}
    assert https.get("/v1/models", headers=headers).status_code == 401
    after = counted(https)
    assert after["requests"] == before["requests"]       # no handler saw them
    assert after["http"] == before["http"] + 2


@pytest.mark.parametrize("key", [KEY, OLD_KEY])
def test_http_with_any_configured_key_gets_past_the_check(https, key):
    before = counted(https)
    auth = {"Authorization": f"Bearer {key}"}
    assert https.get("/v1/models", headers=auth).json()["data"][0]["id"] == "tiny"
    completion = https.post("/v1/completions", json=COMPLETION, headers=auth)
    assert completion.status_code == 503            # past the key: no decode worker in this cluster
    assert completion.json()["error"]["message"] == "no decode worker is alive"
    assert counted(https)["requests"] == before["requests"] + 1   # the handler counted it


def test_health_and_metrics_stay_open_for_probes(https):
    assert https.get("/health").json() == {"status": "ok", "prefill_workers": 0, "decode_workers": 0}
    assert https.get("/metrics").status_code == 200


def test_plaintext_http_to_the_tls_port_gets_nothing(router):
    plain = router[1].replace("https://", "http://")
    with pytest.raises(httpx.HTTPError):
        httpx.post(f"{plain}/v1/completions", json=COMPLETION, headers={"Authorization": f"Bearer {KEY}"}, timeout=5)


@pytest.mark.parametrize("api_key", [None, WRONG])
def test_grpc_without_the_right_key_is_unauthenticated_before_any_work(router, https, roots, api_key):
    before = counted(https)
    with Client(router[0], api_key=api_key, root_certificates=roots) as client:
        with pytest.raises(Unauthenticated, match="send the metadata `authorization: Bearer <key>`"):
            client.model_info()
        with pytest.raises(Unauthenticated):
            list(client.generate("Hello", max_tokens=4))
        with pytest.raises(Unauthenticated):
            client.abort("some-request")
    after = counted(https)
    assert after["requests"] == before["requests"]
    assert after["grpc"] == before["grpc"] + 3


def test_grpc_with_the_key_gets_past_the_check(router, https, roots):
    before = counted(https)
    with Client(router[0], api_key=KEY, root_certificates=roots) as client:
        info = client.model_info()
        assert (info.model, info.num_prefill_workers, info.num_decode_workers) == ("tiny", 0, 0)
        with pytest.raises(NoHealthyWorker, match="no decode worker is alive"):
            list(client.generate("Hello", max_tokens=4))
    assert counted_after(https, "requests", before["requests"] + 1) == before["requests"] + 1


def test_grpc_health_stays_open_without_a_key(router, roots):
    with grpc.secure_channel(router[0], grpc.ssl_channel_credentials(roots)) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_plaintext_grpc_to_the_tls_port_fails(router):
    with grpc.insecure_channel(router[0]) as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        with pytest.raises(grpc.RpcError) as failed:
            stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5,
                              metadata=(("authorization", f"Bearer {KEY}"),))
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_keys_are_not_on_the_routers_command_line(router):
    with open(f"/proc/{router[2]}/cmdline", "rb") as cmdline:
        argv = cmdline.read().decode()
    assert "--api-key-file" in argv and KEY not in argv and OLD_KEY not in argv


def test_the_router_refuses_to_listen_beyond_loopback_without_tls_and_keys(tiny_model):
    """It fails at its flags, before Redis (`--redis-url` names nothing listening: a router past the
    check would fail there, with another message)."""
    argv = [sys.executable, "-m", "cli.main", "router", "--model", str(tiny_model), "--host", "0.0.0.0",
            "--redis-url", "redis://127.0.0.1:9/0", "--grpc-port", "0", "--http-port", "0"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PDSERVE_")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode != 0
    assert "pdserve router: the public API would listen on 0.0.0.0 without TLS and API keys" in done.stderr


@pytest.fixture(scope="module")
def mtls_router(tmp_path_factory, tiny_model, redis_server, pki):
    """The grpc target and https URL of a router requiring client certificates of the test CA, no keys."""
    folder = tmp_path_factory.mktemp("mtls-router")
    child = pdserve_child(["router", "--model", str(tiny_model), "--redis-url", redis_server.url, "--cluster",
                           "public-mtls", "--grpc-port", "0", "--http-port", "0", "--drain-timeout-s", "0",
                           "--tls-cert-file", str(pki.server_cert_file), "--tls-key-file", str(pki.server_key_file),
                           "--tls-client-ca-file", str(pki.ca_file)], folder, "router").start()
    try:
        yield child.wait_ready(60).split()
    finally:
        child.stop(timeout_s=10)


def test_mtls_serves_clients_with_a_certificate_of_its_ca_only(mtls_router, pki, roots):
    grpc_target, http_url = mtls_router
    client_pem, client_key = pki.client_cert_file.read_bytes(), pki.client_key_file.read_bytes()
    with Client(grpc_target, root_certificates=roots, client_certificate=client_pem, client_key=client_key) as client:
        assert client.model_info().model == "tiny"
    with Client(grpc_target, root_certificates=roots) as client, pytest.raises(NoHealthyWorker):
        client.model_info()   # UNAVAILABLE: the handshake fails without a client certificate

    context = ssl.create_default_context(cafile=str(pki.ca_file))
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{http_url}/v1/models", verify=context, timeout=5)
    context.load_cert_chain(str(pki.client_cert_file), str(pki.client_key_file))
    assert httpx.get(f"{http_url}/v1/models", verify=context, timeout=5).status_code == 200


async def test_the_load_generators_grpc_target_sends_the_key_over_tls(router, pki):
    from loadgen.harness import make_target
    from loadgen.targets.base import TargetError

    target = make_target("pdserve", router[0], api_key=KEY, ca_file=str(pki.ca_file))
    await target.open()
    assert target.model == "tiny"
    await target.close()
    keyless = make_target("pdserve", router[0], ca_file=str(pki.ca_file))
    with pytest.raises(TargetError, match="invalid_request_error: .*API key"):
        await keyless.open()
