"""The public API flags of `pdserve up` (local and --ray): refused setups stop before anything starts,
the router gets paths (never keys), and `pdserve up` says how to connect without printing a key."""

from __future__ import annotations

import os

import pytest

from cli.commands.public_api_options import check_ray_exposure, how_to_connect, public_api_argv
from cli.commands.ray_options import ray_cluster_spec
from cli.main import build_parser
from tests.tls_certs import make_pki

KEY = "0123456789abcdef0123456789abcdef"


@pytest.fixture(autouse=True)
def no_pdserve_environment(monkeypatch):
    for name in [n for n in os.environ if n.startswith("PDSERVE_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def files(tmp_path):
    keys = tmp_path / "api-keys"
    keys.write_text(f"# current\n{KEY}\n")
    return make_pki(tmp_path), keys


def parse(*argv: str):
    return build_parser().parse_args(["up", "--model", "/models/tiny", *argv])


def test_up_beyond_loopback_without_tls_and_keys_is_refused_before_anything_starts(capsys):
    from cli.commands.up import run

    assert run(parse("--host", "0.0.0.0")) == 2
    out = capsys.readouterr().out
    assert "pdserve up: the public API would listen on 0.0.0.0 without TLS and API keys" in out


def test_up_passes_paths_and_insecure_to_its_router_never_a_key(files, monkeypatch, tmp_path):
    pki, keys = files
    monkeypatch.chdir(tmp_path)
    args = parse("--host", "0.0.0.0", "--api-key-file", "api-keys", "--tls-cert-file", "server.pem",
                 "--tls-key-file", "server.key", "--tls-client-ca-file", "ca.pem", "--insecure")
    assert public_api_argv(args) == ["--host", "0.0.0.0", "--tls-cert-file", str(pki.server_cert_file),
                                     "--tls-key-file", str(pki.server_key_file), "--tls-client-ca-file",
                                     str(pki.ca_file), "--api-key-file", str(keys), "--insecure"]
    assert public_api_argv(parse()) == ["--host", "127.0.0.1"]


def test_up_on_ray_gives_its_router_the_flags_but_not_the_host(files):
    pki, keys = files
    spec = ray_cluster_spec(parse("--ray", "10.0.0.1:6379", "--api-key-file", str(keys),
                                  "--tls-cert-file", str(pki.server_cert_file), "--tls-key-file", str(pki.server_key_file)))
    argv = spec.cluster.router_argv("redis://10.0.0.9:6379/0")
    assert argv[-6:] == ["--tls-cert-file", str(pki.server_cert_file), "--tls-key-file", str(pki.server_key_file),
                         "--api-key-file", str(keys)]
    assert "--host" not in argv   # the member actor adds --host NODE_IP


def test_up_on_ray_needs_tls_and_a_key_file_or_insecure(files, monkeypatch):
    pki, keys = files
    with pytest.raises(ValueError, match="would listen on its Ray node's address without TLS and API keys"):
        check_ray_exposure(parse("--ray", "auto"))
    monkeypatch.setenv("PDSERVE_API_KEY", KEY)   # stays in the driver: an actor does not inherit it
    with pytest.raises(ValueError, match="without API keys"):
        check_ray_exposure(parse("--ray", "auto", "--tls-cert-file", str(pki.server_cert_file),
                                 "--tls-key-file", str(pki.server_key_file)))
    check_ray_exposure(parse("--ray", "auto", "--insecure"))
    check_ray_exposure(parse("--ray", "auto", "--api-key-file", str(keys), "--tls-cert-file", str(pki.server_cert_file),
                             "--tls-key-file", str(pki.server_key_file)))


def test_how_to_connect_names_the_key_file_and_certificate_but_never_the_key(files):
    pki, keys = files
    args = parse("--host", "0.0.0.0", "--api-key-file", str(keys), "--tls-cert-file", str(pki.server_cert_file),
                 "--tls-key-file", str(pki.server_key_file))
    lines = how_to_connect(args, "0.0.0.0:50051", "https://0.0.0.0:8000")
    text = "\n".join(lines)
    assert KEY not in text
    assert lines[0] == ("  gRPC   0.0.0.0:50051   (pdserve.client.Client(target, api_key=KEY, "
                        "root_certificates=open(CERT, 'rb').read()))")
    assert lines[1] == "  HTTP   https://0.0.0.0:8000/v1/completions   (OpenAI-compatible)"
    assert f"  key    in {keys}" in text
    assert lines[-1] == (f"  try    curl --cacert {pki.server_cert_file} -H \"Authorization: Bearer "
                         f"$(grep -m1 -v '^ *#' {keys})\" https://0.0.0.0:8000/v1/completions "
                         "-H 'content-type: application/json' -d '{\"prompt\": \"Hello\", \"max_tokens\": 16}'")


def test_how_to_connect_to_an_open_loopback_router_is_the_two_endpoints():
    assert how_to_connect(parse(), "127.0.0.1:50051", "http://127.0.0.1:8000") == [
        "  gRPC   127.0.0.1:50051   (pdserve.client.Client(target))",
        "  HTTP   http://127.0.0.1:8000/v1/completions   (OpenAI-compatible)"]


def test_the_curl_line_reads_the_key_as_the_shell_runs_it(files, tmp_path):
    """The `$(grep ...)` of the printed curl line gives the key, comments skipped."""
    import subprocess

    _, keys = files
    line = how_to_connect(parse("--api-key-file", str(keys)), "t", "http://h")[-1]
    command = line.split('Bearer ', 1)[1].split('"', 1)[0]
    assert subprocess.run(["bash", "-c", f"echo {command}"], capture_output=True, text=True).stdout.strip() == KEY
